"""Torch twin of the sampler (and the counter-based uniforms it draws from); the oracle in tests and
the engine's CPU path.

Each function has exactly the signature of the Triton implementation that replaces it on CUDA
(``catengine.kernels.ops`` picks one or the other); shapes use the letters of the package docstring
(:mod:`catengine.kernels`). Unless said otherwise, outputs have the dtype of the main input and math is
done in fp32.
"""
from __future__ import annotations

import torch


_MASK32 = 0xFFFFFFFF


def _hash32(x):
    """lowbias32 integer hash on uint32 values held in int64 tensors."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def sampling_uniforms(seeds, steps, vocab_size: int):
    """Counter-based uniforms in (0, 1): [B, V] fp32, a pure function of (seed, step, token id), so a
    request samples the same tokens whatever batch it is in, and the Triton sampler reproduces them
    bit for bit. key = h(h(seed_lo ^ h(seed_hi + 0x9E3779B9)) ^ step); r = h(key + v * 0x9E3779B9);
    u = ((r >> 8) + 0.5) / 2^24."""
    seeds, steps = seeds.to(torch.int64), steps.to(torch.int64)
    key = _hash32((seeds & _MASK32) ^ _hash32(((seeds >> 32) & _MASK32) + 0x9E3779B9))
    key = _hash32(key ^ (steps & _MASK32))
    v = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    r = _hash32(key[:, None] + ((v * 0x9E3779B9) & _MASK32)[None, :])
    return ((r >> 8).to(torch.float32) + 0.5) / 16777216.0


def sample_tokens(logits, temperature, top_k, top_p, min_p, seeds, steps):
    """Sample one token per row with per-row parameters.

    logits: [B, V] fp32 (penalties and logit_bias already applied); temperature [B] fp32 (0 =
    greedy: argmax, first index on ties); top_k [B] int32 (<= 0 = off); top_p [B] fp32 (1 = off);
    min_p [B] fp32 (0 = off); seeds, steps [B] int64 select the random stream
    (:func:`sampling_uniforms`). Filters apply in that order on p = softmax(logits / T): top-k, then
    top-p (smallest set of most likely tokens whose mass reaches top_p), then min-p (p >= min_p *
    max p). Among kept tokens the sample is argmax(p / -log(u)), an exact draw from the
    renormalised distribution. Returns [B] int64.
    """
    # Only the rows that sample pay for a softmax, and only those with top-k or top-p for the sort:
    # on CPU a batch of greedy rows with one sampled row used to sort the whole vocabulary of every
    # row. Rows without top-k / top-p keep every token min-p keeps, as the kernel's do (it skips
    # those filters when top_k <= 0 and top_p >= 1).
    out = logits.argmax(-1)
    rows = (temperature > 0).nonzero().flatten()
    if rows.numel() == 0:
        return out
    probs = (logits[rows].float() / temperature[rows, None]).softmax(-1)
    keep = probs >= min_p[rows, None] * probs.max(-1, keepdim=True).values
    k, tp = top_k[rows], top_p[rows]
    ordered = ((k > 0) | (tp < 1)).nonzero().flatten()
    if ordered.numel():
        sorted_p, order = probs[ordered].sort(dim=-1, descending=True)
        rank = torch.arange(probs.shape[-1], device=logits.device)[None, :]
        k_o, tp_o = k[ordered, None], tp[ordered, None]
        keep_sorted = ((k_o <= 0) | (rank < k_o)) & (sorted_p.cumsum(-1) - sorted_p < tp_o)
        keep[ordered] &= torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    u = sampling_uniforms(seeds[rows], steps[rows], probs.shape[-1])
    score = torch.where(keep, probs / -torch.log(u), torch.full_like(probs, -1.0))
    out[rows] = score.argmax(-1)
    return out
