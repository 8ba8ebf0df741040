"""Gated DeltaNet chunked prefill (the split form), stage 3 on sm_70: the Gluon / HMMA.884 twin of
:func:`catengine.kernels.gdn.chunk_o.gdn_chunk_o_kernel` (same inputs, same output)

    o = e^g (q S_chunk) + tril(q k^T * e^{g_i - g_j}) v_new,   rows scaled by scale / |q|, columns of q k^T by 1 / |k|

with its three products on ``mma.sync.m8n8k4`` (common/mma884.py), because ``tl.dot`` is FMA on sm_70 from Triton
3.3 on. Per program (chunk, value head, dv block of BV):

- q k^T [64, 64] and q S [64, BV] share the A fragments of q: one loop over dk in steps of KS, q, k (as the B
  operand k^T, contiguous along dk like an A tile) and S staged in shared memory.
- the mask, the decay and the key norms are applied in fp32 on the accumulator map (``acc_rows_cols``); the
  m8n8k4 accumulator map is not its operand map, so the fp16 A tile is permuted in registers into the A staging
  order [(step, mb), h, l, k] and goes through shared memory into the A fragments of A v_new.
- the per-row and per-column vectors (cumulative decay, scale / |q|) are computed once in a 1-D layout and read
  back per accumulator through a 128-float global scratch per program (a gather in registers has no cheap form
  from a 1-D layout onto the fragment map; the barrier makes the CTA's own writes visible).

The host side chooses it on a table row with ``o_hmma`` (the sm_70 row) for fp16 (:mod:`.chunk`).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ...errors import KernelContractError
from ..common.aot import AotConfig
from ..common.arch import cuda_device
from ..common.mma884 import cta_barrier, cumsum
from ..common.mma884 import (Tile884, a_layout, a_smem_shape, acc_rows_cols, b_layout, b_smem_shape, frag_layout,
                             mma884, smem_layout, stage_index, stage_layout_a, stage_layout_b)

# M = 64 tokens (the chunk), N = BV: 4 warps as 2 x 2 (every warp owns whole 16 x 16 squares of both the 64 x 64
# q k^T tile and the 64 x BV output). BV 64 holds 32 + 32 fp32 accumulators per lane (q k^T and the output), so
# a V100 SM keeps several CTAs; BV 128 would compute q k^T once instead of twice per head at dv = 128 but doubles
# the output's registers. Unmeasured on a V100 (none here); shared memory ~28 KB of the 96 KB.
SM70_O_TILE = Tile884(64, 64, 32, 2, 2)


def o_block(dv_block: int) -> int:
    """The dv block of the sm_70 output kernel for a padded dv: the tile's BV, or dv itself when smaller
    (at least 32: 2 warps along N own 16 columns each)."""
    return max(16 * SM70_O_TILE.WN, min(SM70_O_TILE.BN, dv_block))


@gluon.jit
def chunk_of(qsl, cu_chunks, B, i_c):
    """(first token, end of its sequence) of global chunk i_c, as chunk_wy.chunk_of (binary search)."""
    lo = i_c * 0
    hi = lo + B
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = gl.load(cu_chunks + mid) <= i_c
        lo = gl.where(ok, mid, lo)
        hi = gl.where(ok, hi, mid)
    return gl.load(qsl + lo) + (i_c - gl.load(cu_chunks + lo)) * 64, gl.load(qsl + lo + 1)


@gluon.jit
def _vectors(q, g, vec, t, eos, i_h, i_hk, scale, stride_q_t, stride_q_h, stride_g_t, K: gl.constexpr,
             BK: gl.constexpr, USE_L2NORM: gl.constexpr, NW: gl.constexpr):
    """vec[0:64] = cumulative log decay of the chunk's rows (flat past eos), vec[64:128] = scale / |q| per row."""
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    o_t = gl.arange(0, 64, layout=L1)
    m_t = (t + o_t) < eos
    b_g = cumsum(gl.load(g + (t + o_t).to(gl.int64) * stride_g_t + i_h, mask=m_t, other=0.0), 0)
    gl.store(vec + o_t, b_g)
    L2: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    o_r = gl.arange(0, 64, layout=gl.SliceLayout(1, L2))
    o_k = gl.arange(0, BK, layout=gl.SliceLayout(0, L2))
    if USE_L2NORM:
        m_r = (t + o_r) < eos
        p_q = q + gl.expand_dims((t + o_r).to(gl.int64) * stride_q_t + i_hk * stride_q_h, 1) + gl.expand_dims(o_k, 0)
        b_q = gl.load(p_q, mask=gl.expand_dims(m_r, 1) & gl.expand_dims(o_k < K, 0), other=0.0).to(gl.float32)
        b_s = scale * gl.rsqrt(gl.sum(b_q * b_q, 1) + 1e-6)
    else:
        b_s = gl.zeros([64], gl.float32, layout=gl.SliceLayout(1, L2)) + scale
    gl.store(vec + 64 + o_r, b_s)


