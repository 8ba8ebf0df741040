"""Sorted MoE for decode-sized batches on sm_80/90 tensor cores: the W4A16 experts on ``mma.sync.m16n8k16`` with the
weight in registers (the dense kernel's main loop, w4a16/gemm_mma.py), for fp16 activations.

Rows are grouped by expert and padded to blocks of 16 MB (route.align_tokens, one launch); each program takes one
block and 64 W columns of its expert, so a block of one token costs its expert's weight bytes and MMAs on padding
(free: the loop is bound by the weight bytes). Three launches after the alignment:

- gate_up + SiLU: each warp's 64 columns are 32 gate columns and the same 32 up columns (a lane's 8 adjacent
  codes are 4 of each: two 16-byte loads), so ``silu(gate) * up`` is formed in registers and h is written once
  (fp16, as the tl.dot path's h).
- down, times the routing weight, fp32 rows; ``combine_kernel`` (grouped.py) sums each token's top_k rows in order.

fused.py's table sends W4A16 fp16 MoE here for ``row_max < T * top_k <= mma_max_rows``; the tl.dot kernel of
grouped.py is the twin (and the interpreter's path).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ...errors import KernelContractError
from ..common.aot import AotConfig
from ..common.arch import cuda_device
from ..common.splitk import REDUCE_BLOCK
from ..w4a16.gemm_mma import (MmaTile, tile_index, acc_index, code_layout, frag_layout, mainloop, scale_layout,
                              x_layout)
from ..w4a16.packing import QuantizedWeight
from .grouped import combine_kernel
from .route import align_tokens


@gluon.jit
def moe_gemm_mma_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, sorted_ptr, bexp_ptr, npost_ptr, tw_ptr, out_ptr, TK, N, K,
                        stride_xm, A_DIV: gl.constexpr, G: gl.constexpr, MB: gl.constexpr, W: gl.constexpr,
                        UP: gl.constexpr):
    """UP: out[row, :N] = silu(a W_gate) * (a W_up) (fp16), W = [E, K // 8, 2N], a = x[row // A_DIV];
    else out[row] = topk_weight[row] * (a W) (fp32), W = [E, K // 8, N], a = x[row]. x_ptr: int32 view of a."""
    i_b, i_n = gl.program_id(0), gl.program_id(1)
    BM: gl.constexpr = 16 * MB
    if i_b * BM >= gl.load(npost_ptr):
        return
    i_e = gl.load(bexp_ptr + i_b).to(gl.int64)
    KS: gl.constexpr = G // 32
    LQ: gl.constexpr = code_layout(W, KS)
    LS: gl.constexpr = scale_layout(W)
    LX: gl.constexpr = x_layout(W, MB, KS)
    if UP:
        NW = 2 * N
    else:
        NW = N

    # codes [W, 8, 4, KS, 8]: UP: gate column 32 w + 4 g + e % 4 (+ N for e >= 4: up); else 64 w + 8 g + e
    e = tile_index(8, LQ, 5, 4)
    if UP:
        o_c = i_n * 32 * W + 32 * tile_index(W, LQ, 5, 0) + 4 * tile_index(8, LQ, 5, 1) + e % 4
        o_qn = o_c + (e // 4) * N
    else:
        o_c = i_n * 64 * W + 64 * tile_index(W, LQ, 5, 0) + 8 * tile_index(8, LQ, 5, 1) + e
        o_qn = o_c
    o_qr = 4 * tile_index(KS, LQ, 5, 3) + tile_index(4, LQ, 5, 2)
    m_q = (o_c < N) & (o_qr >= 0)
    p_q = qw_ptr + i_e * (K // 8) * NW + o_qr * NW + o_qn
    # scales / zeros [W, 8, 4, 8], the same columns
    es = tile_index(8, LS, 4, 3)
    sw, sg, st = tile_index(W, LS, 4, 0), tile_index(8, LS, 4, 1), tile_index(4, LS, 4, 2)
    if UP:
        o_sc = i_n * 32 * W + 32 * sw + 4 * sg + es % 4 + 0 * st
        o_sn = o_sc + (es // 4) * N
    else:
        o_sc = i_n * 64 * W + 64 * sw + 8 * sg + es + 0 * st
        o_sn = o_sc
    m_s = o_sc < N
    o_sz = i_e * (K // G) * NW + o_sn
    # x [1, 2 MB, 8, 4, KS, 4]: the block's sorted row 8 j + g; padding rows hold TK
    b_row = gl.load(sorted_ptr + i_b * BM + 8 * tile_index(2 * MB, LX, 6, 1) + tile_index(8, LX, 6, 2))
    o_xc = 16 * tile_index(KS, LX, 6, 4) + 4 * tile_index(4, LX, 6, 3) + tile_index(4, LX, 6, 5)
    m_x = (b_row < TK) & (o_xc >= 0)
    p_x = x_ptr + (b_row // A_DIV) * stride_xm + o_xc

    acc = mainloop(p_q, p_x, s_ptr + o_sz, z_ptr + o_sz, m_q, m_x, m_s, NW, 0, K, G, MB, W, False)

    # accumulator [R, mb, g, t, s]: sorted position 16 mb + 8 (s // 4) + 2 t + s % 2
    aR, am, ag, at, a_s = acc_index(MB, W)
    o_p = i_b * BM + 16 * am + 8 * (a_s // 4) + 2 * at + a_s % 2
    if UP:
        # R = 4 w + 2 u + b: u = 0 gate, 1 up of the same column 32 w + 4 g + 2 b + (s % 4) // 2
        o_n = i_n * 32 * W + 32 * (aR // 4) + 4 * ag + 2 * (aR % 2) + (a_s % 4) // 2 + 0 * o_p
        o_p = o_p + 0 * o_n
        gate, up = _gate_up(acc, W, MB)
        o_n, _ = _gate_up(o_n, W, MB)
        o_p, _ = _gate_up(o_p, W, MB)
        b_row = gl.load(sorted_ptr + o_p)
        h = gate / (1.0 + gl.exp(-gate)) * up
        gl.store(out_ptr + b_row * N + o_n, h.to(gl.float16), mask=(b_row < TK) & (o_n < N))
    else:
        o_n = i_n * 64 * W + 64 * (aR // 4) + 8 * ag + 2 * (aR % 4) + (a_s % 4) // 2
        b_row = gl.load(sorted_ptr + o_p)
        m_y = (b_row < TK) & (o_n < N)
        acc = acc * gl.load(tw_ptr + b_row, mask=b_row < TK, other=0.0)
        gl.store(out_ptr + b_row * N + o_n, acc, mask=m_y)


@gluon.jit
def _gate_up(v, W: gl.constexpr, MB: gl.constexpr):
    """[4 W, MB, 8, 4, 8] with R = 4 w + 2 u + b -> the u = 0 and u = 1 halves, [W, 2, MB, 8, 4, 8] each."""
    v = gl.reshape(v, [W, 2, 2, MB, 8, 4, 8])
    return gl.split(gl.permute(v, [0, 2, 3, 4, 5, 6, 1]))


# ---------------------------------------------------------------- launcher
def mma_moe_applies(x, w13, w2) -> bool:
    """fp16 activations with 16-byte rows, W4A16 experts (fp16 scales, groups 32/64/128 dividing K), an intermediate
    size whose h rows stay 16-byte aligned (a multiple of 8), CUDA."""
    return (cuda_device(x.device) and x.dtype == torch.float16 and isinstance(w13, QuantizedWeight)
            and isinstance(w2, QuantizedWeight) and x.stride(-1) == 1 and x.stride(0) % 8 == 0
            and x.data_ptr() % 16 == 0 and (w13.out_features // 2) % 8 == 0 and all(
                w.dtype == torch.float16 and w.group_size in (32, 64, 128) and w.in_features % w.group_size == 0
                and w.qweight.dim() == 3 for w in (w13, w2)))


def fused_moe_mma(x, w13: QuantizedWeight, w2: QuantizedWeight, tw, ids, tile: MmaTile) -> torch.Tensor:
    """x [T, H] fp16, tw [T, top_k] fp32, ids [T, top_k] int32 -> [T, H] fp32 (fused_moe's contract)."""
    if not mma_moe_applies(x, w13, w2):
        raise KernelContractError("fused_moe_mma takes fp16 x with 16-byte rows and W4A16 experts (fp16 scales, "
                                  f"groups 32/64/128) on CUDA; got x {x.dtype} {tuple(x.shape)} on {x.device}")
    t, hid = x.shape
    top_k = ids.shape[1]
    e, inter = w13.qweight.shape[0], w13.out_features // 2
    # the kernels read int32 ids and fp32 routing weights, flat (fused_moe passes them so: no copies there)
    ids, tw = ids.to(torch.int32).contiguous(), tw.to(torch.float32).contiguous()
    out = torch.empty((t, hid), dtype=torch.float32, device=x.device)
    if t == 0:
        return out
    bm = 16 * tile.MB
    sorted_ids, block_expert, n_post = align_tokens(ids, e, bm)
    grid_b = block_expert.numel()
    h = torch.empty((t * top_k, inter), dtype=x.dtype, device=x.device)
    moe_gemm_mma_kernel[(grid_b, -(-inter // (32 * tile.W)))](
        x.view(torch.int32), w13.qweight, w13.scales, w13.zeros, sorted_ids, block_expert, n_post, tw, h, t * top_k,
        inter, hid, x.stride(0) // 2, A_DIV=top_k, G=w13.group_size, MB=tile.MB, W=tile.W, UP=True,
        num_warps=tile.W)
    y = torch.empty((t * top_k, hid), dtype=torch.float32, device=x.device)
    moe_gemm_mma_kernel[(grid_b, -(-hid // (64 * tile.W)))](
        h.view(torch.int32), w2.qweight, w2.scales, w2.zeros, sorted_ids, block_expert, n_post, tw, y, t * top_k,
        hid, inter, inter // 2, A_DIV=1, G=w2.group_size, MB=tile.MB, W=tile.W, UP=False, num_warps=tile.W)
    combine_kernel[(t, -(-hid // REDUCE_BLOCK))](y, ids, out, hid, TOPK=top_k, BLOCK=REDUCE_BLOCK, num_warps=4)
    return out


_SIG = {"x_ptr": "*i32", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "sorted_ptr": "*i32",
        "bexp_ptr": "*i32", "npost_ptr": "*i32", "tw_ptr": "*fp32", "out_ptr": "*fp16", "TK": "i32", "N": "i32",
        "K": "i32", "stride_xm": "i32", "A_DIV": "constexpr", "G": "constexpr", "MB": "constexpr", "W": "constexpr",
        "UP": "constexpr"}


def aot_configs(cc: int, tiles=(MmaTile(1, 4),)) -> list[AotConfig]:
    """Both passes of each tile at groups 128 and 32 (top_k 8); sm_80 and sm_90 only."""
    if cc < 80:
        return []
    out = []
    for t in tiles:
        for g in (128, 32):
            for up in (True, False):
                out.append(AotConfig("moe_gemm_mma_kernel", {**_SIG, "out_ptr": "*fp16" if up else "*fp32"},
                                     dict(A_DIV=8 if up else 1, G=g, MB=t.MB, W=t.W, UP=up), t.W, 1,
                                     f"moe mma MB{t.MB} W{t.W} g{g} {'up' if up else 'down'}",
                                     divisible_by_16=("N", "K", "stride_xm")))
    return out
