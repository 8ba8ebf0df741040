"""The W4A16 GEMV kernel (decode rows), launched by :func:`catengine.kernels.w4a16.gemm.fused_w4a16_linear`,
and the fp32 weight math (``fma_tile``, ``gemv_tile_load``) that the row kernels of
:mod:`catengine.kernels.moe.rows` share.

The dense GEMV reads a tile of R packed rows x BN columns as [BN, R // SR, SR]: blocks of SR rows
that lie in one quantisation group and that one thread holds (``launch.gemv_thread_rows``), so that
each thread's rows share one scale and zero point, loaded and prepared once per (column, block), and
its accumulator is one fp32 per (column, block), summed over the rows in registers (the canonical
layout is kept, packing.py). Two weight maths:

- ``F16X2`` (fp16 activations on CUDA): packed half2 arithmetic in inline PTX, 2 weights per
  instruction. For t = 0, 1, ``(w >> 8t) & 0x000F000F | 0x54005400`` read as two fp16 is
  ``64 + q/16`` for nibbles 2t and 2t+4 (0x5400 is 64 with a unit in the last place of 1/16), and
  with mask 0x00F000F0 ``64 + q`` for nibbles 2t+1 and 2t+5; one sub (or fma by 1/16) with the packed ``64 + z/16``
  (``4 + z/16``) gives ``(q - z) / 16`` exactly. Its products with x are accumulated as half2
  over one int32's 8 weights only, then widened and summed in fp32 and scaled by 16 * s. The 1/16
  keeps those 4-term half sums below fp16's range for any |x| < 16000 (with plain ``q - z`` an
  activation of 1100 could overflow), and the sums are never of magic-offset values, so nothing
  cancels. 17 instructions per int32 of weight math, about 24 per int32 for the whole loop of a
  64 x 512 tile (sm_90 SASS) against 38 for the fp32 math.
  Zero points must be the integers 0..15 that packing.py promises (they are read through an
  int conversion).
- plain Triton in fp32 (the interpreter, which cannot run PTX, and bf16): one LOP3 and one FADD
  per weight as in ``fma_tile``, the zero point subtracted once per int32 as ``z * sum(x)``.
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


# ---------------------------------------------------------------- kernels (fused_moe's row kernels)
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


# ---------------------------------------------------------------- half2 weight math (inline PTX)
@triton.jit
def x_pairs(b_xl, b_xh):
    """int64 x[8r..8r+3] and x[8r+4..8r+7] -> four half2 (x_j, x_j+4), j = 0..3, as int32."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a0, a1, b0, b1;
        mov.b64 {a0, a1}, $4;
        mov.b64 {b0, b1}, $5;
        prmt.b32 $0, a0, b0, 0x5410;
        prmt.b32 $1, a0, b0, 0x7632;
        prmt.b32 $2, a1, b1, 0x5410;
        prmt.b32 $3, a1, b1, 0x7632;
        }""",
        constraints="=r,=r,=r,=r,l,l", args=[b_xl, b_xh],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def half2_codes(b_q, b_za, b_zb):
    """Packed int32 -> four half2 of (q - z) / 16 for nibbles (j, j+4), j = 0..3 (exact).

    b_za holds half2 (64 + z/16), b_zb half2 -(4 + z/16), both as int32."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 w8, t1, t3, c;
        mov.b32 c, 0x2C002C00;
        lop3.b32 $0, $4, 0x000F000F, 0x54005400, 0xea;
        lop3.b32 t1, $4, 0x00F000F0, 0x54005400, 0xea;
        shr.u32 w8, $4, 8;
        lop3.b32 $2, w8, 0x000F000F, 0x54005400, 0xea;
        lop3.b32 t3, w8, 0x00F000F0, 0x54005400, 0xea;
        sub.f16x2 $0, $0, $5;
        sub.f16x2 $2, $2, $5;
        fma.rn.f16x2 $1, t1, c, $6;
        fma.rn.f16x2 $3, t3, c, $6;
        }""",
        constraints="=r,=r,=r,=r,r,r,r", args=[b_q, b_za, b_zb],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def half2_consts(p_z, p_s, m):
    """Load one block's zero and scale (fp16) and return half2 (64 + z/16), half2 -(4 + z/16) (as
    int32: bits 0x5400 + z and 0xC400 + 16z in both halves) and 16 * s in fp32; 0s where m is 0.

    A PTX load rather than tl.load: Triton gives each tl.load of >= 32 * num_warps elements a layout
    of its own, and this small [BN, R // SR, 1] one would then reach b_q's layout through shared
    memory and barriers every tile; an elementwise op is recomputed in its users' layout instead."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .pred p;
        .reg .b16 zh, sh;
        .reg .b32 zi;
        .reg .f32 sf;
        setp.ne.b32 p, $5, 0;
        mov.b16 zh, 0;
        mov.b16 sh, 0;
        @p ld.global.b16 zh, [$3];
        @p ld.global.b16 sh, [$4];
        cvt.rzi.s32.f16 zi, zh;
        mad.lo.s32 $0, zi, 0x10001, 0x54005400;
        mad.lo.s32 $1, zi, 0x100010, 0xC400C400;
        cvt.f32.f16 sf, sh;
        mul.f32 $2, sf, 0f41800000;
        }""",
        constraints="=r,=r,=f,l,l,r", args=[p_z, p_s, m.to(tl.int32)],
        dtype=(tl.int32, tl.int32, tl.float32), is_pure=True, pack=1)


@triton.jit
def f32_consts(p_z, p_s, m):
    """Load one block's zero and scale (fp16 or bf16) as fp32, 0 where m is 0 (a PTX load for the
    reason given at half2_consts)."""
    if p_s.dtype.element_ty == tl.bfloat16:
        # a bf16 is the top half of the equal fp32
        cvt: tl.constexpr = "mov.b32 $0, {c0, zh};\n mov.b32 $1, {c0, sh};"
    else:
        cvt: tl.constexpr = "cvt.f32.f16 $0, zh;\n cvt.f32.f16 $1, sh;"
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .pred p;
        .reg .b16 zh, sh, c0;
        setp.ne.b32 p, $4, 0;
        mov.b16 zh, 0;
        mov.b16 sh, 0;
        mov.b16 c0, 0;
        @p ld.global.b16 zh, [$2];
        @p ld.global.b16 sh, [$3];
        """ + cvt + "}",
        constraints="=f,=f,l,l,r", args=[p_z, p_s, m.to(tl.int32)],
        dtype=(tl.float32, tl.float32), is_pure=True, pack=1)


