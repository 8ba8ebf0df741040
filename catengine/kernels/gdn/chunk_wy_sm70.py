"""Gated DeltaNet chunked prefill (the split form), stage 1 on sm_70: the Gluon / HMMA.884 twin of
:func:`catengine.kernels.gdn.chunk_wy.gdn_chunk_wy_kernel` (same inputs, same outputs: w, u and the key norms)
with every product on ``mma.sync.m8n8k4`` (common/mma884.py), because ``tl.dot`` is FMA on sm_70 from Triton 3.3
on. Per program (chunk, value head), 4 warps as 2 x 2 on 64 x 64 tiles:

- A = beta K K^T * e^{g_i - g_j} / (|k_i| |k_j|), strictly lower: one loop over dk in steps of 32, k staged once in
  the A order, which serves as the B operand k^T too; the norms, beta and the decay are applied in fp32 on the
  accumulator map.
- X = (I + A)^-1 by block merges from 2 x 2 blocks up: with X_s the inverse of (I + A)'s s-block diagonal,
  X_2s = X_s - (X_s A_off) X_s, A_off the part of A inside the 2s-blocks but outside the s-blocks (exact: A_off
  X_s A_off = 0). X_2 = I - A_off(1) needs no product; five levels of two products each follow. X stays fp32 on
  the accumulator map, its operands are rounded to fp16 (the tl.dot kernel's sm_90 row merges in tf32, the same
  10-bit mantissa, and rounds X to the activation dtype for w, u anyway; bench/NOTES.md has the emulated error).
- w = X (beta k e^g / |k|), u = X (beta v) in 64-column blocks.
The accumulator map is not the operand map: a tile goes to shared memory in the A or the B staging order through a
register permutation (``to_a_stage`` / ``to_b_stage``). The per-row vectors (cumulative decay, 1 / |k|, beta)
are computed in 1-D layouts and read back per accumulator through a global scratch of 192 floats per program, as
in chunk_o_sm70.

The host side chooses it on a table row with ``wy_hmma`` (the sm_70 row) for fp16 (:mod:`.chunk`).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..common.aot import AotConfig
from ..common.arch import cuda_device
from ..common.mma884 import (Tile884, a_layout, a_smem_shape, acc_rows_cols, b_layout, b_smem_shape, cta_barrier,
                             cumsum, frag_layout, mma884, smem_layout, stage_index, stage_layout_a, stage_layout_b)
from .chunk_o_sm70 import chunk_of, to_a_stage, check_o_sm70

# 64 tokens x 64 (tokens or a 64-column block of dk / dv) on 4 warps as 2 x 2, k steps of 32 over dk
SM70_WY_TILE = Tile884(64, 64, 32, 2, 2)
# to_b_stage's permutation of the split accumulator dims (tested on torch tensors on CPU; the kernel spells it as a
# literal: Triton 3.6's gl.permute takes no constexpr tuple, a test checks the two agree)
B_STAGE_PERM = (0, 1, 5, 3, 7, 2, 6, 4)


@gluon.jit
def to_b_stage(x, MB: gl.constexpr, NB: gl.constexpr):
    """A [64, 64] tile from the accumulator map [mb, nb, h, l, i] (row 8 mb + (l & 1) + (i & 2) + 4 h, column
    8 nb + (i & 4) + (l & 2) + (i & 1)) into the B staging order [(mb, nb), h', l', k'] (row 8 mb + k', column
    8 nb + 4 h' + l'), the next product's k being this tile's row: k' = l0 + 2 i1 + 4 h, h' = i2, l' = i0 + 2 l1."""
    # dims after the split: mb, nb, h, l1, l0, i2, i1, i0
    x = gl.reshape(x, [MB, NB, 2, 2, 2, 2, 2, 2])
    # -> mb, nb, i2, (l1, i0), (h, i1, l0)
    x = gl.permute(x, [0, 1, 5, 3, 7, 2, 6, 4])
    return gl.reshape(x, [MB * NB, 2, 4, 8])


