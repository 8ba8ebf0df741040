"""The sorted (prefill) path of :func:`catengine.kernels.moe.fused.fused_moe` for sm_70 on the HMMA.884 building
block (common/mma884.py): W4A16 experts, fp16 activations, groups 32/64/128 (issue 18, item 2).

From Triton 3.3 on the ``tl.dot`` of grouped.py is FMA on sm_70. The same grouped GEMM here: rows sorted by
expert and padded to BM (route.align_tokens), one program per (block of BM rows of one expert, BN columns), A
gathered row by row from the sorted ids into the shared staging of the A fragment map, the int4 codes of that
expert dequantised in registers straight into the B fragment as in w4a16/gemm_sm70.py (nibble | 0x6400 is the
fp16 ``1024 + q``; subtracting ``1024 + z`` is exact, times s rounds once, as the twin's fp16 weight).

- gate_up (UP): two accumulators, gate columns n and up columns I + n of the expert's [H // 8, 2I] codes over the
  same A fragments; the epilogue stores ``silu(gate) * up`` in fp16 (the next product's operand), like grouped.py.
- down: the routing weight of each row applied in fp32 and the row stored in fp32 (one expert's output alone can
  pass 65,504); ``combine_kernel`` then sums each token's top_k rows in order, so the combine stays fp32.

No split K: the up pass cannot split (SiLU needs the whole sum) and at the row counts this path takes (above the
decode GEMV's row_max) the grid already holds E-ish blocks x N tiles. Contract: K of both passes a multiple of
the group size G, BK <= G (one scale row per k tile).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ...errors import KernelContractError
from ..common.aot import AotConfig
from ..common.arch import INTERPRET, cuda_device
from ..common.int4_frag import code_layout, code_smem_layout, code_stage_layout, index3
from ..common.mma884 import (Tile884, a_layout, a_smem_shape, acc_rows_cols, b_layout, frag_layout, mma884,
                             pick_tile, smem_layout, stage_index, stage_layout_a)
from ..common.splitk import REDUCE_BLOCK
from ..w4a16.packing import QuantizedWeight
from .grouped import combine_kernel
from .route import align_tokens

# (max rows per expert on average, tile), 4 warps. Rows per expert at 35B-A3B's 256 experts x top-8: 8-512
# tokens give 0.25-16, where a block is mostly padding, so BM 16 (the least an m8n8k4 warp tile covers, one warp
# along M) wastes least; prefill (8K tokens: 256 rows an expert) takes the 64-row tile. BN 64 keeps the gate_up
# pass's two fp32 accumulators at 32 (BM 64: 2 x 32) registers a thread; BK 32 serves every group (BK <= G).
# Shared memory is a few KB (A 2 * BM * BK, codes BK / 2 * BN per matrix) of the V100's 96: no cp.async on
# sm_70, so the next tile is prefetched into registers while this one is multiplied (2 stages).
SM70_MOE_TABLE = (
    (16, Tile884(16, 64, 32, 1, 4)),
    (None, Tile884(64, 64, 32, 2, 2)),
)
GROUPS = (32, 64, 128)


@gluon.jit
def _dequant(f_q, o_i, zb, s):
    """[NB, 2, 4, 1] codes -> [NB, 2, 4, 8] fp16 ((1024 + q) - (1024 + z)) * s, nibble o_i of each int32."""
    f_v = (((f_q >> (4 * o_i)) & 0xF) | 0x6400).to(gl.int16).to(gl.float16, bitcast=True)
    return (f_v - zb) * s


@gluon.jit
def moe_gemm_sm70_kernel(a_ptr, qw_ptr, s_ptr, z_ptr, sorted_ptr, bexp_ptr, npost_ptr, tw_ptr, out_ptr,
                         TK, N, K, stride_am, A_DIV: gl.constexpr, G: gl.constexpr, BM: gl.constexpr,
                         BN: gl.constexpr, BK: gl.constexpr, WM: gl.constexpr, WN: gl.constexpr, UP: gl.constexpr):
    """UP: out[row] = silu(a W_gate) * (a W_up), a = x[row // A_DIV], W = codes [E, K // 8, 2N] (fp16 out).
    else: out[row] = topk_weight[row] * (a W), a = h[row], W = [E, K // 8, N] (fp32 out)."""
    i_b, i_n = gl.program_id(0), gl.program_id(1)
    if i_b * BM >= gl.load(npost_ptr):
        return
    i_e = gl.load(bexp_ptr + i_b).to(gl.int64)
    NWARP: gl.constexpr = WM * WN
    MB: gl.constexpr = BM // 8
    NB: gl.constexpr = BN // 8
    LA: gl.constexpr = stage_layout_a(NWARP)
    LQ: gl.constexpr = code_stage_layout(NWARP)
    LC: gl.constexpr = code_layout(WM, WN)
    LF: gl.constexpr = frag_layout(WM, WN)
    if UP:
        NW = 2 * N
    else:
        NW = N

    # A staging [(step, mb), h, l, k]: tile row 8 mb + 4 h + l is the sorted row at that position, gathered
    da, ha, la, ka = stage_index(BK // 8 * MB, LA)
    b_row = gl.load(sorted_ptr + i_b * BM + 8 * (da % MB) + 4 * ha + la)
    m_am = b_row < TK
    o_ak = 8 * (da // MB) + ka
    p_a = a_ptr + (b_row // A_DIV).to(gl.int64) * stride_am + o_ak
    # code staging [(step, nb), h, l]: qweight row k / 8 = step, column 8 nb + 4 h + l of expert i_e
    dq, hq, lq = index3(BK // 8 * NB, LQ)
    o_qn = i_n * BN + 8 * (dq % NB) + 4 * hq + lq
    o_qr = dq // NB
    m_qn = o_qn < N
    p_q = qw_ptr + i_e * (K // 8) * NW + o_qr * NW + o_qn
    # scales and zeros of the fragment columns, [NB, 2, 4] in the codes' fragment layout
    nbc, hc, lc = index3(NB, LC)
    o_cn = i_n * BN + 8 * nbc + 4 * hc + lc
    m_cn = o_cn < N
    p_s = s_ptr + i_e * (K // G) * NW + o_cn
    p_z = z_ptr + i_e * (K // G) * NW + o_cn
    # nibble index of the fragment's k dim: [1, 1, 1, 8]
    o_i = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, b_layout(WM, WN)))))
    o_i = gl.expand_dims(gl.expand_dims(gl.expand_dims(o_i, 0), 1), 2)

    s_a = gl.allocate_shared_memory(gl.float16, a_smem_shape(BM, BK), smem_layout())
    s_q = gl.allocate_shared_memory(gl.int32, [BK // 8 * NB, 2, 4], code_smem_layout())
    s_u = gl.allocate_shared_memory(gl.int32, [BK // 8 * NB, 2, 4], code_smem_layout())
    acc = gl.zeros([MB, NB, 2, 4, 8], gl.float32, layout=LF)
    acc_u = gl.zeros([MB, NB, 2, 4, 8], gl.float32, layout=LF)

    # [BK//8 * BM//8, 2, 4, 8]
    b_a = gl.load(p_a, mask=m_am & (o_ak < K), other=0.0)
    # [BK//8 * BN//8, 2, 4]: gate (or down) codes, and the up codes N columns on
    b_q = gl.load(p_q, mask=m_qn, other=0)
    b_u = b_q
    if UP:
        b_u = gl.load(p_q + N, mask=m_qn, other=0)
    for k0 in range(0, K, BK):
        s_a.store(b_a)
        s_q.store(b_q)
        if UP:
            s_u.store(b_u)
        # [NB, 2, 4, 1]: one scale row per k tile (BK <= G); zb = 1024 + z, the magic's offset folded into the zero
        b_s = gl.expand_dims(gl.load(p_s + (k0 // G) * NW, mask=m_cn, other=0.0), 3)
        b_zb = gl.expand_dims(gl.load(p_z + (k0 // G) * NW, mask=m_cn, other=0.0) + 1024.0, 3)
        b_su = b_s
        b_zu = b_zb
        if UP:
            b_su = gl.expand_dims(gl.load(p_s + (k0 // G) * NW + N, mask=m_cn, other=0.0), 3)
            b_zu = gl.expand_dims(gl.load(p_z + (k0 // G) * NW + N, mask=m_cn, other=0.0) + 1024.0, 3)
        # the next tile's loads are in flight while the tensor cores work on this one
        k1 = k0 + BK
        b_a = gl.load(p_a + k1, mask=m_am & (o_ak + k1 < K), other=0.0)
        m_q1 = m_qn & (k1 < K)
        b_q = gl.load(p_q + (k1 // 8) * NW, mask=m_q1, other=0)
        if UP:
            b_u = gl.load(p_q + (k1 // 8) * NW + N, mask=m_q1, other=0)
        for j in gl.static_range(BK // 8):
            # [MB, 1, 2, 4, 8] in the A fragment map
            f_a = gl.expand_dims(s_a.slice(j * MB, MB).load(a_layout(WM, WN)), 1)
            f_w = _dequant(gl.expand_dims(s_q.slice(j * NB, NB).load(LC), 3), o_i, b_zb, b_s)
            acc = mma884(acc, f_a, gl.expand_dims(f_w, 0))
            if UP:
                f_w = _dequant(gl.expand_dims(s_u.slice(j * NB, NB).load(LC), 3), o_i, b_zu, b_su)
                acc_u = mma884(acc_u, f_a, gl.expand_dims(f_w, 0))

    rows, cols = acc_rows_cols(BM, BN, WM, WN)
    # [MB, 1, 2, 4, 8] the flat (token, slot) id of each accumulator row; padding holds TK
    o_row = gl.load(sorted_ptr + i_b * BM + rows)
    m_row = o_row < TK
    o_yn = i_n * BN + cols
    if UP:
        # silu(g) = g / (1 + e^-g): -0 rather than NaN where e^-g overflows
        acc = acc / (1.0 + gl.exp(-acc)) * acc_u
    else:
        acc = acc * gl.load(tw_ptr + o_row, mask=m_row, other=0.0)
    gl.store(out_ptr + o_row.to(gl.int64) * N + o_yn, acc.to(out_ptr.dtype.element_ty), mask=m_row & (o_yn < N))


def hmma_moe_applies(x, w13, w2) -> bool:
    """Whether this MoE's sorted path can run on HMMA.884 (the caller asks only on the sm_70 row): fp16 activations
    and W4A16 experts with fp16 scales, groups it tiles (32/64/128), and a compiled run (the interpreter has no
    Gluon; grouped.py's tl.dot kernel is the twin there)."""
    return (not INTERPRET and x.dtype == torch.float16 and isinstance(w13, QuantizedWeight)
            and isinstance(w2, QuantizedWeight) and all(
                w.dtype == torch.float16 and w.group_size in GROUPS and w.in_features % w.group_size == 0
                and w.qweight.dim() == 3 for w in (w13, w2)))


def _check(x, w13, w2, ids, cfg: Tile884) -> None:
    if x.dtype != torch.float16 or not isinstance(w13, QuantizedWeight) or not isinstance(w2, QuantizedWeight):
        raise KernelContractError(f"the sm_70 fused MoE takes fp16 activations and W4A16 experts (sm_70 has no "
                                  f"bf16), got {x.dtype} activations and {type(w13).__name__} experts")
    t, hid = x.shape
    e, inter = w13.qweight.shape[0], w13.out_features // 2
    if (w13.qweight.dim() != 3 or w13.in_features != hid or w2.qweight.shape[0] != e or w2.in_features != inter
            or w2.out_features != hid or ids.shape[0] != t):
        raise KernelContractError(f"fused_moe_sm70: x {tuple(x.shape)}, w13 codes {tuple(w13.qweight.shape)}, "
                                  f"w2 codes {tuple(w2.qweight.shape)} and ids {tuple(ids.shape)} do not describe "
                                  f"one MoE (want [E, H//8, 2I] and [E, I//8, H] for x [T, H])")
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dtype != torch.float16:
            raise KernelContractError(f"fused_moe_sm70: {name} scales are {w.dtype}; the sm_70 path takes fp16")
        if w.group_size not in GROUPS or w.in_features % w.group_size or w.group_size % cfg.BK:
            raise KernelContractError(f"fused_moe_sm70: {name} group size {w.group_size} with K = {w.in_features}: "
                                      f"need G in 32/64/128, K % G == 0 and G % {cfg.BK} == 0")
    cfg.check()
    if not cuda_device(x.device):
        raise KernelContractError(f"fused_moe_sm70 runs on CUDA only (Gluon has no interpreter), got {x.device}")


def _gemm(a, w: QuantizedWeight, sorted_ids, block_expert, n_post, tw, out, tk, n, a_div, up, cfg: Tile884):
    qw, s, z = w.qweight.contiguous(), w.scales.contiguous(), w.zeros.contiguous()
    grid = (block_expert.numel(), triton.cdiv(n, cfg.BN))
    moe_gemm_sm70_kernel[grid](a, qw, s, z, sorted_ids, block_expert, n_post, tw, out, tk, n, w.in_features,
                               a.stride(0), A_DIV=a_div, G=w.group_size, BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, WM=cfg.WM,
                               WN=cfg.WN, UP=up, num_warps=cfg.num_warps)


def fused_moe_sm70(x, w13: QuantizedWeight, w2: QuantizedWeight, topk_weights, topk_ids,
                   config: Tile884 | None = None) -> torch.Tensor:
    """The sorted path of fused_moe on m8n8k4 (twin: ``moe.naive.fused_moe``): x [T, H] fp16 -> [T, H] fp32.
    CUDA only; ``config`` overrides the table's tile (tests)."""
    t, hid = x.shape
    top_k = topk_ids.shape[1]
    e = w13.qweight.shape[0] if isinstance(w13, QuantizedWeight) else 0
    cfg = config or pick_tile(SM70_MOE_TABLE, -(-t * top_k // max(e, 1)))
    _check(x, w13, w2, topk_ids, cfg)
    inter = w13.out_features // 2
    out = torch.empty((t, hid), dtype=torch.float32, device=x.device)
    if t == 0:
        return out
    x = x if x.stride(-1) == 1 else x.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    tw = topk_weights.to(torch.float32).contiguous()
    sorted_ids, block_expert, n_post = align_tokens(ids, e, cfg.BM)
    h = torch.empty((t * top_k, inter), dtype=torch.float16, device=x.device)
    _gemm(x, w13, sorted_ids, block_expert, n_post, tw, h, t * top_k, inter, top_k, True, cfg)
    # fp32 weighted rows: one expert's output alone can pass 65,504 (the V100 case: fp16, no bf16)
    y = torch.empty((t * top_k, hid), dtype=torch.float32, device=x.device)
    _gemm(h, w2, sorted_ids, block_expert, n_post, tw, y, t * top_k, hid, 1, False, cfg)
    combine_kernel[(t, triton.cdiv(hid, REDUCE_BLOCK))](y, ids, out, hid, TOPK=top_k, BLOCK=REDUCE_BLOCK, num_warps=4)
    return out


_SIG = {"a_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "sorted_ptr": "*i32",
        "bexp_ptr": "*i32", "npost_ptr": "*i32", "tw_ptr": "*fp32", "out_ptr": "*fp16", "TK": "i32", "N": "i32",
        "K": "i32", "stride_am": "i32", "A_DIV": "constexpr", "G": "constexpr", "BM": "constexpr", "BN": "constexpr",
        "BK": "constexpr", "WM": "constexpr", "WN": "constexpr", "UP": "constexpr"}


def aot_configs(cc: int) -> list[AotConfig]:
    """Every tile of the sm_70 table, gate_up (top-8, fp16 out) and down (fp32 out), groups 128 and 32 (model
    sizes are multiples of 16, as is the row stride of x and h)."""
    out = []
    for _, c in SM70_MOE_TABLE:
        for up in (True, False):
            for g in (128, 32):
                out.append(AotConfig("moe_gemm_sm70_kernel", {**_SIG, "out_ptr": "*fp16" if up else "*fp32"},
                                     dict(A_DIV=8 if up else 1, G=g, BM=c.BM, BN=c.BN, BK=c.BK, WM=c.WM, WN=c.WN,
                                          UP=up), c.num_warps, 1,
                                     f"moe sm70 {c.BM}x{c.BN}x{c.BK} g{g} {'up' if up else 'down'}",
                                     divisible_by_16=("N", "K", "stride_am")))
    return out