@triton.jit
def half2_dot(d0, d1, d2, d3, x0, x1, x2, x3):
    """sum over the 8 weights of one int32: half2 products summed in half2 (4 terms), then fp32."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a;
        .reg .b16 l, h;
        .reg .f32 fl, fh;
        mul.rn.f16x2 a, $1, $5;
        fma.rn.f16x2 a, $2, $6, a;
        fma.rn.f16x2 a, $3, $7, a;
        fma.rn.f16x2 a, $4, $8, a;
        mov.b32 {l, h}, a;
        cvt.f32.f16 fl, l;
        cvt.f32.f16 fh, h;
        add.f32 $0, fl, fh;
        }""",
        constraints="=f,r,r,r,r,r,r,r,r", args=[d0, d1, d2, d3, x0, x1, x2, x3],
        dtype=tl.float32, is_pure=True, pack=1)


# ---------------------------------------------------------------- dense GEMV
@triton.jit
def gemv_block_tile(qw_ptr, s_ptr, z_ptr, k0, o_n, m_n, N, G: tl.constexpr, R: tl.constexpr, SR: tl.constexpr,
                    F16X2: tl.constexpr, ASM: tl.constexpr):
    """Packed rows k0/8 .. k0/8 + R of columns o_n as [BN, R // SR, SR] (row k0/8 + i * SR + r at
    [:, i, r]), and per SR-row block (which lies in one group) [BN, R // SR, 1]: F16X2, the
    three outputs of half2_consts; else zero, zero, scale (ASM: loaded by PTX, as fp32). Triton's
    layout for the load (4 columns per thread, then threads along the middle axis, the last in
    registers) gives each thread SR rows of one block when SR is gemv_thread_rows. m_n: [BN] column mask."""
    o_s = tl.arange(0, R // SR)
    o_r = tl.arange(0, SR)
    # [BN, R // SR, SR]; .cg: the weights are read once, so they skip L1 and leave it to x
    p_q = qw_ptr + (k0 // 8 + o_s[None, :, None] * SR + o_r[None, None, :]) * N + o_n[:, None, None]
    b_q = tl.load(p_q, mask=m_n[:, None, None], other=0, cache_modifier=".cg")
    o_g = ((k0 // 8 + o_s * SR) // (G // 8))[None, :, None] * N + o_n[:, None, None]
    # [BN, R // SR, 1]
    if F16X2 and ASM:
        b_a, b_b, b_c = half2_consts(z_ptr + o_g, s_ptr + o_g, m_n[:, None, None])
    elif ASM:
        b_a, b_c = f32_consts(z_ptr + o_g, s_ptr + o_g, m_n[:, None, None])
        b_b = b_a
    else:
        b_c = tl.load(s_ptr + o_g, mask=m_n[:, None, None], other=0)
        b_a = tl.load(z_ptr + o_g, mask=m_n[:, None, None], other=0)
        b_b = b_a
        if F16X2:
            b_zi = b_a.to(tl.int32)
            # what half2_consts returns
            b_a = b_zi * 0x10001 + 0x54005400
            b_b = b_zi * 0x100010 - 0x3BFF3C00
            b_c = b_c.to(tl.float32) * 16.0
    return b_q, b_a, b_b, b_c


@triton.jit
def _half2_row(d0, d1, d2, d3, x_ptr, stride_xm, i_m, M, k0, R: tl.constexpr, SR: tl.constexpr):
    """sum_j (q - z) / 16 * x_j over each block's SR int32, for activation row i_m: [BN, R // SR, 1]."""
    o_k = k0 + 8 * (tl.arange(0, R // SR)[:, None] * SR + tl.arange(0, SR)[None, :])
    m_x = (o_k * 0 + i_m) < M
    p_x = x_ptr + i_m * stride_xm
    p_x = p_x.to(tl.pointer_type(tl.int64), bitcast=True) + o_k // 4
    # [R // SR, SR] each: x[8r .. 8r+3] and x[8r+4 .. 8r+7]
    x0, x1, x2, x3 = x_pairs(tl.load(p_x, mask=m_x, other=0), tl.load(p_x + 1, mask=m_x, other=0))
    # summed over the block's rows, which one thread holds: [BN, R // SR, 1]
    return tl.sum(half2_dot(d0, d1, d2, d3, x0[None, :, :], x1[None, :, :], x2[None, :, :], x3[None, :, :]),
                  axis=2, keep_dims=True)


@triton.jit
def _fp32_row(acc, b_q, b_s, b_z, x_ptr, stride_xm, i_m, M, k0, nib, R: tl.constexpr, SR: tl.constexpr):
    """acc [BN, R // SR, 1] += sum_j (q - z) * s * x_j (row i_m) with fma_tile's fp32 mantissa trick."""
    b_h = b_q >> 16
    o_k = k0 + 8 * (tl.arange(0, R // SR)[:, None] * SR + tl.arange(0, SR)[None, :])
    m_x = (o_k * 0 + i_m) < M
    p_x = x_ptr + i_m * stride_xm + o_k
    # [R // SR, SR] each, x[8r + j]
    x0 = tl.load(p_x, mask=m_x, other=0).to(tl.float32)
    x1 = tl.load(p_x + 1, mask=m_x, other=0).to(tl.float32)
    x2 = tl.load(p_x + 2, mask=m_x, other=0).to(tl.float32)
    x3 = tl.load(p_x + 3, mask=m_x, other=0).to(tl.float32)
    x4 = tl.load(p_x + 4, mask=m_x, other=0).to(tl.float32)
    x5 = tl.load(p_x + 5, mask=m_x, other=0).to(tl.float32)
    x6 = tl.load(p_x + 6, mask=m_x, other=0).to(tl.float32)
    x7 = tl.load(p_x + 7, mask=m_x, other=0).to(tl.float32)
    part = (((b_q & nib) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * x0[None, :, :]
    part += (((b_q & (nib << 4)) | 0x49000000).to(tl.float32, bitcast=True) - 524288.0) * x1[None, :, :]
    part += (((b_q & (nib << 8)) | 0x47000000).to(tl.float32, bitcast=True) - 32768.0) * x2[None, :, :]
    part += (((b_q & (nib << 12)) | 0x45000000).to(tl.float32, bitcast=True) - 2048.0) * x3[None, :, :]
    part += (((b_q & (nib << 16)) | 0x43000000).to(tl.float32, bitcast=True) - 128.0) * x4[None, :, :]
    part += (((b_h & (nib << 4)) | 0x49000000).to(tl.float32, bitcast=True) - 524288.0) * x5[None, :, :]
    part += (((b_h & (nib << 8)) | 0x47000000).to(tl.float32, bitcast=True) - 32768.0) * x6[None, :, :]
    part += (((b_h & (nib << 12)) | 0x45000000).to(tl.float32, bitcast=True) - 2048.0) * x7[None, :, :]
    b_xs = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
    return acc + tl.sum(part - b_z.to(tl.float32) * b_xs[None, :, :], axis=2, keep_dims=True) * b_s.to(tl.float32)


@triton.jit
def gemv_rows(acc0, acc1, acc2, acc3, b_q, b_a, b_b, b_c, x_ptr, stride_xm, i_m, M, k0, nib,
              R: tl.constexpr, SR: tl.constexpr, MR: tl.constexpr, F16X2: tl.constexpr):
    """One weight tile (b_q and the block constants of gemv_block_tile) against rows i_m .. i_m + MR - 1
    (MR in 1, 2, 4; rows past M read x = 0)."""
    if F16X2:
        d0, d1, d2, d3 = half2_codes(b_q, b_a, b_b)
        acc0 += _half2_row(d0, d1, d2, d3, x_ptr, stride_xm, i_m, M, k0, R, SR) * b_c
        if MR > 1:
            acc1 += _half2_row(d0, d1, d2, d3, x_ptr, stride_xm, i_m + 1, M, k0, R, SR) * b_c
        if MR > 2:
            acc2 += _half2_row(d0, d1, d2, d3, x_ptr, stride_xm, i_m + 2, M, k0, R, SR) * b_c
            acc3 += _half2_row(d0, d1, d2, d3, x_ptr, stride_xm, i_m + 3, M, k0, R, SR) * b_c
    else:
        acc0 = _fp32_row(acc0, b_q, b_c, b_a, x_ptr, stride_xm, i_m, M, k0, nib, R, SR)
        if MR > 1:
            acc1 = _fp32_row(acc1, b_q, b_c, b_a, x_ptr, stride_xm, i_m + 1, M, k0, nib, R, SR)
        if MR > 2:
            acc2 = _fp32_row(acc2, b_q, b_c, b_a, x_ptr, stride_xm, i_m + 2, M, k0, nib, R, SR)
            acc3 = _fp32_row(acc3, b_q, b_c, b_a, x_ptr, stride_xm, i_m + 3, M, k0, nib, R, SR)
    return acc0, acc1, acc2, acc3


@triton.jit
def _gemv_store(acc, bias_ptr, y_ptr, part_ptr, i_s, i_m, o_n, m_n, M, N, stride_ym,
                SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr):
    b_y = tl.sum(tl.sum(acc, axis=2), axis=1)
    if not SPLIT:
        if HAS_BIAS:
            b_y += tl.load(bias_ptr + o_n, mask=m_n, other=0).to(tl.float32)
        tl.store(y_ptr + i_m * stride_ym + o_n, b_y.to(y_ptr.dtype.element_ty), mask=m_n & (i_m + 0 * o_n < M))
    else:
        tl.store(part_ptr + (i_s * M + i_m) * N + o_n, b_y, mask=m_n & (i_m + 0 * o_n < M))


@triton.jit
def last_split_reduces(bias_ptr, y_ptr, part_ptr, p_count, i_m, o_n, m_n, M, N, n_split, stride_ym,
                       MR: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Split-K without a second launch: each program has stored its partials; the one that arrives
    last at this (column tile, row tile) counter sums all of them in split order (so the result does
    not depend on who came last), writes y and re-arms the counter for the next call."""
    # every thread's partial stores before the release (the atomic is issued by one thread)
    tl.debug_barrier()
    arrived = tl.atomic_add(p_count, 1, sem="acq_rel", scope="gpu")
    if arrived == n_split - 1:
        for r in tl.static_range(MR):
            m_row = m_n & (i_m + r + 0 * o_n < M)
            b_y = tl.zeros_like(o_n).to(tl.float32)
            for i_s in range(0, n_split):
                # .cg: from L2, where the other programs' partials are; never a stale L1 line
                b_y += tl.load(part_ptr + (i_s * M + i_m + r) * N + o_n, mask=m_row, other=0., cache_modifier=".cg")
            if HAS_BIAS:
                b_y += tl.load(bias_ptr + o_n, mask=m_n, other=0).to(tl.float32)
            tl.store(y_ptr + (i_m + r) * stride_ym + o_n, b_y.to(y_ptr.dtype.element_ty), mask=m_row)
        tl.atomic_xchg(p_count, 0, sem="relaxed", scope="gpu")


@triton.jit
def w4a16_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, part_ptr, M, N, K, stride_xm,
                      stride_ym, nib, n_split, count_ptr, G: tl.constexpr, BN: tl.constexpr, R: tl.constexpr,
                      SR: tl.constexpr, MR: tl.constexpr, SPLIT: tl.constexpr,
                      HAS_BIAS: tl.constexpr, PREFETCH: tl.constexpr, F16X2: tl.constexpr,
                      ASM: tl.constexpr, STAGES: tl.constexpr, FUSED_REDUCE: tl.constexpr, PDL: tl.constexpr):
    """MR activation rows per program (each weight tile is dequantised once for all of them), BN
    columns, K range i_s of n_split (SPLIT: n_split > 1, fp32 partials to part_ptr), tiles of 8R
    input features; R divides K / 8 (launcher). The split count is a run-time value so that the
    shapes of one model share a handful of compiled variants. ASM: inline PTX allowed (not in the
    interpreter); F16X2 (needs ASM and fp16): the half2 weight math.
    F16X2 needs x 8-byte aligned per row (launcher: stride_xm % 4 == 0). FUSED_REDUCE (with SPLIT):
    the last split of each tile sums the partials (count_ptr: one zeroed int32 per program of grid
    axes 0 and 2) instead of a separate reduce launch.
    PDL (sm_90, launched with launch_pdl): a programmatic dependent launch, so the programs start while
    the kernel before runs out; they fetch their first weight tile (weights, scales and zeros are never
    written by a kernel) and wait (griddepcontrol.wait: that kernel complete, its stores visible)
    before reading x or writing anything. Every program at once lets the kernel after start too."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    i_n, i_s, i_m = tl.program_id(0), tl.program_id(1), tl.program_id(2) * MR
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    n_kb = K // (8 * R)
    kb_per = tl.cdiv(n_kb, n_split)
    kb_beg = kb_per * i_s
    kb_end = tl.minimum(kb_beg + kb_per, n_kb)
    acc0 = tl.zeros([BN, R // SR, 1], tl.float32)
    acc1 = tl.zeros([BN, R // SR, 1], tl.float32)
    acc2 = tl.zeros([BN, R // SR, 1], tl.float32)
    acc3 = tl.zeros([BN, R // SR, 1], tl.float32)
    if PREFETCH:
        # the next tile's loads go out before this tile's math (masked off past the range)
        b_q, b_a, b_b, b_c = gemv_block_tile(qw_ptr, s_ptr, z_ptr, kb_beg * 8 * R, o_n, m_n, N, G, R, SR, F16X2, ASM)
        if PDL:
            tl.extra.cuda.gdc_wait()
        for kb in range(kb_beg, kb_end):
            n_q, n_a, n_b, n_c = gemv_block_tile(qw_ptr, s_ptr, z_ptr, (kb + 1) * 8 * R, o_n,
                                                 m_n & (kb + 1 + 0 * o_n < kb_end),
                                                 N, G, R, SR, F16X2, ASM)
            acc0, acc1, acc2, acc3 = gemv_rows(acc0, acc1, acc2, acc3, b_q, b_a, b_b, b_c, x_ptr, stride_xm,
                                               i_m, M, kb * 8 * R, nib, R, SR, MR, F16X2)
            b_q, b_a, b_b, b_c = n_q, n_a, n_b, n_c
    elif STAGES > 1:
        # Triton software-pipelines the loads (cp.async into a shared-memory ring of STAGES tiles), so
        # bytes stay in flight without holding registers; the block constants then come by tl.load too
        if PDL:
            tl.extra.cuda.gdc_wait()
        for kb in tl.range(kb_beg, kb_end, num_stages=STAGES):
            b_q, b_a, b_b, b_c = gemv_block_tile(qw_ptr, s_ptr, z_ptr, kb * 8 * R, o_n, m_n, N, G, R, SR, F16X2, False)
            acc0, acc1, acc2, acc3 = gemv_rows(acc0, acc1, acc2, acc3, b_q, b_a, b_b, b_c, x_ptr, stride_xm,
                                               i_m, M, kb * 8 * R, nib, R, SR, MR, F16X2)
    else:
        kb_first = kb_beg
        if PDL:
            # the first tile is fetched before the wait (no split is empty, launcher's pick_split)
            b_q, b_a, b_b, b_c = gemv_block_tile(qw_ptr, s_ptr, z_ptr, kb_beg * 8 * R, o_n, m_n, N, G, R, SR, F16X2, ASM)
            tl.extra.cuda.gdc_wait()
            acc0, acc1, acc2, acc3 = gemv_rows(acc0, acc1, acc2, acc3, b_q, b_a, b_b, b_c, x_ptr, stride_xm,
                                               i_m, M, kb_beg * 8 * R, nib, R, SR, MR, F16X2)
            kb_first += 1
        for kb in range(kb_first, kb_end):
            b_q, b_a, b_b, b_c = gemv_block_tile(qw_ptr, s_ptr, z_ptr, kb * 8 * R, o_n, m_n, N, G, R, SR, F16X2, ASM)
            acc0, acc1, acc2, acc3 = gemv_rows(acc0, acc1, acc2, acc3, b_q, b_a, b_b, b_c, x_ptr, stride_xm,
                                               i_m, M, kb * 8 * R, nib, R, SR, MR, F16X2)
    _gemv_store(acc0, bias_ptr, y_ptr, part_ptr, i_s, i_m, o_n, m_n, M, N, stride_ym, SPLIT, HAS_BIAS)
    if MR > 1:
        _gemv_store(acc1, bias_ptr, y_ptr, part_ptr, i_s, i_m + 1, o_n, m_n, M, N, stride_ym, SPLIT, HAS_BIAS)
    if MR > 2:
        _gemv_store(acc2, bias_ptr, y_ptr, part_ptr, i_s, i_m + 2, o_n, m_n, M, N, stride_ym, SPLIT, HAS_BIAS)
        _gemv_store(acc3, bias_ptr, y_ptr, part_ptr, i_s, i_m + 3, o_n, m_n, M, N, stride_ym, SPLIT, HAS_BIAS)
    if SPLIT and FUSED_REDUCE:
        p_count = count_ptr + i_n * tl.num_programs(2) + tl.program_id(2)
        last_split_reduces(bias_ptr, y_ptr, part_ptr, p_count, i_m, o_n, m_n, M, N, n_split, stride_ym, MR, HAS_BIAS)