@gluon.jit
def _vectors(k, g, beta, kn, vec, t, eos, i_h, i_hk, HV, stride_k_t, stride_k_h, stride_g_t, stride_beta_t,
             K: gl.constexpr, BK: gl.constexpr, USE_L2NORM: gl.constexpr, NW: gl.constexpr):
    """vec[0:64] = cumulative log decay of the chunk's rows (flat past eos), vec[64:128] = 1 / |k| (1 without the
    norm; also to kn), vec[128:192] = beta (0 past eos)."""
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    o_t = gl.arange(0, 64, layout=L1)
    m_t = (t + o_t) < eos
    o_tt = (t + o_t).to(gl.int64)
    gl.store(vec + o_t, cumsum(gl.load(g + o_tt * stride_g_t + i_h, mask=m_t, other=0.0), 0))
    gl.store(vec + 128 + o_t, gl.load(beta + o_tt * stride_beta_t + i_h, mask=m_t, other=0.0))
    L2: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    o_r = gl.arange(0, 64, layout=gl.SliceLayout(1, L2))
    o_k = gl.arange(0, BK, layout=gl.SliceLayout(0, L2))
    m_r = (t + o_r) < eos
    if USE_L2NORM:
        p_k = k + gl.expand_dims((t + o_r).to(gl.int64) * stride_k_t + i_hk * stride_k_h, 1) + gl.expand_dims(o_k, 0)
        b_k = gl.load(p_k, mask=gl.expand_dims(m_r, 1) & gl.expand_dims(o_k < K, 0), other=0.0).to(gl.float32)
        b_n = gl.rsqrt(gl.sum(b_k * b_k, 1) + 1e-6)
    else:
        b_n = gl.zeros([64], gl.float32, layout=gl.SliceLayout(1, L2)) + 1.0
    gl.store(vec + 64 + o_r, b_n)
    gl.store(kn + (t + o_r).to(gl.int64) * HV + i_h, b_n, mask=m_r)


@gluon.jit
def _product(s_a, s_b, WM: gl.constexpr, WN: gl.constexpr):
    """[64, 64] fp32 on the accumulator map = the A tile staged in s_a @ the B tile staged in s_b (k = 64)."""
    acc = gl.zeros([8, 8, 2, 4, 8], gl.float32, layout=frag_layout(WM, WN))
    for j in gl.static_range(8):
        f_a = s_a.slice(j * 8, 8).load(a_layout(WM, WN))
        f_b = s_b.slice(j * 8, 8).load(b_layout(WM, WN))
        acc = mma884(acc, gl.expand_dims(f_a, 1), gl.expand_dims(f_b, 0))
    return acc


