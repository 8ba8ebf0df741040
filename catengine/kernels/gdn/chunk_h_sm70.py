"""Gated DeltaNet chunked prefill (the split form), stage 2 on sm_70: the Gluon / HMMA.884 twin of
:func:`catengine.kernels.gdn.chunk_h.gdn_chunk_h_kernel` (same inputs, same outputs). Per program (sequence x
value head, dv block of BV), serial over the sequence's chunks of a window [c_lo, c_hi):

    hb[chunk] = S (fp16);  v_new = u - w S (stored fp16);  S = e^{g_last} S + k^T (v_new * f),
    f = 1 / |k| * e^{g_last - g}  per token

The state S [dk, BV] stays in fp32 registers in the m8n8k4 accumulator map across chunks (common/mma884.py).
Both products need it (and v_new) as a B operand, whose fragment map is not the accumulator map: each is
rounded to fp16 (as the tl.dot kernel does), permuted in registers into the B staging order and passes through
shared memory. The per-token factor f is computed once per chunk in a 1-D layout and read back on the
accumulator map through a 64-float global scratch per program (barriers on both sides: the slot is reused by
the next chunk).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..common.aot import AotConfig
from ..common.arch import cuda_device
from ..common.mma884 import cta_barrier, cumsum
from ..common.mma884 import (Tile884, a_layout, a_smem_shape, acc_rows_cols, b_layout, b_smem_shape, frag_layout,
                             mma884, smem_layout, stage_index, stage_layout_a, stage_layout_b)
from .chunk_o_sm70 import check_o_sm70

# M = 64 tokens (v_new) and dk (the state), N = BV on 2 x 2 warps. BV 32: the state's 128 x 32 fp32 is 32
# registers per lane and a 1 x 8K prefill of the 27B's 48 value heads has 192 serial programs for the V100's
# 80 SMs (96 with BV 64). Unmeasured on a V100; shared memory ~40 KB of the 96 KB.
SM70_H_TILE = Tile884(64, 32, 8, 2, 2)


def h_block_k(dk_block: int) -> int:
    """The state's row block for a padded dk: at least 32 (2 warps along M own 16 rows each)."""
    return max(16 * SM70_H_TILE.WM, dk_block)


@gluon.jit
def _to_b_stage(x, MB: gl.constexpr, NB: gl.constexpr):
    """A [8 MB, 8 NB] tile from the accumulator map [mb, nb, h, l, i] (row 8 mb + (l & 1) + (i & 2) + 4 h,
    column 8 nb + (i & 4) + (l & 2) + (i & 1)) into the B staging order [(mb, nb), h', l', k'] of a product
    whose k is this tile's row (column 8 nb + 4 h' + l', row 8 mb + k'): h' = i2, l' = i0 + 2 l1,
    k' = l0 + 2 i1 + 4 h."""
    # dims after the split: mb, nb, h, l1, l0, i2, i1, i0
    x = gl.reshape(x, [MB, NB, 2, 2, 2, 2, 2, 2])
    x = gl.permute(x, [0, 1, 5, 3, 7, 2, 6, 4])
    return gl.reshape(x, [MB * NB, 2, 4, 8])


