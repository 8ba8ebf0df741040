"""Gated DeltaNet chunked prefill, the kernels that walk a sequence's chunks in order (sequence x value
head x dv block); the host side is in :mod:`catengine.kernels.gdn.chunk`, the table in :mod:`.table`.

- ``gdn_chunk_h_kernel`` (the split prefill, stage 2) carries only the state: per chunk it stores S
  (the state at the chunk's start, activation dtype) to a per-chunk buffer, then v_new = u - w S
  (stored too) and S = e^{g_last} S + (k e^{g_last - g})^T v_new. Two dependent products per chunk
  and nothing else on the serial path: the output moved to :mod:`.chunk_o`. Same structure as
  flash-linear-attention's chunk_gated_delta_rule_fwd_h.
- ``gdn_chunk_scan_kernel`` (the scan prefill) does all of it per chunk with X from
  ``gdn_chunk_inv_kernel``: v_new = X (beta v - (beta k e^g) S), o = (q e^g) S + tril(q k^T *
  decay) v_new and the state update; w, u, the per-chunk states and v_new never touch memory.
Both take a window [c_lo, c_hi) of the global chunks and continue from the slot's state after an
earlier window, so the host can cut long inputs into windows that overlap other kernels.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _window(qsl, cu_chunks, state_slots, has_init, c_lo, c_hi, HV, R, K: tl.constexpr):
    """This program's (dv block, value head, key head, first token, end, first and end chunk of this
    launch in its sequence, global index of its first chunk, state slot, rows of the slot to start
    from: K or 0); the grid is (sequence x value head, dv block)."""
    i_bh, i_v = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HV, i_bh % HV
    bos, eos = tl.load(qsl + i_b), tl.load(qsl + i_b + 1)
    c0 = tl.load(cu_chunks + i_b)
    # the global window [c_lo, c_hi) cut to the sequence's chunks
    j0 = tl.maximum(c_lo - c0, 0)
    j1 = tl.minimum(c_hi, tl.load(cu_chunks + i_b + 1)) - c0
    slot = tl.load(state_slots + i_b).to(tl.int64)
    # the slot holds a state to continue from after an earlier window, or when has_initial_state
    # (scalar conditions become row bounds: the interpreter cannot AND a scalar bool into a block)
    n_init = tl.where(j0 > 0, K, tl.where(tl.load(has_init + i_b) != 0, K, 0))
    return i_v, i_h, i_h // R, bos, eos, j0, j1, c0, slot, n_init


@triton.jit
def gdn_chunk_h_kernel(k, w, u, g, kn, vn, hb, ssm, qsl, cu_chunks, state_slots, has_init, c_lo, c_hi, HV, R,
                       stride_k_t, stride_k_h, stride_g_t, stride_ssm_slot, K: tl.constexpr, V: tl.constexpr,
                       BK: tl.constexpr, BV: tl.constexpr):
    # the host gives BK >= 64 even for dk = 32 (rows >= K are masked to zero and stay zero in the
    # state), so that the update k^T v_new builds as a wgmma like w S, not as an M = 32 mma.sync
    # beside it (table.SPLIT_MIN_BLOCK says what the H200 showed). BK = 128 is held as two
    # 64-row blocks, each product split in two, as flash-linear-attention's kernel does (H200, this
    # kernel alone at 1 x 8K / 1 x 64K: 0.268 / 2.04 ms as one 128-row block, 0.253 / 1.97 as two;
    # fla's 0.207 at 1 x 8K).
    tl.static_assert(BK == 64 or BK == 128, "the split's serial kernel takes dk <= 128")
    TWO: tl.constexpr = BK == 128
    i_v, i_h, i_hk, bos, eos, j0, j1, c0, slot, n_init = _window(qsl, cu_chunks, state_slots, has_init, c_lo, c_hi,
                                                                HV, R, K)
    if j1 <= j0:
        return
    o_t = tl.arange(0, 64)
    o_k = tl.arange(0, 64)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    DT = w.dtype.element_ty
    # rows 0-63 of the state (and 64-127): [64, BV] each, with their masks
    m_s1 = (o_k < K)[:, None] & m_v[None, :]
    m_s2 = (64 + o_k < K)[:, None] & m_v[None, :]
    p_s = ssm + slot * stride_ssm_slot + i_h * K * V + o_k[:, None] * V + o_v[None, :]
    b_h1 = tl.load(p_s, mask=(o_k < n_init)[:, None] & m_v[None, :], other=0.).to(tl.float32)
    if TWO:
        b_h2 = tl.load(p_s + 64 * V, mask=(64 + o_k < n_init)[:, None] & m_v[None, :], other=0.).to(tl.float32)
    for j in range(j0, j1):
        t = bos + j * 64
        o_tt = (t + o_t).to(tl.int64)
        m_t = (t + o_t) < eos
        o_r = o_tt * HV + i_h
        # inputs first: none of them depends on the state, so their loads overlap the last chunk's
        # math. k and w go to the products as stored (no registers); the key norms and the decay
        # to the chunk's end scale the rows of v_new instead. [64]; rows past the end load g = 0
        b_g = tl.load(g + o_tt * stride_g_t + i_h, mask=m_t, other=0.)
        b_gl = tl.sum(b_g, 0)
        b_f = tl.load(kn + o_r, mask=m_t, other=0.) * tl.exp(b_gl - tl.cumsum(b_g, 0))
        # [64 rows of k, 64 tokens], [64 tokens, 64 columns of w], [64, BV]
        p_k = k + o_tt[None, :] * stride_k_t + i_hk * stride_k_h + o_k[:, None]
        p_w = w + o_r[:, None] * K + o_k[None, :]
        b_k1 = tl.load(p_k, mask=(o_k < K)[:, None] & m_t[None, :], other=0.)
        b_w1 = tl.load(p_w, mask=m_t[:, None] & (o_k < K)[None, :], other=0.)
        if TWO:
            b_k2 = tl.load(p_k + 64, mask=(64 + o_k < K)[:, None] & m_t[None, :], other=0.)
            b_w2 = tl.load(p_w + 64, mask=m_t[:, None] & (64 + o_k < K)[None, :], other=0.)
        b_u = tl.load(u + o_r[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.)
        p_hb = hb + ((j + c0).to(tl.int64) * HV + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :]
        b_hd1 = b_h1.to(DT)
        tl.store(p_hb, b_hd1, mask=m_s1)
        b_v = b_u.to(tl.float32) - tl.dot(b_w1, b_hd1)
        if TWO:
            b_hd2 = b_h2.to(DT)
            tl.store(p_hb + 64 * V, b_hd2, mask=m_s2)
            b_v -= tl.dot(b_w2, b_hd2)
        tl.store(vn + o_r[:, None] * V + o_v[None, :], b_v.to(DT), mask=m_t[:, None] & m_v[None, :])
        b_vf = (b_v * b_f[:, None]).to(DT)
        b_e = tl.exp(b_gl)
        b_h1 = b_h1 * b_e + tl.dot(b_k1, b_vf)
        if TWO:
            b_h2 = b_h2 * b_e + tl.dot(b_k2, b_vf)
    tl.store(p_s, b_h1.to(ssm.dtype.element_ty), mask=m_s1)
    if TWO:
        tl.store(p_s + 64 * V, b_h2.to(ssm.dtype.element_ty), mask=m_s2)


@triton.jit
def gdn_chunk_scan_kernel(q, k, v, x, g, beta, o, ssm, qsl, cu_chunks, state_slots, has_init, c_lo, c_hi, HV, R,
                          scale, stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_g_t,
                          stride_beta_t, stride_o_t, stride_o_h, stride_ssm_slot, K: tl.constexpr, V: tl.constexpr,
                          BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr):
    i_v, i_h, i_hk, bos, eos, j0, j1, c0, slot, n_init = _window(qsl, cu_chunks, state_slots, has_init, c_lo, c_hi,
                                                                HV, R, K)
    if j1 <= j0:
        return
    o_t = tl.arange(0, 64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    DT = x.dtype.element_ty
    p_s = ssm + slot * stride_ssm_slot + i_h * K * V + o_k[:, None] * V + o_v[None, :]
    # [BK, BV]
    b_h = tl.load(p_s, mask=(o_k < n_init)[:, None] & m_v[None, :], other=0.).to(tl.float32)
    for t in range(bos + j0 * 64, bos + j1 * 64, 64):
        o_tt = (t + o_t).to(tl.int64)
        m_t = (t + o_t) < eos
        # [64]
        b_g = tl.load(g + o_tt * stride_g_t + i_h, mask=m_t, other=0.)
        b_b = tl.load(beta + o_tt * stride_beta_t + i_h, mask=m_t, other=0.)
        b_gl = tl.sum(b_g, 0)
        b_g = tl.cumsum(b_g, 0)
        # everything that does not depend on the state first, so that the fp32 copies of q and k
        # die before the state's products (register pressure)
        # [64, BK], [BK, 64]
        b_q = tl.load(q + o_tt[:, None] * stride_q_t + i_hk * stride_q_h + o_k[None, :],
                      mask=m_t[:, None] & m_k[None, :], other=0.).to(tl.float32)
        b_k = tl.load(k + o_tt[None, :] * stride_k_t + i_hk * stride_k_h + o_k[:, None],
                      mask=m_k[:, None] & m_t[None, :], other=0.).to(tl.float32)
        if USE_L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None]
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 0) + 1e-6)[None, :]
        b_q = b_q * scale
        # [64, 64]: causal q k^T * decay
        b_a = tl.dot(b_q.to(DT), b_k.to(DT))
        b_a = tl.where(o_t[:, None] >= o_t[None, :], b_a * tl.exp(tl.minimum(b_g[:, None] - b_g[None, :], 0.)), 0.)
        b_a = b_a.to(DT)
        b_qg = (b_q * tl.exp(b_g)[:, None]).to(DT)
        # (beta k e^g) as [64, BK] and k e^(g_last - g) as [BK, 64]
        b_kb = tl.trans((b_k * (b_b * tl.exp(b_g))[None, :]).to(DT))
        b_kd = (b_k * tl.exp(b_gl - b_g)[None, :]).to(DT)
        # [64, BV]
        b_v = tl.load(v + o_tt[:, None] * stride_v_t + i_h * stride_v_h + o_v[None, :],
                      mask=m_t[:, None] & m_v[None, :], other=0.).to(tl.float32) * b_b[:, None]
        # [64, 64]
        b_x = tl.load(x + (o_tt * HV + i_h)[:, None] * 64 + o_t[None, :], mask=m_t[:, None], other=0.)
        # v_new = u - w S = X (beta v - (beta k e^g) S): w and u never touch memory
        b_hd = b_h.to(DT)
        b_v = tl.dot(b_x, (b_v - tl.dot(b_kb, b_hd)).to(DT)).to(DT)
        b_o = tl.dot(b_qg, b_hd) + tl.dot(b_a, b_v)
        tl.store(o + o_tt[:, None] * stride_o_t + i_h * stride_o_h + o_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=m_t[:, None] & m_v[None, :])
        b_h = b_h * tl.exp(b_gl) + tl.dot(b_kd, b_v)
    tl.store(p_s, b_h.to(ssm.dtype.element_ty), mask=m_k[:, None] & m_v[None, :])