@gluon.jit
def _wu_block(src, out, s_x, s_b, vec, t, eos, i_h, head, c0, HV, stride_t, stride_h, N: gl.constexpr,
              SCALE_K: gl.constexpr, WM: gl.constexpr, WN: gl.constexpr):
    """out[t + row, i_h, c0 + col] = (X @ (f * src))[row, col] for the 64 columns from c0: f = beta e^g / |k| per
    row (SCALE_K, for w) or beta (u); src [T, H, N] by (stride_t, stride_h) at head ``head``, rows past eos and
    columns past N zero."""
    LB: gl.constexpr = stage_layout_b(WM * WN)
    d, h, ll, kk = stage_index(64, LB)
    c = c0 + 8 * (d % 8) + 4 * h + ll
    r = 8 * (d // 8) + kk
    b = gl.load(src + (t + r).to(gl.int64) * stride_t + head * stride_h + c, mask=((t + r) < eos) & (c < N),
                other=0.0).to(gl.float32)
    f = gl.load(vec + 128 + r)
    if SCALE_K:
        f = f * gl.load(vec + 64 + r) * gl.exp(gl.load(vec + r))
    s_b.store((b * f).to(gl.float16))
    acc = _product(s_x, s_b, WM, WN)
    rows, cols = acc_rows_cols(64, 64, WM, WN)
    gl.store(out + ((t + rows).to(gl.int64) * HV + i_h) * N + c0 + cols, acc.to(gl.float16),
             mask=((t + rows) < eos) & (c0 + cols < N))


@gluon.jit
def gdn_chunk_wy_sm70_kernel(k, v, g, beta, w, u, kn, vec, qsl, cu_chunks, c_lo, B, HV, R, stride_k_t, stride_k_h,
                             stride_v_t, stride_v_h, stride_g_t, stride_beta_t, K: gl.constexpr, V: gl.constexpr,
                             BK: gl.constexpr, BV: gl.constexpr, USE_L2NORM: gl.constexpr, WM: gl.constexpr,
                             WN: gl.constexpr):
    """w [T, Hv, K], u [T, Hv, V] fp16 and kn [T, Hv] fp32, as gdn_chunk_wy_kernel; BK, BV multiples of 64."""
    i_c = gl.program_id(0) + c_lo
    i_h = gl.program_id(1)
    i_hk = i_h // R
    t, eos = chunk_of(qsl, cu_chunks, B, i_c)
    if t < eos:
        NW: gl.constexpr = WM * WN
        KS: gl.constexpr = 32
        LA: gl.constexpr = stage_layout_a(NW)
        LF: gl.constexpr = frag_layout(WM, WN)
        # indexed by the global chunk: windows of the same launch list never share a slot
        p_vec = vec + (i_c.to(gl.int64) * HV + i_h) * 192
        _vectors(k, g, beta, kn, p_vec, t, eos, i_h, i_hk, HV, stride_k_t, stride_k_h, stride_g_t, stride_beta_t,
                 K, BK, USE_L2NORM, NW)

        # K K^T: k staged in the A order [(step, mb), h, l, k] (row 8 mb + 4 h + l, dk 8 step + k); the same
        # staging read in the B layout is k^T (its column the token, its k dk)
        da, ha, la, ka = stage_index(KS // 8 * 8, LA)
        r_a = 8 * (da % 8) + 4 * ha + la
        k_a = 8 * (da // 8) + ka
        m_a = (t + r_a) < eos
        p_ka = k + (t + r_a).to(gl.int64) * stride_k_t + i_hk * stride_k_h + k_a
        s_k = gl.allocate_shared_memory(gl.float16, a_smem_shape(64, KS), smem_layout())
        acc = gl.zeros([8, 8, 2, 4, 8], gl.float32, layout=LF)
        b_k = gl.load(p_ka, mask=m_a & (k_a < K), other=0.0)
        for k0 in range(0, BK, KS):
            s_k.store(b_k)
            k1 = k0 + KS
            b_k = gl.load(p_ka + k1, mask=m_a & (k_a + k1 < K), other=0.0)
            for j in gl.static_range(KS // 8):
                f_a = s_k.slice(j * 8, 8).load(a_layout(WM, WN))
                f_b = s_k.slice(j * 8, 8).load(b_layout(WM, WN))
                acc = mma884(acc, gl.expand_dims(f_a, 1), gl.expand_dims(f_b, 0))

        # the vectors' global writes are visible to the whole CTA after the barrier
        cta_barrier()
        rows, cols = acc_rows_cols(64, 64, WM, WN)
        g_r = gl.load(p_vec + rows)
        g_c = gl.load(p_vec + cols)
        f = gl.load(p_vec + 64 + rows) * gl.load(p_vec + 64 + cols) * gl.load(p_vec + 128 + rows)
        # strictly lower; above the diagonal the exponent is > 0: clamped, masked
        a = gl.where(rows > cols, acc * f * gl.exp(gl.minimum(g_r - g_c, 0.0)), 0.0)

        # X_2 = I - A inside the 2-blocks, then X_2s = X_s - (X_s A_off) X_s for s = 2 .. 32
        x = gl.where(rows == cols, 1.0, 0.0) - gl.where(rows >> 1 == cols >> 1, a, 0.0)
        s_xa = gl.allocate_shared_memory(gl.float16, a_smem_shape(64, 64), smem_layout())
        s_xb = gl.allocate_shared_memory(gl.float16, b_smem_shape(64, 64), smem_layout())
        s_ob = gl.allocate_shared_memory(gl.float16, b_smem_shape(64, 64), smem_layout())
        s_pa = gl.allocate_shared_memory(gl.float16, a_smem_shape(64, 64), smem_layout())
        for lv in gl.static_range(1, 6):
            off = gl.where((rows >> (lv + 1) == cols >> (lv + 1)) & (rows >> lv != cols >> lv), a, 0.0)
            xh = x.to(gl.float16)
            s_xa.store(to_a_stage(xh, 8, 8))
            s_xb.store(to_b_stage(xh, 8, 8))
            s_ob.store(to_b_stage(off.to(gl.float16), 8, 8))
            p = _product(s_xa, s_ob, WM, WN)
            s_pa.store(to_a_stage(p.to(gl.float16), 8, 8))
            x = x - _product(s_pa, s_xb, WM, WN)

        s_xa.store(to_a_stage(x.to(gl.float16), 8, 8))
        s_b = gl.allocate_shared_memory(gl.float16, b_smem_shape(64, 64), smem_layout())
        for c0 in gl.static_range(0, BK, 64):
            _wu_block(k, w, s_xa, s_b, p_vec, t, eos, i_h, i_hk, c0, HV, stride_k_t, stride_k_h, K, True, WM, WN)
        for c0 in gl.static_range(0, BV, 64):
            _wu_block(v, u, s_xa, s_b, p_vec, t, eos, i_h, i_h, c0, HV, stride_v_t, stride_v_h, V, False, WM, WN)


def wy_hmma_applies(table, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the split form's WY stage runs here: a row with ``wy_hmma`` (sm_70), fp16, on CUDA."""
    return bool(getattr(table, "wy_hmma", False)) and dtype == torch.float16 and cuda_device(device)


def wy_launch_sm70(k, v, g, beta, qsl, cu_chunks, nb: int, nt: int, l2: bool):
    """The split's WY stage on HMMA.884 over a window of chunks [c_lo, c_hi) and the tensors it fills, as
    chunk.wy_launch: w [T, Hv, dk], u [T, Hv, dv] fp16, kn [T, Hv] fp32."""
    from .table import SPLIT_MIN_BLOCK, pad
    t, hk, dk = k.shape
    hv, dv = v.shape[1:]
    check_o_sm70(k, 64)
    bk, bv = max(SPLIT_MIN_BLOCK, pad(dk)), max(SPLIT_MIN_BLOCK, pad(dv))
    w = torch.empty((t, hv, dk), dtype=v.dtype, device=v.device)
    u = torch.empty((t, hv, dv), dtype=v.dtype, device=v.device)
    kn = torch.empty((t, hv), dtype=torch.float32, device=v.device)
    vec = torch.empty((max(nt, 1), hv, 192), dtype=torch.float32, device=v.device)  # per-row vectors
    tile = SM70_WY_TILE

    def wy(c_lo=0, c_hi=nt):
        gdn_chunk_wy_sm70_kernel[(c_hi - c_lo, hv)](
            k, v, g, beta, w, u, kn, vec, qsl, cu_chunks, c_lo, nb, hv, hv // hk, k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), g.stride(0), beta.stride(0), K=dk, V=dv, BK=bk, BV=bv, USE_L2NORM=l2,
            WM=tile.WM, WN=tile.WN, num_warps=tile.num_warps)

    return w, u, kn, wy


def aot_configs(cc: int) -> list[AotConfig]:
    """The sm_70 WY kernel at the model's head dims (dk = dv = 128) and the small models' (32, blocks of 64), fp16."""
    from .table import SPLIT_MIN_BLOCK, aot_config
    p, f32, i32 = "*fp16", "*fp32", "*i32"
    ptrs = {"k": p, "v": p, "g": f32, "beta": f32, "w": p, "u": p, "kn": f32, "vec": f32, "qsl": i32,
            "cu_chunks": i32}
    t = SM70_WY_TILE
    return [aot_config(gdn_chunk_wy_sm70_kernel, ptrs, dict(K=d, V=d, BK=max(SPLIT_MIN_BLOCK, d),
                                                            BV=max(SPLIT_MIN_BLOCK, d), USE_L2NORM=True, WM=t.WM,
                                                            WN=t.WN),
                       t.num_warps, 1, f"chunk_wy_sm70_dk{d}_fp16", True) for d in (128, 32)]
