"""Sorted (prefill) kernels of :func:`catengine.kernels.moe.fused.fused_moe` on ``tl.dot``: rows grouped by
expert and padded to BM (:func:`catengine.kernels.moe.route.align_tokens`), ``moe_gemm_kernel`` for gate_up
(+ SiLU) and for down (+ routing weight), ``combine_kernel`` for each token's top_k rows in order. The kernels
of every row except fp16 W4A16 on sm_70, which fused_sm70.py runs on HMMA.884, and that kernel's CI twin.
Split from fused.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..w4a16.gemm import dequant_tile, mma

NIB2 = 0x000F000F


@triton.jit
def moe_gemm_kernel(a_ptr, w_ptr, s_ptr, z_ptr, sorted_ptr, bexp_ptr, npost_ptr, tw_ptr, out_ptr,
                     TK, N, K, stride_am, nib2, A_DIV: tl.constexpr, G: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, QUANT: tl.constexpr,
                     UP: tl.constexpr, INTERPRET: tl.constexpr):
    """UP: out[row] = silu(a W_gate) * (a W_up), a = x[row // A_DIV], W = [E, ., 2N].
    else: out[row] = topk_weight[row] * (a W), a = h[row], W = [E, ., N]."""
    DT: tl.constexpr = a_ptr.dtype.element_ty
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    if i_b * BM >= tl.load(npost_ptr):
        return
    i_e = tl.load(bexp_ptr + i_b).to(tl.int64)
    o_p = i_b * BM + tl.arange(0, BM)
    # [BM] flat (token, slot) ids; padding holds TK
    b_row = tl.load(sorted_ptr + o_p)
    m_p = b_row < TK
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    o_k = tl.arange(0, BK)
    if UP:
        NW = 2 * N
    else:
        NW = N
    acc = tl.zeros([BN, BM], tl.float32)
    acc_u = tl.zeros([BN, BM], tl.float32)
    if QUANT:
        o_r = tl.arange(0, BK // 8)
        p_w = w_ptr + i_e * (K // 8) * NW
        p_s = s_ptr + i_e * (K // G) * NW
        p_z = z_ptr + i_e * (K // G) * NW
        for k0 in range(0, K, BK):
            # [BK, BM]
            b_a = tl.load(a_ptr + (b_row // A_DIV)[None, :] * stride_am + (k0 + o_k)[:, None], mask=m_p[None, :],
                          other=0)
            o_q = (k0 // 8 + o_r)[None, :] * NW + o_n[:, None]
            o_sz = (k0 // G) * NW + o_n[:, None] + 0 * o_r[None, :]
            # [BN, BK // 8]
            b_q = tl.load(p_w + o_q, mask=m_n[:, None], other=0)
            b_s = tl.load(p_s + o_sz, mask=m_n[:, None], other=0)
            b_z = tl.load(p_z + o_sz, mask=m_n[:, None], other=0).to(tl.float32)
            acc = mma(dequant_tile(b_q, b_s, b_z, nib2, DT, INTERPRET), b_a, acc, INTERPRET)
            if UP:
                b_q = tl.load(p_w + o_q + N, mask=m_n[:, None], other=0)
                b_s = tl.load(p_s + o_sz + N, mask=m_n[:, None], other=0)
                b_z = tl.load(p_z + o_sz + N, mask=m_n[:, None], other=0).to(tl.float32)
                acc_u = mma(dequant_tile(b_q, b_s, b_z, nib2, DT, INTERPRET), b_a, acc_u, INTERPRET)
    else:
        p_w = w_ptr + i_e * NW * K
        for k0 in range(0, K, BK):
            m_k = (k0 + o_k) < K
            # [BK, BM]
            b_a = tl.load(a_ptr + (b_row // A_DIV)[None, :] * stride_am + (k0 + o_k)[:, None],
                          mask=m_p[None, :] & m_k[:, None], other=0)
            # [BN, BK] torch layout [out, in]
            b_w = tl.load(p_w + o_n[:, None] * K + (k0 + o_k)[None, :], mask=m_n[:, None] & m_k[None, :], other=0)
            acc = mma(b_w.to(DT), b_a, acc, INTERPRET)
            if UP:
                b_w = tl.load(p_w + (N + o_n)[:, None] * K + (k0 + o_k)[None, :], mask=m_n[:, None] & m_k[None, :],
                              other=0)
                acc_u = mma(b_w.to(DT), b_a, acc_u, INTERPRET)
    if UP:
        acc = acc * tl.sigmoid(acc) * acc_u
    else:
        acc = acc * tl.load(tw_ptr + b_row, mask=m_p, other=0)[None, :]
    tl.store(out_ptr + b_row[None, :] * N + o_n[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=m_n[:, None] & m_p[None, :])


@triton.jit
def combine_kernel(y_ptr, id_ptr, out_ptr, H, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    i_t, i_b = tl.program_id(0), tl.program_id(1)
    o_n = i_b * BLOCK + tl.arange(0, BLOCK)
    m_n = o_n < H
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOPK):
        # a row of id -1 (an expert another rank holds) was never computed: align_tokens left it out
        m_j = (o_n * 0 + tl.load(id_ptr + i_t * TOPK + j)) >= 0
        # [BLOCK]
        acc += tl.load(y_ptr + (i_t * TOPK + j) * H + o_n, mask=m_n & m_j, other=0).to(tl.float32)
    tl.store(out_ptr + i_t * H + o_n, acc.to(out_ptr.dtype.element_ty), mask=m_n)

