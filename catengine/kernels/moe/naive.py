"""Torch twins of the MoE family: routing and the routed experts; the oracle in tests and the
engine's CPU path.

Each function has exactly the signature of the Triton implementation that replaces it on CUDA
(``catengine.kernels.ops`` picks one or the other); shapes use the letters of the package docstring
(:mod:`catengine.kernels`). Unless said otherwise, outputs have the dtype of the main input and math is
done in fp32.
"""
from __future__ import annotations

import torch

from ..norm.naive import silu_mul
from ..w4a16.packing import QuantizedWeight, dequantize


def moe_route(router_logits, top_k: int, renormalize: bool = True, expert_range: tuple[int, int] | None = None):
    """Softmax over all experts in fp32, top-k, optional renormalisation of the chosen weights.
    router_logits: [T, E] -> (topk_weights fp32 [T, k], topk_ids int32 [T, k]).

    ``expert_range`` (lo, hi), expert parallelism: this rank holds experts lo..hi-1 only. The choice and
    the weights are the whole model's; ids come back local (id - lo), and -1 for an expert held elsewhere,
    which :func:`fused_moe` skips."""
    probs = router_logits.float().softmax(-1)
    w, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    if expert_range is not None:
        lo, hi = expert_range
        ids = torch.where((ids >= lo) & (ids < hi), ids - lo, -1)
    return w, ids.to(torch.int32)


def _expert_matrix(w, e: int, dtype):
    """Expert e's weight in x @ W layout [in, out]: dense experts are stored torch-style [out, in]."""
    if isinstance(w, QuantizedWeight):
        return dequantize(QuantizedWeight(w.qweight[e], w.scales[e], w.zeros[e], w.group_size), dtype)
    return w[e].to(dtype).t()


def fused_moe(x, w13, w2, topk_weights, topk_ids):
    """Routed experts: sum_j topk_weights[t, j] * down(silu(gate x) * up x) of expert topk_ids[t, j].

    x: [T, H]; w13: dense [E, 2I, H] (gate rows first) or QuantizedWeight [E, H//8, 2I];
    w2: dense [E, H, I] or QuantizedWeight [E, I//8, H]. Returns [T, H] fp32: the weighted sum is
    never rounded to x.dtype (in fp16 it can outgrow 65,504; the model adds it to an fp32 residual).
    An id of -1 (an expert another rank holds, see :func:`moe_route`) contributes nothing.
    """
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    for e in ids.unique().tolist():
        if e < 0:
            continue
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = x[tok].float() @ _expert_matrix(w13, e, torch.float32)
        h = silu_mul(h)
        y = h @ _expert_matrix(w2, e, torch.float32)
        out.index_add_(0, tok, y * topk_weights[tok, slot, None].float())
    return out


def align_tokens(topk_ids, num_experts: int, block: int):
    """Sort (token, slot) rows by expert, each expert's run padded to a multiple of ``block``.

    Returns (sorted_ids [max_blocks * block] int32 holding flat ids t * top_k + j, in flat order within each
    expert, padding = T * top_k; block_expert [max_blocks] int32, -1 past the end; n_post [1] int32, the
    padded length), max_blocks = ceil(T * top_k / block) + min(E, T * top_k). Sizes are upper bounds known
    on the host, so nothing waits for the device. Rows of id -1 (experts held by another rank) are left
    out, as if they were not there."""
    flat = topk_ids.reshape(-1).long()
    tk = flat.numel()
    dev = flat.device
    # rows of other ranks' experts sort last, as a bin E that gets no blocks
    key = torch.where(flat >= 0, flat, num_experts)
    # scatter_add rather than bincount: bincount reads the maximum back to the host (a sync that
    # also breaks CUDA graph capture)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))
    blocks = (counts + block - 1) // block
    # zero_() on a view, not `blocks[E] = 0`: assigning a Python number copies it from host memory, a sync per MoE
    # layer that left the GPU idle between launches in long prefills (bench/NOTES.md, session 24)
    blocks[num_experts:].zero_()
    blk_end = blocks.cumsum(0)
    order = torch.argsort(key, stable=True)
    sorted_e = key[order]
    rank = torch.arange(tk, device=dev) - (counts.cumsum(0) - counts)[sorted_e]
    dest = (blk_end - blocks)[sorted_e] * block + rank
    max_blocks = -(-tk // block) + min(num_experts, tk)
    sorted_ids = torch.full((max_blocks * block + 1,), tk, dtype=torch.int32, device=dev)
    # other ranks' rows all go to the spare last element, dropped below
    sorted_ids[torch.where(sorted_e < num_experts, dest, max_blocks * block)] = order.to(torch.int32)
    sorted_ids = sorted_ids[:-1]
    be = torch.searchsorted(blk_end[:num_experts].contiguous(), torch.arange(max_blocks, device=dev), right=True)
    block_expert = torch.where(be < num_experts, be, -1).to(torch.int32)
    n_post = (blk_end[-1:] * block).to(torch.int32)
    return sorted_ids, block_expert, n_post


def shared_expert_add(routed, gate_logit, shared):
    """The MoE block's output: the routed sum plus the shared expert gated by the sigmoid of its logit, in fp32.
    routed: [T, H] fp32 (fused_moe's), gate_logit: [T, 1] (any strides), shared: [T, H] -> [T, H] fp32."""
    return torch.addcmul(routed, torch.sigmoid(gate_logit.float()), shared.float())