@gluon.jit
def gdn_chunk_h_sm70_kernel(k, w, u, g, kn, vn, hb, ssm, vec, qsl, cu_chunks, state_slots, has_init, c_lo, c_hi, HV,
                            R, stride_k_t, stride_k_h, stride_g_t, stride_ssm_slot, K: gl.constexpr, V: gl.constexpr,
                            BK: gl.constexpr, BV: gl.constexpr, WM: gl.constexpr, WN: gl.constexpr):
    i_bh = gl.program_id(0)
    i_v = gl.program_id(1)
    i_b = i_bh // HV
    i_h = i_bh % HV
    i_hk = i_h // R
    bos = gl.load(qsl + i_b)
    eos = gl.load(qsl + i_b + 1)
    c0 = gl.load(cu_chunks + i_b)
    # the global window [c_lo, c_hi) cut to the sequence's chunks (as chunk_h._window)
    j0 = gl.maximum(c_lo - c0, 0)
    j1 = gl.minimum(c_hi, gl.load(cu_chunks + i_b + 1)) - c0
    if j1 > j0:
        slot = gl.load(state_slots + i_b).to(gl.int64)
        n_init = gl.where(j0 > 0, K, gl.where(gl.load(has_init + i_b) != 0, K, 0))
        NW: gl.constexpr = WM * WN
        MB: gl.constexpr = 8                  # 64 tokens of 8
        MK: gl.constexpr = BK // 8            # dk rows of 8
        NBV: gl.constexpr = BV // 8
        LA: gl.constexpr = stage_layout_a(NW)
        LB: gl.constexpr = stage_layout_b(NW)
        LF: gl.constexpr = frag_layout(WM, WN)
        L1: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        p_vec = vec + (i_bh * gl.num_programs(1) + i_v).to(gl.int64) * 64
        o_t1 = gl.arange(0, 64, layout=L1)

        # the state [BK, BV] in the accumulator map
        rows_s, cols_s = acc_rows_cols(BK, BV, WM, WN)
        c_s = i_v * BV + cols_s
        m_s = (rows_s < K) & (c_s < V)
        p_s = ssm + slot * stride_ssm_slot + i_h * K * V + rows_s * V + c_s
        b_h = gl.load(p_s, mask=(rows_s < n_init) & (c_s < V), other=0.0).to(gl.float32)
        # v_new [64, BV] in the accumulator map
        rows_v, cols_v = acc_rows_cols(64, BV, WM, WN)
        c_v = i_v * BV + cols_v
        # w [64 tokens, dk] staged as A [(step, mb), h, l, k] (8 consecutive dk per lane)
        da, ha, la, ka = stage_index(MK * MB, LA)
        r_w = 8 * (da % MB) + 4 * ha + la
        k_w = 8 * (da // MB) + ka
        # k^T [dk, 64 tokens] staged as A: its rows (dk) are contiguous in memory, so B's staging layout loads it
        dk_, hk_, lk_, kk_ = stage_index(8 * MK, LB)
        r_k = 8 * (dk_ % MK) + 4 * hk_ + lk_
        t_k = 8 * (dk_ // MK) + kk_

        s_h = gl.allocate_shared_memory(gl.float16, b_smem_shape(BK, BV), smem_layout())
        s_w = gl.allocate_shared_memory(gl.float16, a_smem_shape(64, BK), smem_layout())
        s_kt = gl.allocate_shared_memory(gl.float16, a_smem_shape(BK, 64), smem_layout())
        s_vf = gl.allocate_shared_memory(gl.float16, b_smem_shape(64, BV), smem_layout())
        for j in range(j0, j1):
            t = bos + j * 64
            # inputs that do not depend on the state first, so their loads overlap the last chunk's math
            m_t1 = (t + o_t1) < eos
            b_g = gl.load(g + (t + o_t1).to(gl.int64) * stride_g_t + i_h, mask=m_t1, other=0.0)
            b_gl = gl.sum(b_g, 0)
            b_f = gl.load(kn + (t + o_t1).to(gl.int64) * HV + i_h, mask=m_t1, other=0.0) * \
                gl.exp(b_gl - cumsum(b_g, 0))
            b_w = gl.load(w + ((t + r_w).to(gl.int64) * HV + i_h) * K + k_w, mask=((t + r_w) < eos) & (k_w < K),
                          other=0.0)
            m_v = ((t + rows_v) < eos) & (c_v < V)
            o_r = (t + rows_v).to(gl.int64) * HV + i_h
            b_u = gl.load(u + o_r * V + c_v, mask=m_v, other=0.0)
            # the previous chunk's readers of the scratch are done before it is overwritten, and its writes
            # are visible to the whole CTA before they are read
            cta_barrier()
            gl.store(p_vec + o_t1, b_f)
            cta_barrier()

            b_hd = b_h.to(gl.float16)
            gl.store(hb + ((j + c0).to(gl.int64) * HV + i_h) * (K * V) + rows_s * V + c_s, b_hd, mask=m_s)
            s_h.store(_to_b_stage(b_hd, MK, NBV))
            s_w.store(b_w)
            # v_new = u - w S
            acc_v = gl.zeros([MB, NBV, 2, 4, 8], gl.float32, layout=LF)
            for s in gl.static_range(MK):
                f_w = s_w.slice(s * MB, MB).load(a_layout(WM, WN))
                f_h = s_h.slice(s * NBV, NBV).load(b_layout(WM, WN))
                acc_v = mma884(acc_v, gl.expand_dims(f_w, 1), gl.expand_dims(f_h, 0))
            b_v = b_u.to(gl.float32) - acc_v
            gl.store(vn + o_r * V + c_v, b_v.to(gl.float16), mask=m_v)
            # k^T loaded only now: with w's staging and the state live it would spill (255 registers at dk 128)
            b_k = gl.load(k + (t + t_k).to(gl.int64) * stride_k_t + i_hk * stride_k_h + r_k,
                          mask=((t + t_k) < eos) & (r_k < K), other=0.0)
            s_kt.store(b_k)
            # S = e^{g_last} S + k^T (v_new * f)
            b_vf = (b_v * gl.load(p_vec + rows_v)).to(gl.float16)
            s_vf.store(_to_b_stage(b_vf, MB, NBV))
            b_h = b_h * gl.exp(b_gl)
            for s in gl.static_range(8):
                f_k = s_kt.slice(s * MK, MK).load(a_layout(WM, WN))
                f_v = s_vf.slice(s * NBV, NBV).load(b_layout(WM, WN))
                b_h = mma884(b_h, gl.expand_dims(f_k, 1), gl.expand_dims(f_v, 0))
        gl.store(p_s, b_h.to(ssm.dtype.element_ty), mask=m_s)


def h_hmma_applies(table, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the split form's state stage runs here: a row with ``h_hmma`` (sm_70), fp16, on CUDA."""
    return bool(table.h_hmma) and dtype == torch.float16 and cuda_device(device)


def state_launch(k, w, u, g, kn, vn, hb, ssm, qsl, cu_chunks, state_slots, has_init, nb: int, nt: int):
    """The launch of the split's serial state stage over a window of chunks [c_lo, c_hi) (the host side's
    ``state``) and its program count: k [T, Hk, dk] fp16, w [T, Hv, dk], u [T, Hv, dv], g [T, Hv] fp32 per
    token, kn [T, Hv] fp32 (1 / |k|); writes v_new, the chunk start states hb and the final states in ssm."""
    from .table import pad
    dk, (hv, dv), r = k.shape[2], u.shape[1:], u.shape[1] // k.shape[1]
    t = SM70_H_TILE
    bk, bv = h_block_k(pad(dk)), t.BN
    check_o_sm70(k, bv)
    Tile884(bk, bv, 8, t.WM, t.WN).check()
    nvb = -(-dv // bv)
    vec = torch.empty((nb * hv, nvb, 64), dtype=torch.float32, device=k.device)   # per-token factors, per program

    def state(c_lo=0, c_hi=nt):
        gdn_chunk_h_sm70_kernel[(nb * hv, nvb)](
            k, w, u, g, kn, vn, hb, ssm, vec, qsl, cu_chunks, state_slots, has_init, c_lo, c_hi, hv, r, k.stride(0),
            k.stride(1), g.stride(0), ssm.stride(0), K=dk, V=dv, BK=bk, BV=bv, WM=t.WM, WN=t.WN,
            num_warps=t.num_warps)

    return state, nb * hv * nvb


def aot_configs(cc: int) -> list[AotConfig]:
    """The sm_70 state kernel at the model's head dims (dk = dv = 128) and the small models' (32), fp16."""
    from .table import aot_config
    p, f32, i32 = "*fp16", "*fp32", "*i32"
    ptrs = {"k": p, "w": p, "u": p, "g": f32, "kn": f32, "vn": p, "hb": p, "ssm": f32, "vec": f32, "qsl": i32,
            "cu_chunks": i32, "state_slots": i32, "has_init": "*i1"}
    t = SM70_H_TILE
    return [aot_config(gdn_chunk_h_sm70_kernel, ptrs, dict(K=d, V=d, BK=h_block_k(d), BV=t.BN, WM=t.WM, WN=t.WN),
                       t.num_warps, 1, f"chunk_h_sm70_dk{d}_fp16", True) for d in (128, 32)]
