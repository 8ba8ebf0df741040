"""Torch twins of the attention family: the paged KV store and paged attention; the oracle in
tests and the engine's CPU path.

Each function has exactly the signature of the Triton implementation that replaces it on CUDA
(``catengine.kernels.ops`` picks one or the other); shapes use the letters of the package docstring
(:mod:`catengine.kernels`). Unless said otherwise, outputs have the dtype of the main input and math is
done in fp32.
"""
from __future__ import annotations

import torch

from ..common.e5m2 import e5m2_to_fp16, fp16_to_e5m2


def to_cache(x, cache_dtype):
    """K/V values as the cache stores them: e5m2 bytes in a uint8 cache, else cast."""
    return fp16_to_e5m2(x) if cache_dtype == torch.uint8 else x.to(cache_dtype)


def from_cache(x, dtype):
    """Cache elements back to ``dtype`` (e5m2 bytes widened exactly)."""
    return e5m2_to_fp16(x).to(dtype) if x.dtype == torch.uint8 else x.to(dtype)


def store_kv(key, value, k_cache, v_cache, slot_mapping):
    """Scatter new K/V into the paged cache (in place).

    key, value: [T, nkv, d]; k_cache, v_cache: [num_blocks, block_size, nkv, d] of the model dtype,
    or uint8 holding fp8 e5m2 bytes; slot_mapping: [T] int64, slot = block * block_size + offset,
    negative = skip this token (padding).
    """
    nb, bs = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(nb * bs, *k_cache.shape[2:])[slots] = to_cache(key[keep], k_cache.dtype)
    v_cache.view(nb * bs, *v_cache.shape[2:])[slots] = to_cache(value[keep], v_cache.dtype)


def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale: float,
                    max_query_len: int, max_seq_len: int, gate=None):
    """Causal GQA attention of new tokens over their sequence's whole cached context.

    q: [T, nh, d]; caches as in :func:`store_kv` (already holding the new tokens' K/V);
    block_tables: [B, max_blocks] int32; seq_lens: [B] int32 (cached + new); query_start_loc: [B+1]
    int32. Sequence b's queries are the last ``q_len_b`` positions of its ``seq_len_b`` tokens.
    max_query_len / max_seq_len are host-side upper bounds (launch sizing; the twin ignores them).
    gate: optional [T, nh, d]; if given the output is multiplied by sigmoid(gate).
    Decode is the case q_len = 1 for every sequence. Returns [T, nh, d] in q.dtype.
    """
    out = torch.empty_like(q)
    nh, nkv = q.shape[1], k_cache.shape[2]
    bs = k_cache.shape[1]
    qsl, sl = query_start_loc.tolist(), seq_lens.tolist()
    for b in range(len(sl)):
        start, end, n = qsl[b], qsl[b + 1], sl[b]
        if end == start:
            continue
        nblk = (n + bs - 1) // bs
        blocks = block_tables[b, :nblk].long()
        k = from_cache(k_cache[blocks].reshape(-1, nkv, k_cache.shape[-1])[:n], torch.float32)
        v = from_cache(v_cache[blocks].reshape(-1, nkv, v_cache.shape[-1])[:n], torch.float32)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        qb = q[start:end].float()
        s = torch.einsum("qhd,khd->hqk", qb, k) * scale
        q_pos = torch.arange(n - (end - start), n, device=q.device)
        mask = torch.arange(n, device=q.device)[None, :] > q_pos[:, None]
        s = s.masked_fill(mask[None], float("-inf"))
        o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
        if gate is not None:
            o = o * torch.sigmoid(gate[start:end].float())
        out[start:end] = o.to(q.dtype)
    return out
