"""The W4A16 GEMV kernel (decode rows) and its FMA weight math, launched by
:func:`catengine.kernels.w4a16.w4a16_linear` (see that module for the design) and shared with
:mod:`catengine.kernels.fused_moe`'s row kernels; split from ``w4a16.py``.
"""
from __future__ import annotations

import triton
import triton.language as tl


# ---------------------------------------------------------------- dequantisation helpers
@triton.jit
def fma_tile(b_q, b_z, p_x, nib):
    """sum_j (q[8r+j] - z) * x[8r+j] for a K-packed tile b_q [BN, R] -> [BN, R] fp32.

    b_z: [BN, R] fp32 zero points (each int32's group); p_x: [R] pointers to x[8r]. A float with
    exponent 23-P whose mantissa bits P..P+3 hold the nibble is exactly 2^(23-P) + q, so one LOP3
    and one FADD give q.
    Mantissa bits stop at 22: nibbles 0-4 are used in place, nibbles 5-7 after one shift by 16.
    The zero point comes off once per int32 as z * sum(x). nib is 15 passed at run time: as a
    literal, ptxas rematerialises each shifted mask with a MOV before every LOP3 instead of keeping
    the five masks in registers (one more instruction per weight). Written out rather than looped
    through a helper: the interpreter pays milliseconds per nested jit call."""
    b_h = b_q >> 16
    # [R] each
    x0 = tl.load(p_x).to(tl.float32)
    x1 = tl.load(p_x + 1).to(tl.float32)
    x2 = tl.load(p_x + 2).to(tl.float32)
    x3 = tl.load(p_x + 3).to(tl.float32)
    x4 = tl.load(p_x + 4).to(tl.float32)
    x5 = tl.load(p_x + 5).to(tl.float32)
    x6 = tl.load(p_x + 6).to(tl.float32)
    x7 = tl.load(p_x + 7).to(tl.float32)
    acc = (((b_q & nib) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * x0[None, :]
    acc += (((b_q & (nib << 4)) | 0x49000000).to(tl.float32, bitcast=True) - 524288.0) * x1[None, :]
    acc += (((b_q & (nib << 8)) | 0x47000000).to(tl.float32, bitcast=True) - 32768.0) * x2[None, :]
    acc += (((b_q & (nib << 12)) | 0x45000000).to(tl.float32, bitcast=True) - 2048.0) * x3[None, :]
    acc += (((b_q & (nib << 16)) | 0x43000000).to(tl.float32, bitcast=True) - 128.0) * x4[None, :]
    acc += (((b_h & (nib << 4)) | 0x49000000).to(tl.float32, bitcast=True) - 524288.0) * x5[None, :]
    acc += (((b_h & (nib << 8)) | 0x47000000).to(tl.float32, bitcast=True) - 32768.0) * x6[None, :]
    acc += (((b_h & (nib << 12)) | 0x45000000).to(tl.float32, bitcast=True) - 2048.0) * x7[None, :]
    b_xs = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
    return acc - b_z * b_xs[None, :]


# ---------------------------------------------------------------- kernels
@triton.jit
def gemv_tile_load(qw_ptr, s_ptr, z_ptr, k0, k_end, o_r, o_n, m_n, N, G: tl.constexpr):
    """K-packed rows k0/8 + o_r of columns o_n, with each int32's scale and zero: 3 x [BN, R].

    A tile may span several groups, so the scales come in the weight's shape (repeats hit L1); the
    weights bypass L1 (.cg) so that they do not evict x and the scales. Rows at or past k_end
    read as zeros."""
    m = m_n[:, None] & ((k0 + 8 * o_r) < k_end)[None, :]
    # [BN, R]
    b_q = tl.load(qw_ptr + (k0 // 8 + o_r)[None, :] * N + o_n[:, None], mask=m, other=0, cache_modifier=".cg")
    o_g = ((k0 + 8 * o_r) // G)[None, :] * N + o_n[:, None]
    # [BN, R]
    b_s = tl.load(s_ptr + o_g, mask=m, other=0)
    b_z = tl.load(z_ptr + o_g, mask=m, other=0)
    return b_q, b_s, b_z


@triton.jit
def _w4a16_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, part_ptr, M, N, K, stride_xm,
                       stride_ym, nib, G: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, STAGES: tl.constexpr):
    i_n, i_s, i_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    o_r = tl.arange(0, BK // 8)
    n_kb = K // BK
    kb_per = tl.cdiv(n_kb, SPLIT_K)
    kb_end = tl.minimum(kb_per * (i_s + 1), n_kb)
    acc = tl.zeros([BN, BK // 8], tl.float32)
    p_x = x_ptr + i_m * stride_xm + o_r * 8
    if STAGES > 1:
        # loads that do not feed tl.dot get a cp.async ring only in a loop that asks for stages
        for kb in tl.range(kb_per * i_s, kb_end, num_stages=STAGES):
            b_q, b_s, b_z = gemv_tile_load(qw_ptr, s_ptr, z_ptr, kb * BK, kb_end * BK, o_r, o_n, m_n, N, G)
            acc += fma_tile(b_q, b_z.to(tl.float32), p_x + kb * BK, nib) * b_s.to(tl.float32)
    else:
        # the next tile is fetched by hand while this one is computed (ptxas issues those loads late
        # in the body, so they overlap only part of it)
        b_q, b_s, b_z = gemv_tile_load(qw_ptr, s_ptr, z_ptr, kb_per * i_s * BK, kb_end * BK, o_r, o_n, m_n, N, G)
        for kb in range(kb_per * i_s, kb_end):
            n_q, n_s, n_z = gemv_tile_load(qw_ptr, s_ptr, z_ptr, (kb + 1) * BK, kb_end * BK, o_r, o_n, m_n, N, G)
            acc += fma_tile(b_q, b_z.to(tl.float32), p_x + kb * BK, nib) * b_s.to(tl.float32)
            b_q, b_s, b_z = n_q, n_s, n_z
    b_y = tl.sum(acc, axis=1)
    if SPLIT_K == 1:
        if HAS_BIAS:
            b_y += tl.load(bias_ptr + o_n, mask=m_n, other=0).to(tl.float32)
        tl.store(y_ptr + i_m * stride_ym + o_n, b_y.to(y_ptr.dtype.element_ty), mask=m_n)
    else:
        tl.store(part_ptr + (i_s * M + i_m) * N + o_n, b_y, mask=m_n)
