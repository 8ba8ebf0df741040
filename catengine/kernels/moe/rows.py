"""Row kernels of :func:`catengine.kernels.moe.fused.fused_moe`: a few (token, expert) rows without any sorting
(dense experts at decode sizes, and W4A16 experts where the table has no ``decode`` entry). Split from fused.py.

``moe_up_row_kernel`` runs one program per (row, column tile): it reads only that row's expert, computes gate
and up, and stores ``silu(gate) * up``. ``moe_down_row_kernel`` treats a token's top_k experts as one K
dimension of length top_k * I (K-block b belongs to expert slot b // (I / BK)), so a single GEMV-style pass
applies the routing weights and sums the experts in a fixed order: two launches, no atomics, only chosen
experts read. An id of -1 (expert parallelism: an expert another rank holds) gives a zero h row and no weight
reads.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..w4a16.gemv import fma_tile, gemv_tile_load

NIB = 15


# Both fetch the next weight tile by hand while computing the current one: Triton pipelines loads
# that do not feed tl.dot only in loops that ask for stages, which the down pass does when its
# table entry has num_stages > 1 (the measured table uses 1). A decode step is a handful of DRAM
# latencies long, so this is most of its time.
@triton.jit
def moe_up_row_kernel(x_ptr, w_ptr, s_ptr, z_ptr, id_ptr, h_ptr, H, I, stride_xm, nib,
                       TOPK: tl.constexpr, G: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       QUANT: tl.constexpr):
    i_n, i_row = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(id_ptr + i_row).to(tl.int64)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < I
    if i_e < 0:
        # an expert another rank holds (expert parallelism): a zero row, which the down pass reads
        # against masked-out (zero) weights
        tl.store(h_ptr + i_row * I + o_n, tl.zeros([BN], h_ptr.dtype.element_ty), mask=m_n)
        return
    p_x = x_ptr + (i_row // TOPK) * stride_xm
    if QUANT:
        o_r = tl.arange(0, BK // 8)
        # gate columns o_n and up columns I + o_n of this expert's [H // 8, 2I] weight
        p_w = w_ptr + i_e * (H // 8) * (2 * I)
        p_s = s_ptr + i_e * (H // G) * (2 * I)
        p_z = z_ptr + i_e * (H // G) * (2 * I)
        acc_g = tl.zeros([BN, BK // 8], tl.float32)
        acc_u = tl.zeros([BN, BK // 8], tl.float32)
        b_qg, b_sg, b_zg = gemv_tile_load(p_w, p_s, p_z, 0, H, o_r, o_n, m_n, 2 * I, G)
        b_qu, b_su, b_zu = gemv_tile_load(p_w + I, p_s + I, p_z + I, 0, H, o_r, o_n, m_n, 2 * I, G)
        for k0 in range(0, H, BK):
            n_qg, n_sg, n_zg = gemv_tile_load(p_w, p_s, p_z, k0 + BK, H, o_r, o_n, m_n, 2 * I, G)
            n_qu, n_su, n_zu = gemv_tile_load(p_w + I, p_s + I, p_z + I, k0 + BK, H, o_r, o_n, m_n, 2 * I, G)
            acc_g += fma_tile(b_qg, b_zg.to(tl.float32), p_x + k0 + o_r * 8, nib) * b_sg.to(tl.float32)
            acc_u += fma_tile(b_qu, b_zu.to(tl.float32), p_x + k0 + o_r * 8, nib) * b_su.to(tl.float32)
            b_qg, b_sg, b_zg, b_qu, b_su, b_zu = n_qg, n_sg, n_zg, n_qu, n_su, n_zu
    else:
        o_k = tl.arange(0, BK)
        p_w = w_ptr + i_e * (2 * I) * H
        acc_g = tl.zeros([BN, BK], tl.float32)
        acc_u = tl.zeros([BN, BK], tl.float32)
        for k0 in range(0, H, BK):
            m_k = (k0 + o_k) < H
            # [BK]
            b_x = tl.load(p_x + k0 + o_k, mask=m_k, other=0).to(tl.float32)
            m_w = m_n[:, None] & m_k[None, :]
            # [BN, BK] torch layout rows: gate features, then up features
            b_g = tl.load(p_w + o_n[:, None] * H + (k0 + o_k)[None, :], mask=m_w, other=0)
            b_u = tl.load(p_w + (I + o_n)[:, None] * H + (k0 + o_k)[None, :], mask=m_w, other=0)
            acc_g += b_g.to(tl.float32) * b_x[None, :]
            acc_u += b_u.to(tl.float32) * b_x[None, :]
    b_g = tl.sum(acc_g, axis=1)
    b_h = b_g * tl.sigmoid(b_g) * tl.sum(acc_u, axis=1)
    tl.store(h_ptr + i_row * I + o_n, b_h.to(h_ptr.dtype.element_ty), mask=m_n)


@triton.jit
def _down_tile_load(w_ptr, s_ptr, z_ptr, b_ids, o_j, kb, kb_end, n_ib, o_r, o_n, m_n, H, I,
                    G: tl.constexpr, BK: tl.constexpr):
    """Tile kb of a token's concatenated experts: expert slot kb // n_ib, rows (kb % n_ib) * BK..;
    zeros from kb_end on and for an expert another rank holds (id -1: nothing read)."""
    i_e = tl.sum(tl.where(o_j == kb // n_ib, b_ids, 0)).to(tl.int64)
    k_end = tl.where((kb < kb_end) & (i_e >= 0), I, 0)
    i_e = tl.maximum(i_e, 0)
    return gemv_tile_load(w_ptr + i_e * (I // 8) * H, s_ptr + i_e * (I // G) * H, z_ptr + i_e * (I // G) * H,
                          (kb % n_ib) * BK, k_end, o_r, o_n, m_n, H, G)


@triton.jit
def moe_down_row_kernel(h_ptr, w_ptr, s_ptr, z_ptr, id_ptr, tw_ptr, y_ptr, part_ptr, T, H, I, nib,
                         TOPK: tl.constexpr, KP: tl.constexpr, G: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, SPLIT_K: tl.constexpr, QUANT: tl.constexpr, STAGES: tl.constexpr):
    i_n, i_t, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < H
    o_j = tl.arange(0, KP)
    # [KP] this token's experts and routing weights
    b_ids = tl.load(id_ptr + i_t * TOPK + o_j, mask=o_j < TOPK, other=0)
    b_tws = tl.load(tw_ptr + i_t * TOPK + o_j, mask=o_j < TOPK, other=0)
    b_tws = tl.where(b_ids >= 0, b_tws, 0.0)
    n_ib = I // BK
    kb_per = tl.cdiv(TOPK * n_ib, SPLIT_K)
    kb_end = tl.minimum(kb_per * (i_s + 1), TOPK * n_ib)
    if QUANT:
        o_r = tl.arange(0, BK // 8)
        acc = tl.zeros([BN, BK // 8], tl.float32)
        if STAGES > 1:
            for kb in tl.range(kb_per * i_s, kb_end, num_stages=STAGES):
                j = kb // n_ib
                b_q, b_s, b_z = _down_tile_load(w_ptr, s_ptr, z_ptr, b_ids, o_j, kb, kb_end, n_ib, o_r, o_n, m_n,
                                                H, I, G, BK)
                b_tw = tl.sum(tl.where(o_j == j, b_tws, 0.0))
                p_x = h_ptr + (i_t * TOPK + j) * I + (kb % n_ib) * BK + o_r * 8
                acc += fma_tile(b_q, b_z.to(tl.float32), p_x, nib) * (b_s.to(tl.float32) * b_tw)
        else:
            b_q, b_s, b_z = _down_tile_load(w_ptr, s_ptr, z_ptr, b_ids, o_j, kb_per * i_s, kb_end, n_ib, o_r,
                                            o_n, m_n, H, I, G, BK)
            for kb in range(kb_per * i_s, kb_end):
                j = kb // n_ib
                n_q, n_s, n_z = _down_tile_load(w_ptr, s_ptr, z_ptr, b_ids, o_j, kb + 1, kb_end, n_ib, o_r, o_n,
                                                m_n, H, I, G, BK)
                b_tw = tl.sum(tl.where(o_j == j, b_tws, 0.0))
                p_x = h_ptr + (i_t * TOPK + j) * I + (kb % n_ib) * BK + o_r * 8
                acc += fma_tile(b_q, b_z.to(tl.float32), p_x, nib) * (b_s.to(tl.float32) * b_tw)
                b_q, b_s, b_z = n_q, n_s, n_z
    else:
        o_k = tl.arange(0, BK)
        acc = tl.zeros([BN, BK], tl.float32)
        for kb in range(kb_per * i_s, kb_end):
            j = kb // n_ib
            i0 = (kb % n_ib) * BK
            b_tw = tl.sum(tl.where(o_j == j, b_tws, 0.0))
            i_e = tl.sum(tl.where(o_j == j, b_ids, 0)).to(tl.int64)
            # [BK]
            b_x = tl.load(h_ptr + (i_t * TOPK + j) * I + i0 + o_k).to(tl.float32) * b_tw
            # [BN, BK]; nothing read for an expert another rank holds (id -1)
            b_w = tl.load(w_ptr + tl.maximum(i_e, 0) * H * I + o_n[:, None] * I + (i0 + o_k)[None, :],
                          mask=(m_n & (o_n * 0 + i_e >= 0))[:, None], other=0)
            acc += b_w.to(tl.float32) * b_x[None, :]
    b_y = tl.sum(acc, axis=1)
    if SPLIT_K == 1:
        tl.store(y_ptr + i_t * H + o_n, b_y.to(y_ptr.dtype.element_ty), mask=m_n)
    else:
        tl.store(part_ptr + (i_s * T + i_t) * H + o_n, b_y, mask=m_n)