@gluon.jit
def to_a_stage(x, MB: gl.constexpr, NB: gl.constexpr):
    """A [64, 64] tile from the accumulator map [mb, nb, h, l, i] (row 8 mb + (l & 1) + (i & 2) + 4 h, column
    8 nb + (i & 4) + (l & 2) + (i & 1)) into the A staging order [(nb, mb), h, l', k'] (row 8 mb + 4 h + l',
    column 8 nb + k'), where the next product's k is this tile's column: l' = l0 + 2 i1, k' = i0 + 2 l1 + 4 i2."""
    # dims after the split: mb, nb, h, l1, l0, i2, i1, i0
    x = gl.reshape(x, [MB, NB, 2, 2, 2, 2, 2, 2])
    # -> nb, mb, h, (i1, l0), (i2, l1, i0)
    x = gl.permute(x, [1, 0, 2, 6, 4, 5, 3, 7])
    return gl.reshape(x, [NB * MB, 2, 4, 8])


@gluon.jit
def gdn_chunk_o_sm70_kernel(q, k, vn, hb, g, kn, o, vec, qsl, cu_chunks, c_lo, B, HV, R, scale, stride_q_t,
                            stride_q_h, stride_k_t, stride_k_h, stride_g_t, stride_o_t, stride_o_h,
                            K: gl.constexpr, V: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr,
                            USE_L2NORM: gl.constexpr, WM: gl.constexpr, WN: gl.constexpr):
    i_c = gl.program_id(0) + c_lo
    i_h = gl.program_id(1)
    i_v = gl.program_id(2)
    i_hk = i_h // R
    t, eos = chunk_of(qsl, cu_chunks, B, i_c)
    if t < eos:
        NW: gl.constexpr = WM * WN
        MB: gl.constexpr = 8                 # 64 rows (tokens) of 8
        NA: gl.constexpr = 8                 # 64 columns (tokens) of q k^T
        NBV: gl.constexpr = BV // 8
        KS: gl.constexpr = BK if BK < 32 else 32
        LA: gl.constexpr = stage_layout_a(NW)
        LB: gl.constexpr = stage_layout_b(NW)
        LF: gl.constexpr = frag_layout(WM, WN)
        # indexed by the global chunk: windows of the same launch list never share a slot
        p_vec = vec + ((i_c.to(gl.int64) * HV + i_h) * gl.num_programs(2) + i_v) * 128
        _vectors(q, g, p_vec, t, eos, i_h, i_hk, scale, stride_q_t, stride_q_h, stride_g_t, K, BK, USE_L2NORM, NW)

        # q staging [(step, mb), h, l, k] (A map: row 8 mb + 4 h + l); k^T as the B operand: its column is the
        # token, its k is dk, so it is staged like an A tile (8 consecutive dk per lane, contiguous in memory)
        da, ha, la, ka = stage_index(KS // 8 * MB, LA)
        r_a = 8 * (da % MB) + 4 * ha + la
        k_a = 8 * (da // MB) + ka
        m_a = (t + r_a) < eos
        p_qa = q + (t + r_a).to(gl.int64) * stride_q_t + i_hk * stride_q_h + k_a
        p_ka = k + (t + r_a).to(gl.int64) * stride_k_t + i_hk * stride_k_h + k_a
        # S [dk, dv] staging [(step, nb), h, l, k] (B map: column 8 nb + 4 h + l), contiguous along dv
        ds, hs, ls, ks = stage_index(KS // 8 * NBV, LB)
        c_s = i_v * BV + 8 * (ds % NBV) + 4 * hs + ls
        k_s = 8 * (ds // NBV) + ks
        m_s = c_s < V
        p_s = hb + (i_c.to(gl.int64) * HV + i_h) * (K * V) + k_s * V + c_s

        s_q = gl.allocate_shared_memory(gl.float16, a_smem_shape(64, KS), smem_layout())
        s_k = gl.allocate_shared_memory(gl.float16, b_smem_shape(KS, 64), smem_layout())
        s_s = gl.allocate_shared_memory(gl.float16, b_smem_shape(KS, BV), smem_layout())
        acc_a = gl.zeros([MB, NA, 2, 4, 8], gl.float32, layout=LF)
        acc_o = gl.zeros([MB, NBV, 2, 4, 8], gl.float32, layout=LF)
        b_q = gl.load(p_qa, mask=m_a & (k_a < K), other=0.0)
        b_k = gl.load(p_ka, mask=m_a & (k_a < K), other=0.0)
        b_s = gl.load(p_s, mask=m_s & (k_s < K), other=0.0)
        for k0 in range(0, BK, KS):
            s_q.store(b_q)
            s_k.store(b_k)
            s_s.store(b_s)
            # the next dk slice's loads are in flight while the tensor cores work on this one (masked past K)
            k1 = k0 + KS
            b_q = gl.load(p_qa + k1, mask=m_a & (k_a + k1 < K), other=0.0)
            b_k = gl.load(p_ka + k1, mask=m_a & (k_a + k1 < K), other=0.0)
            b_s = gl.load(p_s + k1 * V, mask=m_s & (k_s + k1 < K), other=0.0)
            for j in gl.static_range(KS // 8):
                f_q = gl.expand_dims(s_q.slice(j * MB, MB).load(a_layout(WM, WN)), 1)
                f_k = s_k.slice(j * NA, NA).load(b_layout(WM, WN))
                f_s = s_s.slice(j * NBV, NBV).load(b_layout(WM, WN))
                acc_a = mma884(acc_a, f_q, gl.expand_dims(f_k, 0))
                acc_o = mma884(acc_o, f_q, gl.expand_dims(f_s, 0))

        # the vectors' global writes are visible to the whole CTA after the barrier
        cta_barrier()
        # [64, 64]: causal q k^T / |k_j| * e^{g_i - g_j}; above the diagonal the exponent is > 0: clamped, masked
        rows, cols = acc_rows_cols(64, 64, WM, WN)
        g_r = gl.load(p_vec + rows)
        g_c = gl.load(p_vec + cols)
        n_c = gl.load(kn + (t + cols).to(gl.int64) * HV + i_h, mask=(t + cols) < eos, other=0.0)
        a = gl.where(rows >= cols, acc_a * n_c * gl.exp(gl.minimum(g_r - g_c, 0.0)), 0.0)
        s_a = gl.allocate_shared_memory(gl.float16, a_smem_shape(64, 64), smem_layout())
        s_a.store(to_a_stage(a.to(gl.float16), MB, NA))

        # v_new [64 tokens, BV] as the B operand of A v_new, contiguous along dv
        dv, hv, lv, kv = stage_index(8 * NBV, LB)
        c_v = i_v * BV + 8 * (dv % NBV) + 4 * hv + lv
        r_v = 8 * (dv // NBV) + kv
        b_v = gl.load(vn + ((t + r_v).to(gl.int64) * HV + i_h) * V + c_v, mask=((t + r_v) < eos) & (c_v < V),
                      other=0.0)
        s_v = gl.allocate_shared_memory(gl.float16, b_smem_shape(64, BV), smem_layout())
        s_v.store(b_v)

        rows_o, cols_o = acc_rows_cols(64, BV, WM, WN)
        acc_o = acc_o * gl.exp(gl.load(p_vec + rows_o))
        for j in gl.static_range(8):
            f_a = s_a.slice(j * MB, MB).load(a_layout(WM, WN))
            f_v = s_v.slice(j * NBV, NBV).load(b_layout(WM, WN))
            acc_o = mma884(acc_o, gl.expand_dims(f_a, 1), gl.expand_dims(f_v, 0))
        acc_o = acc_o * gl.load(p_vec + 64 + rows_o)
        c_o = i_v * BV + cols_o
        gl.store(o + (t + rows_o).to(gl.int64) * stride_o_t + i_h * stride_o_h + c_o, acc_o.to(gl.float16),
                 mask=((t + rows_o) < eos) & (c_o < V))


def o_hmma_applies(table, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the split form's output stage runs here: a row with ``o_hmma`` (sm_70), fp16 (the operands the
    tensor cores take; sm_70 has no bf16), on CUDA (Gluon has no interpreter)."""
    return bool(table.o_hmma) and dtype == torch.float16 and cuda_device(device)


def check_o_sm70(q, bv: int) -> None:
    """The sm_70 GDN kernels' contract (output and state stages): fp16 (sm_70 has no bf16; the tensor-core
    operands are fp16), on CUDA, and a dv block the 2 x 2 warp tile covers."""
    if q.dtype != torch.float16:
        raise KernelContractError(f"the sm_70 GDN kernels take fp16 q, k, v (sm_70 has no bf16), got {q.dtype}")
    if not cuda_device(q.device):
        raise KernelContractError(f"the sm_70 GDN kernels run on CUDA only (Gluon has no interpreter), "
                                  f"got {q.device}")
    tile = Tile884(64, bv, 8, SM70_O_TILE.WM, SM70_O_TILE.WN)
    tile.check()


def output_launch(q, k, vn, hb, g, kn, o, qsl, cu_chunks, scale: float, use_l2norm: bool, nb: int, nt: int):
    """The launch of the split's output stage over a window of chunks [c_lo, c_hi) (the host side's ``out``):
    q, k [T, Hk, dk] fp16, v_new [T, Hv, dv], the chunk start states hb [nt, Hv, dk, dv], g [T, Hv] fp32 (per
    token, not cumulative), kn [T, Hv] fp32 (1 / |k|), o [T, Hv, dv]; cu_chunks [nb + 1] int32 chunk offsets."""
    from .table import pad
    dk, (hv, dv), r = q.shape[2], vn.shape[1:], vn.shape[1] // q.shape[1]
    bv = o_block(pad(dv))
    check_o_sm70(q, bv)
    nvb = -(-dv // bv)
    vec = torch.empty((max(nt, 1), hv, nvb, 128), dtype=torch.float32, device=o.device)  # per-row vectors
    t = SM70_O_TILE

    def out(c_lo=0, c_hi=nt):
        gdn_chunk_o_sm70_kernel[(c_hi - c_lo, hv, nvb)](
            q, k, vn, hb, g, kn, o, vec, qsl, cu_chunks, c_lo, nb, hv, r, scale, q.stride(0), q.stride(1),
            k.stride(0), k.stride(1), g.stride(0), o.stride(0), o.stride(1), K=dk, V=dv, BK=pad(dk), BV=bv,
            USE_L2NORM=use_l2norm, WM=t.WM, WN=t.WN, num_warps=t.num_warps)

    return out


def aot_configs(cc: int) -> list[AotConfig]:
    """The sm_70 output kernel at the model's head dims (dk = dv = 128) and the small models' (32), fp16."""
    from .table import aot_config
    p, f32, i32 = "*fp16", "*fp32", "*i32"
    ptrs = {"q": p, "k": p, "vn": p, "hb": p, "g": f32, "kn": f32, "o": p, "vec": f32, "qsl": i32, "cu_chunks": i32}
    t = SM70_O_TILE
    out = []
    for d in (128, 32):
        bk = max(16, d)
        c = aot_config(gdn_chunk_o_sm70_kernel, ptrs, dict(K=d, V=d, BK=bk, BV=o_block(bk), USE_L2NORM=True,
                                                          WM=t.WM, WN=t.WN),
                       t.num_warps, 1, f"chunk_o_sm70_dk{d}_fp16", True)
        out.append(c)
    return out
