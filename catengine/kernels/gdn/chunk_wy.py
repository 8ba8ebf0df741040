"""Gated DeltaNet chunked prefill, stage 1: the WY / UT transform of each chunk (the host side is in
:mod:`catengine.kernels.gdn.chunk`, the table in :mod:`.table`, the later stages in :mod:`.chunk_h` and
:mod:`.chunk_o`).

Per (chunk, value head): l2norm(k), the cumulative log decay g, A = beta K K^T * e^{g_i - g_j}
(strictly lower) and X = (I + A)^-1 by forward substitution on the four 16x16 diagonal blocks and
two block-merge levels. Two kernels take it from there:
- ``gdn_chunk_wy_kernel`` (the split prefill): w = X (beta k e^g / |k|) and u = X (beta v) in the
  activation dtype, plus the key norms 1 / |k|, so that the later kernels take k as it is stored.
- ``gdn_chunk_inv_kernel`` (the scan prefill): X itself, which the scan multiplies by the state.
Program -> (sequence, chunk) is a binary search over the chunk offsets (no host round trip).
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
def chunk_of(qsl, cu_chunks, B, i_c):
    """(first token, end of its sequence) of global chunk i_c; first >= end for the unused tail."""
    i_b = _find_seq(cu_chunks, B, i_c)
    eos = tl.load(qsl + i_b + 1)
    return tl.load(qsl + i_b) + (i_c - tl.load(cu_chunks + i_b)) * 64, eos


@triton.jit
def _cols(a, M: tl.constexpr, K: tl.constexpr):
    """a [M, K] as its two column halves [M, K // 2] (register moves; no memory)."""
    return tl.split(tl.permute(tl.reshape(a, (M, 2, K // 2)), (0, 2, 1)))


@triton.jit
def _rows(b, K: tl.constexpr, N: tl.constexpr):
    """b [K, N] as its two row halves [K // 2, N]."""
    return tl.split(tl.permute(tl.reshape(b, (2, K // 2, N)), (1, 2, 0)))


@triton.jit
def _dot_k(a, b, acc, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, KS: tl.constexpr, DOT: tl.constexpr):
    """acc + a [M, K] @ b [K, N] as products of KS-deep slices (K in 16..128, KS = 0: one product). On sm_70 tl.dot
    is FMA, and Triton's FMA lowering holds a thread's rows of a and columns of b over the whole K in registers
    (8 rows + 4 columns of 128 at the WY tiles on 4 warps: 1,536 values), so the whole-K kernel ran on 32 registers
    and a 16 KB stack; a slice of 16 holds 192 (table.py has the builds)."""
    if KS == 0 or K <= KS:
        acc = tl.dot(a, b, acc, input_precision=DOT)
    else:
        a0, a1 = _cols(a, M, K)
        b0, b1 = _rows(b, K, N)
        if K // 2 <= KS:
            acc = tl.dot(a0, b0, acc, input_precision=DOT)
            acc = tl.dot(a1, b1, acc, input_precision=DOT)
        else:
            a00, a01 = _cols(a0, M, K // 2)
            b00, b01 = _rows(b0, K // 2, N)
            a10, a11 = _cols(a1, M, K // 2)
            b10, b11 = _rows(b1, K // 2, N)
            acc = _dot_k4(a00, b00, acc, M, K // 4, N, KS, DOT)
            acc = _dot_k4(a01, b01, acc, M, K // 4, N, KS, DOT)
            acc = _dot_k4(a10, b10, acc, M, K // 4, N, KS, DOT)
            acc = _dot_k4(a11, b11, acc, M, K // 4, N, KS, DOT)
    return acc


@triton.jit
def _dot_k4(a, b, acc, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, KS: tl.constexpr, DOT: tl.constexpr):
    """_dot_k's leaves (K a quarter of the whole, at most 32): one product, or two of K // 2."""
    if K <= KS:
        acc = tl.dot(a, b, acc, input_precision=DOT)
    else:
        a0, a1 = _cols(a, M, K)
        b0, b1 = _rows(b, K, N)
        acc = tl.dot(a0, b0, acc, input_precision=DOT)
        acc = tl.dot(a1, b1, acc, input_precision=DOT)
    return acc


@triton.jit
def _wy_inverse(k, g, beta, t, eos, i_h, i_hk, stride_k_t, stride_k_h, stride_g_t, stride_beta_t, DT: tl.constexpr,
                K: tl.constexpr, BK: tl.constexpr, USE_L2NORM: tl.constexpr, DOT: tl.constexpr, KS: tl.constexpr):
    """X = (I + A)^-1, [64, 64] fp32, of the chunk starting at token t, with the key norms, the
    cumulative decay and beta of its rows ([64] fp32 each; rows past eos: flat decay, beta 0)."""
    o_t = tl.arange(0, 64)
    o_i = tl.arange(0, 16)
    o_s = tl.arange(0, 4)
    o_k = tl.arange(0, BK)
    m_t = (t + o_t) < eos
    o_tt = (t + o_t).to(tl.int64)
    # [64]; rows past the end load g = 0, so the cumulative decay stays flat there
    b_g = tl.cumsum(tl.load(g + o_tt * stride_g_t + i_h, mask=m_t, other=0.), 0)
    b_b = tl.load(beta + o_tt * stride_beta_t + i_h, mask=m_t, other=0.)
    # [64, BK], kept in the input dtype (an fp32 copy costs 64 more registers)
    b_k = tl.load(k + o_tt[:, None] * stride_k_t + i_hk * stride_k_h + o_k[None, :],
                  mask=m_t[:, None] & (o_k < K)[None, :], other=0.)
    if USE_L2NORM:
        b_n = tl.rsqrt(tl.sum(b_k.to(tl.float32) * b_k.to(tl.float32), 1) + 1e-6)
    else:
        b_n = b_b * 0. + 1.
    b_k = (b_k.to(tl.float32) * b_n[:, None]).to(DT)
    # A = beta K K^T * decay, strictly lower; above the diagonal the exponent is > 0: clamp it, the
    # mask drops those entries anyway. [64, 64]
    b_a = _dot_k(b_k, tl.trans(b_k), tl.zeros((64, 64), tl.float32), 64, BK, 64, KS, DOT)
    b_a = tl.where(o_t[:, None] > o_t[None, :], b_a * tl.exp(tl.minimum(b_g[:, None] - b_g[None, :], 0.)), 0.)
    b_a = b_a * b_b[:, None]
    # the four 16x16 diagonal blocks of -A: [4, 16, 16]
    m_dd = (o_s[:, None, None, None] == o_s[None, None, :, None])  # [4, 1, 4, 1]: same 16-block
    b_d = -tl.sum(tl.where(m_dd, tl.reshape(b_a, (4, 16, 4, 16)), 0.), 2)
    # forward substitution, all four blocks at once: step i turns row i into row i of X_ii - I,
    # reading only rows < i (already done); rows 0 and 1 are done from the start, rows past the
    # end of the sequence are zero
    for i in range(2, tl.minimum(eos - t, 16)):
        m_i = (o_i == i)[None, :, None]
        b_r = tl.sum(tl.where(m_i, b_d, 0.), 1)
        b_r = b_r + tl.where((o_i < i)[None, :], tl.sum(b_r[:, :, None] * b_d, 1), 0.)
        b_d = tl.where(m_i, b_r[:, None, :], b_d)
    b_d = b_d + (o_i[:, None] == o_i[None, :])[None, :, :].to(tl.float32)
    # block merge: with X_s the inverse of the s-blocks' diagonal, X_2s = X_s - X_s A_off X_s, A_off
    # the part of A inside a 2s-block but outside its s-blocks
    b_x = tl.reshape(tl.where(m_dd, b_d[:, :, None, :], 0.), (64, 64))
    m_32 = (o_t // 32)[:, None] == (o_t // 32)[None, :]
    b_off = tl.where(m_32 & ((o_t // 16)[:, None] != (o_t // 16)[None, :]), b_a, 0.)
    z = tl.zeros((64, 64), tl.float32)
    b_x = b_x - _dot_k(_dot_k(b_x, b_off, z, 64, 64, 64, KS, DOT), b_x, z, 64, 64, 64, KS, DOT)
    b_off = tl.where(m_32, 0., b_a)
    b_x = b_x - _dot_k(_dot_k(b_x, b_off, z, 64, 64, 64, KS, DOT), b_x, z, 64, 64, 64, KS, DOT)
    return b_x, b_n, b_g, b_b


@triton.jit
def gdn_chunk_wy_kernel(k, v, g, beta, w, u, kn, qsl, cu_chunks, c_lo, B, HV, R, stride_k_t, stride_k_h, stride_v_t,
                        stride_v_h, stride_g_t, stride_beta_t, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, USE_L2NORM: tl.constexpr, DOT: tl.constexpr, KS: tl.constexpr = 0):
    """w [T, Hv, dk], u [T, Hv, dv] (activation dtype) and the key norms kn [T, Hv] (fp32). The host
    gives BK, BV >= 64 (table.SPLIT_MIN_BLOCK): 32-wide blocks gave wrong w, u on the H200."""
    i_c, i_h = tl.program_id(0) + c_lo, tl.program_id(1)
    i_hk = i_h // R
    t, eos = chunk_of(qsl, cu_chunks, B, i_c)
    if t >= eos:
        return
    DT = w.dtype.element_ty
    # w and u in column blocks of CB: with sliced products (sm_70) 64, so that a block's operand columns and its
    # accumulator stay in registers (table.py)
    CB: tl.constexpr = 64 if KS > 0 else BK
    CV: tl.constexpr = 64 if KS > 0 else BV
    o_t = tl.arange(0, 64)
    o_k = tl.arange(0, CB)
    o_v = tl.arange(0, CV)
    m_t = (t + o_t) < eos
    o_tt = (t + o_t).to(tl.int64)
    b_x, b_n, b_g, b_b = _wy_inverse(k, g, beta, t, eos, i_h, i_hk, stride_k_t, stride_k_h, stride_g_t,
                                     stride_beta_t, DT, K, BK, USE_L2NORM, DOT, KS)
    # k is loaded again (an L2 hit) rather than kept live through the substitution. The norms go to
    # memory so that the later kernels take k as it is stored as a matmul operand and scale the
    # products instead.
    b_x = b_x.to(DT)
    o_r = o_tt * HV + i_h
    tl.store(kn + o_r, b_n, mask=m_t)
    f_k = b_n * b_b * tl.exp(b_g)
    for c0 in tl.static_range(0, BK, CB):
        # [64, CB]
        m_tk = m_t[:, None] & (c0 + o_k < K)[None, :]
        b_k = tl.load(k + o_tt[:, None] * stride_k_t + i_hk * stride_k_h + c0 + o_k[None, :], mask=m_tk, other=0.)
        b_w = _dot_k(b_x, (b_k.to(tl.float32) * f_k[:, None]).to(DT), tl.zeros((64, CB), tl.float32), 64, 64, CB,
                     KS, DOT)
        tl.store(w + o_r[:, None] * K + c0 + o_k[None, :], b_w.to(DT), mask=m_tk)
    for c0 in tl.static_range(0, BV, CV):
        # [64, CV]
        m_tv = m_t[:, None] & (c0 + o_v < V)[None, :]
        b_v = tl.load(v + o_tt[:, None] * stride_v_t + i_h * stride_v_h + c0 + o_v[None, :], mask=m_tv, other=0.)
        b_u = _dot_k(b_x, (b_v.to(tl.float32) * b_b[:, None]).to(DT), tl.zeros((64, CV), tl.float32), 64, 64, CV,
                     KS, DOT)
        tl.store(u + o_r[:, None] * V + c0 + o_v[None, :], b_u.to(DT), mask=m_tv)


@triton.jit
def gdn_chunk_inv_kernel(k, g, beta, x, qsl, cu_chunks, c_lo, B, HV, R, stride_k_t, stride_k_h, stride_g_t,
                         stride_beta_t, K: tl.constexpr, BK: tl.constexpr, USE_L2NORM: tl.constexpr,
                         DOT: tl.constexpr, KS: tl.constexpr = 0):
    """X = (I + A)^-1 of each chunk to x[t, h, 0:64] (row t of its chunk's X), for the scan."""
    i_c, i_h = tl.program_id(0) + c_lo, tl.program_id(1)
    t, eos = chunk_of(qsl, cu_chunks, B, i_c)
    if t >= eos:
        return
    o_t = tl.arange(0, 64)
    m_t = (t + o_t) < eos
    o_r = (t + o_t).to(tl.int64) * HV + i_h
    b_x, b_n, b_g, b_b = _wy_inverse(k, g, beta, t, eos, i_h, i_h // R, stride_k_t, stride_k_h, stride_g_t,
                                     stride_beta_t, x.dtype.element_ty, K, BK, USE_L2NORM, DOT, KS)
    tl.store(x + o_r[:, None] * 64 + o_t[None, :], b_x.to(x.dtype.element_ty), mask=m_t[:, None])
