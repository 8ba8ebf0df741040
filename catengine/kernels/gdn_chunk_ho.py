"""Gated DeltaNet chunked prefill, stages 2 and 3 (stage 1, the WY kernel, and the host side are in
:mod:`catengine.kernels.gated_delta_rule`).

2. ``gdn_chunk_h_kernel`` (sequence x value head x dv block, sequential over chunks) carries only the
   state: per chunk it stores S (the state at the chunk's start, activation dtype) to a per-chunk
   buffer, then v_new = u - w S (stored too) and S = e^{g_last} S + (k e^{g_last - g})^T v_new.
   Two dependent products per chunk and nothing else on the serial path: everything that does not
   need the state (the output, q, q k^T) moved to stage 3.
3. ``gdn_chunk_o_kernel`` (chunk x value head x dv block, all parallel):
   o = e^g (q S_chunk) + tril(q k^T * e^{g_i - g_j}) v_new.
   ``gdn_chunk_o_loop_kernel`` is the same output with the dk dimension walked in BK-row tiles of q, k
   and S (both products accumulate over the tiles, then A v_new chains into the same accumulator),
   which holds fewer registers than whole 128-wide tiles; its grid can put the value heads and dv
   blocks of one chunk side by side, so the programs that read the same q and k run together.
Same structure as flash-linear-attention's chunk_delta_h / chunk_o; the matmul operands are in the
activation dtype with fp32 accumulation, the carried state is fp32.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _find_seq(cu, n, i):
    """The largest b in [0, n) with cu[b] <= i, for non-decreasing cu with cu[0] <= i."""
    lo = i * 0
    hi = lo + n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = tl.load(cu + mid) <= i
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return lo


@triton.jit
def gdn_chunk_h_kernel(k, w, u, g, kn, vn, hb, ssm, qsl, cu_chunks, state_slots, has_init, c_lo, c_hi, HV, R,
                       stride_k_t, stride_k_h, stride_g_t, stride_ssm_slot, K: tl.constexpr, V: tl.constexpr,
                       BK: tl.constexpr, BV: tl.constexpr):
    i_bh, i_v = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HV, i_bh % HV
    i_hk = i_h // R
    bos, eos = tl.load(qsl + i_b), tl.load(qsl + i_b + 1)
    c0 = tl.load(cu_chunks + i_b)
    # this launch's chunks [j0, j1) of the sequence: the global window [c_lo, c_hi) cut to it
    j0 = tl.maximum(c_lo - c0, 0)
    j1 = tl.minimum(c_hi, tl.load(cu_chunks + i_b + 1)) - c0
    if j1 <= j0:
        return
    slot = tl.load(state_slots + i_b).to(tl.int64)
    o_t = tl.arange(0, 64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    DT = w.dtype.element_ty
    # the slot holds a state to continue from after an earlier window, or when has_initial_state
    # (scalar conditions become row bounds: the interpreter cannot AND a scalar bool into a block)
    n_init = tl.where(j0 > 0, K, tl.where(tl.load(has_init + i_b) != 0, K, 0))
    p_s = ssm + slot * stride_ssm_slot + i_h * K * V + o_k[:, None] * V + o_v[None, :]
    # [BK, BV]
    b_h = tl.load(p_s, mask=(o_k < n_init)[:, None] & m_v[None, :], other=0.)
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
        # [BK, 64]
        b_k = tl.load(k + o_tt[None, :] * stride_k_t + i_hk * stride_k_h + o_k[:, None],
                      mask=m_k[:, None] & m_t[None, :], other=0.)
        # [64, BK]
        b_w = tl.load(w + o_r[:, None] * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.)
        # [64, BV]
        b_u = tl.load(u + o_r[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.)
        p_hb = hb + ((j + c0).to(tl.int64) * HV + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :]
        b_hd = b_h.to(DT)
        tl.store(p_hb, b_hd, mask=m_kv)
        b_v = b_u.to(tl.float32) - tl.dot(b_w, b_hd)
        tl.store(vn + o_r[:, None] * V + o_v[None, :], b_v.to(DT), mask=m_t[:, None] & m_v[None, :])
        b_h = b_h * tl.exp(b_gl) + tl.dot(b_k, (b_v * b_f[:, None]).to(DT))
    tl.store(p_s, b_h, mask=m_kv)


@triton.jit
def gdn_chunk_o_kernel(q, k, vn, hb, g, kn, o, qsl, cu_chunks, c_lo, B, HV, R, scale, stride_q_t, stride_q_h,
                       stride_k_t, stride_k_h, stride_g_t, stride_o_t, stride_o_h, K: tl.constexpr,
                       V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr):
    i_c, i_h, i_v = tl.program_id(0) + c_lo, tl.program_id(1), tl.program_id(2)
    i_hk = i_h // R
    i_b = _find_seq(cu_chunks, B, i_c)
    eos = tl.load(qsl + i_b + 1)
    t = tl.load(qsl + i_b) + (i_c - tl.load(cu_chunks + i_b)) * 64
    if t >= eos:
        return
    DT = hb.dtype.element_ty
    o_t = tl.arange(0, 64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_t = (t + o_t) < eos
    o_tt = (t + o_t).to(tl.int64)
    # [64, BK], [BK, 64]
    b_q = tl.load(q + o_tt[:, None] * stride_q_t + i_hk * stride_q_h + o_k[None, :],
                  mask=m_t[:, None] & m_k[None, :], other=0.)
    b_k = tl.load(k + o_tt[None, :] * stride_k_t + i_hk * stride_k_h + o_k[:, None],
                  mask=m_k[:, None] & m_t[None, :], other=0.)
    # [BK, BV], [64, BV]
    b_h = tl.load(hb + (i_c.to(tl.int64) * HV + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :],
                  mask=m_k[:, None] & m_v[None, :], other=0.)
    b_v = tl.load(vn + (o_tt * HV + i_h)[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.)
    # [64]
    b_g = tl.cumsum(tl.load(g + o_tt * stride_g_t + i_h, mask=m_t, other=0.), 0)
    # the norms scale rows and columns of the fp32 products, not the operands (k's from the WY kernel)
    b_sq = b_g * 0 + scale
    if USE_L2NORM:
        b_sq = b_sq * tl.rsqrt(tl.sum(b_q.to(tl.float32) * b_q.to(tl.float32), 1) + 1e-6)
    b_sk = tl.load(kn + o_tt * HV + i_h, mask=m_t, other=0.)
    # [64, 64]: causal q k^T * decay; above the diagonal the exponent is > 0: clamped, then masked
    b_a = tl.dot(b_q, b_k) * b_sk[None, :]
    b_a = tl.where(o_t[:, None] >= o_t[None, :], b_a * tl.exp(tl.minimum(b_g[:, None] - b_g[None, :], 0.)), 0.)
    b_o = tl.dot(b_q, b_h) * tl.exp(b_g)[:, None] + tl.dot(b_a.to(DT), b_v)
    b_o = b_o * b_sq[:, None]
    tl.store(o + o_tt[:, None] * stride_o_t + i_h * stride_o_h + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


@triton.jit
def gdn_chunk_o_loop_kernel(q, k, vn, hb, g, kn, o, qsl, cu_chunks, c_lo, B, HV, R, scale, stride_q_t, stride_q_h,
                            stride_k_t, stride_k_h, stride_g_t, stride_o_t, stride_o_h, K: tl.constexpr,
                            V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                            HEADS_FIRST: tl.constexpr):
    # HEADS_FIRST: grid (Hv * NV, chunks), the Hv * NV programs of one chunk adjacent (R value heads
    # per key head read the same q, k); else (chunks, Hv * NV) as the single-block kernel
    if HEADS_FIRST:
        i_c, i_hv = tl.program_id(1) + c_lo, tl.program_id(0)
    else:
        i_c, i_hv = tl.program_id(0) + c_lo, tl.program_id(1)
    i_h, i_v = i_hv // ((V + BV - 1) // BV), i_hv % ((V + BV - 1) // BV)
    i_hk = i_h // R
    i_b = _find_seq(cu_chunks, B, i_c)
    eos = tl.load(qsl + i_b + 1)
    t = tl.load(qsl + i_b) + (i_c - tl.load(cu_chunks + i_b)) * 64
    if t >= eos:
        return
    DT = hb.dtype.element_ty
    o_t = tl.arange(0, 64)
    m_t = (t + o_t) < eos
    o_tt = (t + o_t).to(tl.int64)
    # 64-bit scalar bases, 32-bit offsets inside the chunk
    p_q = q + t.to(tl.int64) * stride_q_t + i_hk * stride_q_h
    p_k = k + t.to(tl.int64) * stride_k_t + i_hk * stride_k_h
    p_h = hb + (i_c.to(tl.int64) * HV + i_h) * (K * V) + i_v * BV
    o_v = tl.arange(0, BV)
    m_v = (i_v * BV + o_v) < V
    # [64]
    b_g = tl.cumsum(tl.load(g + o_tt * stride_g_t + i_h, mask=m_t, other=0.), 0)
    b_sk = tl.load(kn + o_tt * HV + i_h, mask=m_t, other=0.)
    b_o = tl.zeros([64, BV], dtype=tl.float32)
    b_a = tl.zeros([64, 64], dtype=tl.float32)
    b_qq = tl.zeros([64], dtype=tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        # [64, BK], [BK, 64], [BK, BV]
        b_q = tl.load(p_q + o_t[:, None] * stride_q_t + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.)
        b_k = tl.load(p_k + o_t[None, :] * stride_k_t + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.)
        b_h = tl.load(p_h + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.)
        b_o = tl.dot(b_q, b_h, acc=b_o)
        b_a = tl.dot(b_q, b_k, acc=b_a)
        if USE_L2NORM:
            b_qq += tl.sum(b_q.to(tl.float32) * b_q.to(tl.float32), 1)
    # [64, BV]
    b_v = tl.load(vn + (t.to(tl.int64) * HV + i_h) * V + i_v * BV + o_t[:, None] * (HV * V) + o_v[None, :],
                  mask=m_t[:, None] & m_v[None, :], other=0.)
    # the norms scale rows and columns of the fp32 products (the query's row scale applies to both
    # terms, so it comes last); causal q k^T * decay, the exponent clamped above the diagonal
    b_a = tl.where(o_t[:, None] >= o_t[None, :],
                   b_a * b_sk[None, :] * tl.exp(tl.minimum(b_g[:, None] - b_g[None, :], 0.)), 0.)
    b_o = tl.dot(b_a.to(DT), b_v, acc=b_o * tl.exp(b_g)[:, None])
    b_sq = b_g * 0 + scale
    if USE_L2NORM:
        b_sq = b_sq * tl.rsqrt(b_qq + 1e-6)
    b_o = b_o * b_sq[:, None]
    p_o = o + t.to(tl.int64) * stride_o_t + i_h * stride_o_h + i_v * BV
    tl.store(p_o + o_t[:, None] * stride_o_t + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])
