"""Triton MoE: the routed experts (W4A16 or dense fp16/bf16 weights): the launch table and
:func:`fused_moe`, which picks a path by the number of (token, expert) rows T * top_k against the
table's row_max. The top-k softmax routing and the token alignment are in :mod:`.route`.

- decode, W4A16 experts (table entry ``decode``): :mod:`.decode`, the chosen experts cut along N and K
  into one-tile GEMV programs, two launches with in-kernel split-K reduces (the weighted combine in the
  second), the second a programmatic dependent launch on sm_90 (``decode_pdl``).
- rows (decode, dense experts; W4A16 too where ``decode`` is None): :mod:`.rows`, no sorting at all.
- sorted (prefill): rows are grouped by expert and padded to the block size BM (torch ops on the
  device, no host sync), then the grouped GEMMs run gate_up (+ SiLU) and down (+ routing weight) and
  ``combine_kernel`` sums each token's top_k rows in order: :mod:`.grouped` (``tl.dot``), or on the
  sm_70 row for fp16 W4A16 experts :mod:`.fused_sm70` (HMMA.884, Gluon), where ``tl.dot`` is FMA.

The output is fp32 on every path (the twin's contract): the weighted sum goes to the residual add
unrounded, since in an fp16 model it can pass 65,504. Expert parallelism: ids of -1 (experts another rank
holds, from ``moe_route``'s ``expert_range``) are skipped on every path, no weight read for them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ...errors import ConfigError, KernelContractError
from ..common.aot import AotConfig
from ..common.arch import INTERPRET, arch_key, device_key
from ..common.splitk import REDUCE_BLOCK, pick_split, reduce_splits, split_partials
from ..w4a16.launch import GemmConfig, GemvConfig, block_k, gemv_block_k
from ..w4a16.gemm_mma import MmaTile, pick_mma_tile
from ..w4a16.packing import QuantizedWeight
# every kernel is named here: common/aot.py looks each configuration's kernel up in this module
from .decode import decode_aot_configs, moe_decode, moe_down_decode_kernel, moe_up_decode_kernel  # noqa: F401
from .fused_mma import fused_moe_mma, mma_moe_applies, moe_gemm_mma_kernel  # noqa: F401
from .fused_sm70 import fused_moe_sm70, hmma_moe_applies
from .grouped import NIB2, combine_kernel, moe_gemm_kernel
from .route import align_tokens
from .rows import NIB, moe_down_row_kernel, moe_up_row_kernel


# ---------------------------------------------------------------- launch table
@dataclass(frozen=True)
class MoeTable:
    row_max: int                # T * top_k at or below which the row kernels run
    up_row: GemvConfig          # waves unused: the up pass cannot split K (SiLU needs the full sum)
    down_row: GemvConfig
    gemm: tuple                 # ((max rows per expert on average, GemmConfig), ...) ascending
    decode: tuple | None = None     # W4A16 rows <= row_max: (up, down) GemvConfig of moe.decode
    decode_pdl: int = 0             # programmatic dependent launch (sm_90 on): 1 the down kernel, 2 both
    # sm_70: the sorted path of fp16 W4A16 experts on HMMA.884 (fused_sm70.py, its own tiles SM70_MOE_TABLE)
    # instead of tl.dot, which Triton >= 3.3 lowers to FMA there; gemm then serves dense fp16 experts and groups
    # the HMMA kernel does not tile (16)
    hmma: bool = False
    # sm_80+: W4A16 fp16 MoE with row_max < T * top_k <= the last bound on mma.sync m16n8k16 (fused_mma.py);
    # ((max T * top_k, MmaTile), ...) ascending, () for tl.dot only
    mma: tuple = ()


# Row kernels: wide K tiles put a program's bytes in flight at once (their loads are not pipelined);
# the down pass splits the token's top_k * I rows over programs. sm_90's GEMM tiles stay under its
# 227 KB of shared memory with dense experts too (two weight tiles per stage in the gate_up pass).
# The sm_90 choices come from bench/bench_gemm.py --sweep on an H200. W4A16 decode (bench_moe.py --sweep): the
# dense GEMV's 64 x 512 tile in both passes, split toward 16 waves, the down kernel a programmatic
# dependent launch: 12.8 us for one token against 15.5 for the row kernels (decode=None). Unsplit
# passes (16 columns x all of K a program, the down pass as one tile of all top_k experts' rows)
# measured 16.7-21.4 us (sm_70/sm_80 take the tiles unmeasured, without PDL, which needs sm_90).
# sm_90's mma tile: 4 warps (256 columns a program) against 2 at 5 / 8 / 16 / 32 / 64 tokens of the 35B-A3B's experts:
# 50.5 / 62.8 / 101 / 135 / 177 us against 53.8 / 67.8 / 103 / 148 / 179 (H100, session 15, fused_moe_mma timed alone
# in graphs of 16 calls; 1 warp and 32-token blocks were slower from 8 tokens on; bench/NOTES.md). sm_80 keeps 2
# warps, unmeasured. sm_90's row_max is 64 where the others keep 32: bench_moe.py --row-max (H100, session 23) timed the
# decode GEMV ahead of the mma path at 5 / 6 / 8 tokens of the 35B-A3B (38.5 / 42.6 / 54.2 us against 47.1 / 48.9 /
# 56.6), level at 12 and behind at 16 (87.5 against 73.9).
_DECODE = (GemvConfig(64, 512, 4, 1, 16), GemvConfig(64, 512, 4, 1, 16))
TABLES = {
    "sm70": MoeTable(32, GemvConfig(16, 512, 4, 1, 1), GemvConfig(32, 512, 4, 1, 4), (
        (16, GemmConfig(16, 64, 64, 4, 1)),
        (1 << 30, GemmConfig(64, 64, 32, 4, 2)),
    ), _DECODE, hmma=True),
    "sm80": MoeTable(32, GemvConfig(16, 512, 4, 1, 1), GemvConfig(32, 512, 4, 1, 4), (
        (16, GemmConfig(16, 64, 64, 4, 3)),
        (64, GemmConfig(64, 64, 64, 4, 3)),
        (1 << 30, GemmConfig(128, 128, 32, 8, 3)),
    ), _DECODE, mma=((2048, MmaTile(1, 2)),)),
    "sm90": MoeTable(64, GemvConfig(16, 1024, 4, 1, 1), GemvConfig(32, 512, 4, 1, 2), (
        (16, GemmConfig(16, 64, 64, 4, 4)),
        (64, GemmConfig(64, 128, 64, 4, 3)),
        (1 << 30, GemmConfig(128, 128, 64, 8, 3)),
    ), _DECODE, decode_pdl=1, mma=((2048, MmaTile(1, 4)),)),
}


def _dense_bk(bk: int, k: int) -> int:
    """The down pass's K-blocks must not straddle two experts: BK divides I."""
    bk = gemv_block_k(bk, k)
    if bk < 8:
        raise ConfigError(f"fused_moe: expert intermediate size {k} must be a multiple of 8")
    return bk


