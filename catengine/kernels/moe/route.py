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
ALIGN_MAX_ROWS = 4096   # flat (token, slot) rows the one-program kernel sorts in registers; more: the twin


@triton.jit
def _align_kernel(id_ptr, sorted_ptr, bexp_ptr, npost_ptr, scratch_ptr, TK, E, MAX_BLOCKS, BLOCK: tl.constexpr,
                  BT: tl.constexpr, BE: tl.constexpr, BB: tl.constexpr):
    # one program: sort (expert, flat index) keys in registers, find each expert's run in the sorted order
    # through a small scratch (a register vector cannot be indexed by another), pad each run to BLOCK.
    # Scratch: run start [BE], run end [BE], sorted experts [BT], destination offset [BE]
    o_t = tl.arange(0, BT)
    o_e = tl.arange(0, BE)
    m_t = o_t < TK
    b_id = tl.load(id_ptr + o_t, mask=m_t, other=0).to(tl.int32)
    # expert-major, flat index minor: the twin's stable argsort; rows past TK, and rows of experts other
    # ranks hold (id -1, expert parallelism), sort last as expert E and are dropped
    b_key = tl.sort(tl.where(m_t & (b_id >= 0), b_id, E) * BT + o_t, 0)
    s_e, s_i = b_key // BT, b_key % BT
    m_real = s_e < E
    p_start, p_end, p_se, p_off = scratch_ptr, scratch_ptr + BE, scratch_ptr + 2 * BE, scratch_ptr + 2 * BE + BT
    tl.store(p_start + o_e, tl.zeros([BE], tl.int32))
    tl.store(p_end + o_e, tl.zeros([BE], tl.int32))
    tl.store(p_se + o_t, s_e)
    tl.debug_barrier()
    b_prev = tl.load(p_se + o_t - 1, mask=o_t > 0, other=-1)
    b_next = tl.load(p_se + o_t + 1, mask=o_t + 1 < BT, other=-1)
    tl.store(p_start + s_e, o_t, mask=m_real & (b_prev != s_e))
    tl.store(p_end + s_e, o_t + 1, mask=m_real & (b_next != s_e))
    tl.debug_barrier()
    b_start = tl.load(p_start + o_e)
    b_blocks = (tl.load(p_end + o_e) - b_start + BLOCK - 1) // BLOCK     # 0 for absent experts (0 - 0)
    b_blk_end = tl.cumsum(b_blocks, 0)
    # sorted position i of expert e goes to e's padded start + (i - e's run start)
    tl.store(p_off + o_e, (b_blk_end - b_blocks) * BLOCK - b_start)
    for p0 in range(0, MAX_BLOCKS * BLOCK, BT):
        tl.store(sorted_ptr + p0 + o_t, tl.zeros([BT], tl.int32) + TK, mask=p0 + o_t < MAX_BLOCKS * BLOCK)
    tl.debug_barrier()
    b_dest = o_t + tl.load(p_off + s_e, mask=m_real, other=0)
    tl.store(sorted_ptr + b_dest, s_i, mask=m_real)
    # block b belongs to the number of experts whose padded run ends at or before it (searchsorted, right)
    for b0 in range(0, MAX_BLOCKS, BB):
        o_b = b0 + tl.arange(0, BB)
        b_be = tl.sum(((b_blk_end[None, :] <= o_b[:, None]) & (o_e[None, :] < E)).to(tl.int32), 1)
        tl.store(bexp_ptr + o_b, tl.where(b_be < E, b_be, -1), mask=o_b < MAX_BLOCKS)
    tl.store(npost_ptr, tl.sum(b_blocks, 0) * BLOCK)


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
    scratch = torch.empty(3 * be + bt, dtype=torch.int32, device=dev)
    _align_kernel[(1,)](flat, sorted_ids, block_expert, n_post, scratch, tk, num_experts, max_blocks, BLOCK=block,
                        BT=bt, BE=be, BB=64, num_warps=4 if bt <= 1024 else 8)
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
    for bt, warps in ((64, 4), (2048, 8)):   # 8 tokens and 256 tokens of top-8
        sig = {"id_ptr": "*i32", "sorted_ptr": "*i32", "bexp_ptr": "*i32", "npost_ptr": "*i32", "scratch_ptr": "*i32",
               "TK": "i32", "E": "i32", "MAX_BLOCKS": "i32", "BLOCK": "constexpr", "BT": "constexpr",
               "BE": "constexpr", "BB": "constexpr"}
        out.append(AotConfig("_align_kernel", sig, dict(BLOCK=16, BT=bt, BE=256, BB=64), warps, 1, f"align BT{bt}"))
    return out
