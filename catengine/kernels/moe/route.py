"""Triton MoE routing (twin: ``moe.naive.moe_route``) and the expert-sorted token alignment that the
prefill path of :mod:`catengine.kernels.moe.fused` runs on (twin: ``moe.naive.align_tokens``); split from
that module.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import ConfigError
from ..common.aot import AotConfig


# ---------------------------------------------------------------- routing
@triton.jit
def _route_kernel(logit_ptr, w_ptr, id_ptr, T, E, stride_t, lo, hi, TOPK: tl.constexpr, BT: tl.constexpr,
                  BE: tl.constexpr, KP: tl.constexpr, RENORM: tl.constexpr):
    i_t = tl.program_id(0)
    o_t = i_t * BT + tl.arange(0, BT)
    o_e = tl.arange(0, BE)
    o_j = tl.arange(0, KP)
    m_t = o_t < T
    # [BT, BE]; rows past T repeat the last row so that no row is all -inf (NaN)
    b_l = tl.load(logit_ptr + tl.minimum(o_t, T - 1)[:, None] * stride_t + o_e[None, :], mask=o_e[None, :] < E,
                  other=float("-inf")).to(tl.float32)
    b_p = tl.exp(b_l - tl.max(b_l, axis=1)[:, None])
    b_p = b_p / tl.sum(b_p, axis=1)[:, None]
    b_w = tl.zeros([BT, KP], tl.float32)
    b_i = tl.zeros([BT, KP], tl.int32)
    for j in tl.static_range(TOPK):
        # one reduction for value and first index of the maximum (torch.topk's order for ties)
        p_max, i_max = tl.max(b_p, axis=1, return_indices=True, return_indices_tie_break_left=True)
        b_w = tl.where(o_j[None, :] == j, p_max[:, None], b_w)
        b_i = tl.where(o_j[None, :] == j, i_max[:, None], b_i)
        b_p = tl.where(o_e[None, :] == i_max[:, None], -1.0, b_p)
    if RENORM:
        b_w = b_w / tl.sum(b_w, axis=1)[:, None]
    # expert parallelism: local ids, -1 for experts of other ranks (lo, hi = 0, E: all local)
    b_i = tl.where((b_i >= lo) & (b_i < hi), b_i - lo, -1)
    m_out = m_t[:, None] & (o_j[None, :] < TOPK)
    tl.store(w_ptr + o_t[:, None] * TOPK + o_j[None, :], b_w, mask=m_out)
    tl.store(id_ptr + o_t[:, None] * TOPK + o_j[None, :], b_i, mask=m_out)


def moe_route(router_logits, top_k: int, renormalize: bool = True, expert_range: tuple[int, int] | None = None):
    """Triton twin of :func:`catengine.kernels.moe.naive.moe_route`."""
    t, e = router_logits.shape
    if not 0 < top_k <= e:
        raise ConfigError(f"moe_route: top_k={top_k} must be in 1..{e} (the number of experts)")
    lo, hi = expert_range if expert_range is not None else (0, e)
    if not 0 <= lo < hi <= e:
        raise ConfigError(f"moe_route: expert_range {expert_range} must lie within 0..{e} (the number of experts)")
    w = torch.empty((t, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=router_logits.device)
    if t:
        logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
        # a token per one-warp program, so the top_k row reductions need no shared memory or barriers:
        # 3.4 us a call for one token on the H200 (bench_moe.py, 16 calls in one CUDA graph; a graph of
        # a single call measured 17.6 us, the graph launch included)
        bt = 1
        _route_kernel[(triton.cdiv(t, bt),)](logits, w, ids, t, e, logits.stride(0), lo, hi, TOPK=top_k, BT=bt,
                                             BE=triton.next_power_of_2(e), KP=triton.next_power_of_2(top_k),
                                             RENORM=renormalize, num_warps=1)
    return w, ids


# ---------------------------------------------------------------- expert-sorted alignment
ALIGN_MAX_ROWS = 4096   # flat (token, slot) rows each program of the kernel holds in registers; more: the twin


def align_warps(bt: int) -> int:
    """Warps of an alignment program holding ``bt`` ids: 1 up to 128, 2 at 256, 4 beyond (the fastest at 40-2,048 ids
    of the 35B-A3B's 256 experts on an H100; bench/NOTES.md, session 17)."""
    return 1 if bt <= 128 else 2 if bt <= 256 else 4


@triton.jit
def _align_kernel(id_ptr, sorted_ptr, bexp_ptr, npost_ptr, TK, E, MAX_BLOCKS, BLOCK: tl.constexpr, PB: tl.constexpr,
                  BT: tl.constexpr, BE: tl.constexpr, CH: tl.constexpr):
    # a program per expert, and one more for the tail past the last block: each reads every id, counts all
    # experts (a histogram) to find where its own padded run starts, and writes that run in flat order (the
    # twin's stable sort) with its padding and block entries. No sort, scratch or barrier: the programs run side
    # by side.
    i_e = tl.program_id(0)
    o_t = tl.arange(0, BT)
    o_e = tl.arange(0, BE)
    b_id = tl.load(id_ptr + o_t, mask=o_t < TK, other=-1).to(tl.int32)
    # rows past TK and rows of experts other ranks hold (id -1, expert parallelism) count nowhere
    m_v = (o_t < TK) & (b_id >= 0)
    b_cnt = tl.histogram(tl.where(m_v, b_id, 0), BE, mask=m_v)
    b_blocks = (b_cnt + BLOCK - 1) // BLOCK                      # [BE], 0 for absent experts
    b_blk_end = tl.cumsum(b_blocks, 0)
    if i_e < E:
        m_e = m_v & (b_id == i_e)
        n_rows = tl.sum(m_e.to(tl.int32), 0)
        if n_rows > 0:
            n_blk = (n_rows + BLOCK - 1) // BLOCK
            i_start = tl.sum(tl.where(o_e == i_e, b_blk_end, 0), 0) - n_blk
            p_run = sorted_ptr + i_start * BLOCK
            # rank within the expert = how many of its rows come before, in flat order
            tl.store(p_run + tl.cumsum(m_e.to(tl.int32), 0) - 1, o_t, mask=m_e)
            o_p = n_rows + tl.arange(0, PB)
            tl.store(p_run + o_p, tl.zeros([PB], tl.int32) + TK, mask=o_p < n_blk * BLOCK)
            for j0 in range(0, n_blk, CH):
                o_j = j0 + tl.arange(0, CH)
                tl.store(bexp_ptr + i_start + o_j, tl.zeros([CH], tl.int32) + i_e, mask=o_j < n_blk)
    else:
        # the tail: blocks past the last expert's run hold no expert, their rows are padding
        n_total = tl.sum(b_blocks, 0)
        for b0 in range(n_total, MAX_BLOCKS, CH):
            o_b = b0 + tl.arange(0, CH)
            tl.store(bexp_ptr + o_b, tl.zeros([CH], tl.int32) - 1, mask=o_b < MAX_BLOCKS)
        for p0 in range(n_total * BLOCK, MAX_BLOCKS * BLOCK, CH):
            o_p = p0 + tl.arange(0, CH)
            tl.store(sorted_ptr + o_p, tl.zeros([CH], tl.int32) + TK, mask=o_p < MAX_BLOCKS * BLOCK)
        tl.store(npost_ptr, n_total * BLOCK)


def align_tokens(topk_ids, num_experts: int, block: int):
    """Triton twin of :func:`catengine.kernels.moe.naive.align_tokens` (same signature and results): one
    launch (and no host sync), so a CUDA graph captures it; above ALIGN_MAX_ROWS rows (long prefills, where
    the grouped GEMMs dwarf the routing) the twin's torch ops run instead. Ids of -1 (other ranks' experts)
    are left out."""
    tk = topk_ids.numel()
    if tk > ALIGN_MAX_ROWS or tk == 0:
        from .naive import align_tokens as twin
        return twin(topk_ids, num_experts, block)
    flat = topk_ids.reshape(-1)
    flat = flat if flat.dtype == torch.int32 else flat.to(torch.int32)
    dev = flat.device
    max_blocks = triton.cdiv(tk, block) + min(num_experts, tk)
    bt, be = max(16, triton.next_power_of_2(tk)), max(16, triton.next_power_of_2(num_experts))
    sorted_ids = torch.empty(max_blocks * block, dtype=torch.int32, device=dev)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    n_post = torch.empty(1, dtype=torch.int32, device=dev)
    _align_kernel[(num_experts + 1,)](flat, sorted_ids, block_expert, n_post, tk, num_experts, max_blocks,
                                      BLOCK=block, PB=triton.next_power_of_2(block), BT=bt, BE=be, CH=256,
                                      num_warps=align_warps(bt))
    return sorted_ids, block_expert, n_post


# ---------------------------------------------------------------- ahead-of-time list
_ROUTE_ARGS = "logit_ptr w_ptr id_ptr T E stride_t lo hi TOPK BT BE KP RENORM"


def aot_configs(cc: int) -> list[AotConfig]:
    """The router at Qwen3.6-35B-A3B's shape (top-8 of 256 experts), each activation dtype the
    architecture has (no bf16 before sm_80)."""
    out = []
    for dt in ("fp16",) + (("bf16",) if cc >= 80 else ()):
        ty = {"logit_ptr": f"*{dt}", "w_ptr": "*fp32", "id_ptr": "*i32", "T": "i32", "E": "i32"}
        # pointer and size types from ty; other lower-case names are i32, the rest constexpr
        sig = {a: ty.get(a, "i32" if a.islower() else "constexpr") for a in _ROUTE_ARGS.split()}
        out.append(AotConfig("_route_kernel", sig, dict(TOPK=8, BT=1, BE=256, KP=8, RENORM=True), 1, 1,
                             f"route {dt}"))
    for bt in (64, 256, 2048):   # 8, 32 and 256 tokens of top-8
        sig = {"id_ptr": "*i32", "sorted_ptr": "*i32", "bexp_ptr": "*i32", "npost_ptr": "*i32", "TK": "i32",
               "E": "i32", "MAX_BLOCKS": "i32", "BLOCK": "constexpr", "PB": "constexpr", "BT": "constexpr",
               "BE": "constexpr", "CH": "constexpr"}
        out.append(AotConfig("_align_kernel", sig, dict(BLOCK=16, PB=16, BT=bt, BE=256, CH=256), align_warps(bt), 1,
                             f"align BT{bt}"))
    return out
