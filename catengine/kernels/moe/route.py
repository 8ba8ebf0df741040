"""Triton MoE routing (twin: ``moe.naive.moe_route``) and the expert-sorted token alignment that the
prefill path of :mod:`catengine.kernels.moe.fused` runs on; split from that module.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import ConfigError
from ..common.aot import AotConfig


# ---------------------------------------------------------------- routing
@triton.jit
def _route_kernel(logit_ptr, w_ptr, id_ptr, T, E, stride_t, TOPK: tl.constexpr, BT: tl.constexpr,
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
    m_out = m_t[:, None] & (o_j[None, :] < TOPK)
    tl.store(w_ptr + o_t[:, None] * TOPK + o_j[None, :], b_w, mask=m_out)
    tl.store(id_ptr + o_t[:, None] * TOPK + o_j[None, :], b_i, mask=m_out)


def moe_route(router_logits, top_k: int, renormalize: bool = True):
    """Triton twin of :func:`catengine.kernels.moe.naive.moe_route`."""
    t, e = router_logits.shape
    if not 0 < top_k <= e:
        raise ConfigError(f"moe_route: top_k={top_k} must be in 1..{e} (the number of experts)")
    w = torch.empty((t, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=router_logits.device)
    if t:
        logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
        # a token per one-warp program, so the top_k row reductions need no shared memory or barriers:
        # 3.4 us a call for one token on the H200 (bench_moe.py, 16 calls in one CUDA graph; a graph of
        # a single call measured 17.6 us, the graph launch included)
        bt = 1
        _route_kernel[(triton.cdiv(t, bt),)](logits, w, ids, t, e, logits.stride(0), TOPK=top_k, BT=bt,
                                             BE=triton.next_power_of_2(e), KP=triton.next_power_of_2(top_k),
                                             RENORM=renormalize, num_warps=1)
    return w, ids


def align_tokens(topk_ids, num_experts: int, block: int):
    """Sort (token, slot) rows by expert, each expert's run padded to a multiple of ``block``.

    Returns (sorted_ids [max_blocks * block] int32 holding flat ids t * top_k + j, padding = T * top_k;
    block_expert [max_blocks] int32, -1 past the end; n_post [1] int32, the padded length). Sizes are
    upper bounds known on the host, so nothing waits for the device."""
    flat = topk_ids.reshape(-1).long()
    tk = flat.numel()
    dev = flat.device
    # scatter_add rather than bincount: bincount reads the maximum back to the host (a sync that
    # also breaks CUDA graph capture)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    blocks = (counts + block - 1) // block
    blk_end = blocks.cumsum(0)
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    rank = torch.arange(tk, device=dev) - (counts.cumsum(0) - counts)[sorted_e]
    dest = (blk_end - blocks)[sorted_e] * block + rank
    max_blocks = triton.cdiv(tk, block) + min(num_experts, tk)
    sorted_ids = torch.full((max_blocks * block,), tk, dtype=torch.int32, device=dev)
    sorted_ids[dest] = order.to(torch.int32)
    be = torch.searchsorted(blk_end, torch.arange(max_blocks, device=dev), right=True)
    block_expert = torch.where(be < num_experts, be, -1).to(torch.int32)
    n_post = (blk_end[-1:] * block).to(torch.int32)
    return sorted_ids, block_expert, n_post




# ---------------------------------------------------------------- ahead-of-time list
_ROUTE_ARGS = "logit_ptr w_ptr id_ptr T E stride_t TOPK BT BE KP RENORM"


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
    return out