def _weights(w, quant: bool):
    if quant:
        return w.qweight.contiguous(), w.scales.contiguous(), w.zeros.contiguous(), w.group_size
    w = w.contiguous()
    return w, w, w, 1


def fused_moe(x, w13, w2, topk_weights, topk_ids):
    """Triton twin of :func:`catengine.kernels.moe.naive.fused_moe`."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ConfigError(f"fused_moe runs fp16/bf16 activations on CUDA, got {x.dtype}; "
                          "load the model with dtype float16 or bfloat16")
    quant = isinstance(w13, QuantizedWeight)
    if quant != isinstance(w2, QuantizedWeight):
        raise KernelContractError("fused_moe: w13 and w2 must both be QuantizedWeight or both dense tensors")
    t, hid = x.shape
    top_k = topk_ids.shape[1]
    if quant:
        e, inter = w13.qweight.shape[0], w13.out_features // 2
    else:
        e, inter = w13.shape[0], w13.shape[1] // 2
    # fp32 out: the twin's contract (the weighted sum, unrounded, goes to the residual add)
    out = torch.empty((t, hid), dtype=torch.float32, device=x.device)
    if t == 0:
        return out
    x = x if x.stride(-1) == 1 else x.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    tw = topk_weights.to(torch.float32).contiguous()
    w13_q, w13_s, w13_z, g13 = _weights(w13, quant)
    w2_q, w2_s, w2_z, g2 = _weights(w2, quant)
    key, sms = device_key(x.device)
    table = TABLES[key]
    if quant and t * top_k <= table.row_max and table.decode is not None:
        return moe_decode(x, w13, w2, tw, ids, *table.decode, sms, table.row_max, table.decode_pdl)
    h = torch.empty((t * top_k, inter), dtype=x.dtype, device=x.device)
    if t * top_k <= table.row_max:
        c = table.up_row
        bk = gemv_block_k(c.BK, hid) if quant else c.BK
        moe_up_row_kernel[(triton.cdiv(inter, c.BN), t * top_k)](
            x, w13_q, w13_s, w13_z, ids, h, hid, inter, x.stride(0), NIB, TOPK=top_k, G=g13, BN=c.BN,
            BK=bk, QUANT=quant, num_warps=c.num_warps, num_stages=c.num_stages)
        c = table.down_row
        bk = _dense_bk(c.BK, inter)
        split = pick_split(triton.cdiv(hid, c.BN) * t, top_k * inter // bk, c.waves, sms)
        part = split_partials(split, out)
        moe_down_row_kernel[(triton.cdiv(hid, c.BN), t, split)](
            h, w2_q, w2_s, w2_z, ids, tw, out, part, t, hid, inter, NIB, TOPK=top_k,
            KP=triton.next_power_of_2(top_k), G=g2, BN=c.BN,
            BK=bk, SPLIT_K=split, QUANT=quant, STAGES=c.num_stages, num_warps=c.num_warps,
            num_stages=c.num_stages)
        return reduce_splits(part, None, out, split)
    if table.hmma and hmma_moe_applies(x, w13, w2):
        return fused_moe_sm70(x, w13, w2, tw, ids)
    tile = pick_mma_tile(table.mma, t * top_k)
    if tile is not None and not INTERPRET and mma_moe_applies(x, w13, w2):
        return fused_moe_mma(x, w13, w2, tw, ids, tile)
    c = next(cfg for max_rows, cfg in table.gemm if t * top_k <= max_rows * e)
    sorted_ids, block_expert, n_post = align_tokens(ids, e, c.BM)
    grid_b = block_expert.numel()
    bk13 = block_k(c.BK, g13, hid) if quant else c.BK
    moe_gemm_kernel[(grid_b, triton.cdiv(inter, c.BN))](
        x, w13_q, w13_s, w13_z, sorted_ids, block_expert, n_post, tw, h, t * top_k, inter, hid,
        x.stride(0), NIB2, A_DIV=top_k, G=g13, BM=c.BM, BN=c.BN, BK=bk13, QUANT=quant, UP=True,
        INTERPRET=INTERPRET, num_warps=c.num_warps, num_stages=c.num_stages)
    # each row's weighted expert output: fp32 for fp16 activations (one expert's output alone can pass
    # 65,504), the activation dtype for bf16 (its range is fp32's; half the bytes of this scratch)
    y = torch.empty((t * top_k, hid), dtype=torch.float32 if x.dtype == torch.float16 else x.dtype, device=x.device)
    bk2 = block_k(c.BK, g2, inter) if quant else c.BK
    moe_gemm_kernel[(grid_b, triton.cdiv(hid, c.BN))](
        h, w2_q, w2_s, w2_z, sorted_ids, block_expert, n_post, tw, y, t * top_k, hid, inter,
        h.stride(0), NIB2, A_DIV=1, G=g2, BM=c.BM, BN=c.BN, BK=bk2, QUANT=quant, UP=False,
        INTERPRET=INTERPRET, num_warps=c.num_warps, num_stages=c.num_stages)
    combine_kernel[(t, triton.cdiv(hid, REDUCE_BLOCK))](y, ids, out, hid, TOPK=top_k, BLOCK=REDUCE_BLOCK,
                                                          num_warps=4)
    return out




# ---------------------------------------------------------------- ahead-of-time list
_ARGS = {
    "moe_up_row_kernel": "x_ptr w_ptr s_ptr z_ptr id_ptr h_ptr H I stride_xm nib TOPK G BN BK QUANT",
    "moe_down_row_kernel": "h_ptr w_ptr s_ptr z_ptr id_ptr tw_ptr y_ptr part_ptr T H I nib TOPK KP G BN BK SPLIT_K "
                            "QUANT STAGES",
    "moe_gemm_kernel": "a_ptr w_ptr s_ptr z_ptr sorted_ptr bexp_ptr npost_ptr tw_ptr out_ptr TK N K stride_am nib2 "
                        "A_DIV G BM BN BK QUANT UP INTERPRET",
    "combine_kernel": "y_ptr id_ptr out_ptr H TOPK BLOCK",
}


def _cfg(kernel, types, consts, warps, stages, name):
    """Pointer and size types from ``types``; other lower-case names are i32, the rest constexpr."""
    sig = {a: types.get(a, "i32" if a.islower() else "constexpr") for a in _ARGS[kernel].split()}
    return AotConfig(kernel, sig, consts, warps, stages, name)


def aot_configs(cc: int) -> list[AotConfig]:
    """The table's configurations for Qwen3.6-35B-A3B's shapes (top-8, group 128), quantised and
    dense experts, each activation dtype the architecture has (no bf16 before sm_80)."""
    table = TABLES[arch_key(cc)]
    out = []
    for dt in ("fp16",) + (("bf16",) if cc >= 80 else ()):
        for quant in (True, False):
            ty = {p: f"*{dt}" for p in ("x_ptr", "h_ptr", "a_ptr", "y_ptr", "out_ptr", "s_ptr", "z_ptr")}
            ty.update({p: "*i32" for p in ("id_ptr", "sorted_ptr", "bexp_ptr", "npost_ptr")})
            # y_ptr: the row down kernel's output, fp32 (fused_moe returns the unrounded sum)
            ty.update(w_ptr="*i32" if quant else f"*{dt}", tw_ptr="*fp32", part_ptr="*fp32", y_ptr="*fp32",
                      H="i32", I="i32",
                      T="i32", TK="i32", N="i32", K="i32")
            tag = f"{dt} {'w4' if quant else 'dense'}"
            c = table.up_row
            out.append(_cfg("moe_up_row_kernel", ty, dict(TOPK=8, G=128, BN=c.BN, BK=c.BK, QUANT=quant),
                            c.num_warps, c.num_stages, f"up_row {tag}"))
            c = table.down_row
            out += [_cfg("moe_down_row_kernel", ty, dict(TOPK=8, KP=8, G=128, BN=c.BN, BK=c.BK, SPLIT_K=split,
                                                          QUANT=quant, STAGES=c.num_stages), c.num_warps, c.num_stages,
                         f"down_row {tag} split{split}") for split in (1, 4)]
            # the down pass's out_ptr is the weighted rows y: fp32 for fp16 (see fused_moe)
            ty_down = {**ty, "out_ptr": "*fp32" if dt == "fp16" else f"*{dt}"}
            out += [_cfg("moe_gemm_kernel", ty if up else ty_down, dict(A_DIV=8 if up else 1, G=128, BM=c.BM,
                                                                         BN=c.BN, BK=c.BK, QUANT=quant, UP=up,
                                                                         INTERPRET=False), c.num_warps,
                         c.num_stages, f"gemm rows<={max_rows} {tag} {'up' if up else 'down'}")
                    for max_rows, c in table.gemm for up in (True, False)]
        ty = {"logit_ptr": f"*{dt}", "w_ptr": "*fp32", "id_ptr": "*i32", "T": "i32", "E": "i32", "H": "i32",
              "y_ptr": "*fp32" if dt == "fp16" else f"*{dt}", "out_ptr": "*fp32"}
        out.append(_cfg("combine_kernel", ty, dict(TOPK=8, BLOCK=REDUCE_BLOCK), 4, 1, f"combine {dt}"))
    if table.decode is not None:
        out += decode_aot_configs(cc, *table.decode, table.decode_pdl)
    return out

