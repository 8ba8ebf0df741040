"""Logprobs: of sampled tokens (``SamplingParams.logprobs``) and of prompt tokens (``prompt_logprobs``).

Both come from log_softmax of the raw model logits (vLLM's default ``raw_logprobs``: no penalties, no
temperature). A sampled token's logprobs come from the rows the sampler computes anyway. Prompt
logprobs need the lm_head over every prompt position of the requests that ask, which the normal path
never computes (it takes the last position of each sequence only): :func:`prompt_logprobs` runs it over
those hidden rows alone, ``max_rows`` rows at a time, so the [rows, vocab] scratch never exceeds what the
runner's profiled sampling step already holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class TokenLogprobs:
    """Logprobs of one token (sampled, or a prompt token at its position).

    ``logprob`` and the values in ``top`` are finite floats or ``-inf`` (a token the model rules
    out), never NaN; the server serialises ``-inf`` (e.g. as ``-9999.0`` or null), since JSON has no
    infinity. ``rank`` is 1 + the number of tokens with a strictly higher logprob. ``top`` holds the
    request's top-N ``(token_id, logprob)`` pairs, most likely first (empty for logprobs=0).
    """

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


def finite_or_neg_inf(x: torch.Tensor) -> torch.Tensor:
    """NaN -> -inf and +inf -> the largest float, so softmax/log_softmax never produce NaN from them."""
    return torch.nan_to_num(x, nan=float("-inf"), posinf=torch.finfo(x.dtype).max, neginf=float("-inf"))


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, top_n: Sequence[int]) -> list[TokenLogprobs]:
    """One :class:`TokenLogprobs` per row of ``logits`` [R, V]: the logprob and rank of ``token_ids[r]``
    and the top ``top_n[r]`` pairs."""
    lp = torch.log_softmax(finite_or_neg_inf(logits.float()), dim=-1)
    # A row of all -inf has no distribution; its log_softmax is NaN, reported as -inf.
    lp = torch.where(torch.isnan(lp), torch.full_like(lp, float("-inf")), lp)
    chosen = token_ids.to(logits.device, torch.int64)
    chosen_lp = lp.gather(1, chosen[:, None])
    ranks = (lp > chosen_lp).sum(-1) + 1
    k = min(max(top_n, default=0), lp.shape[-1])
    top_v, top_i = lp.topk(k, dim=-1) if k > 0 else (lp[:, :0], lp[:, :0].long())
    chosen_l, chosen_lp_l, ranks_l = chosen.tolist(), chosen_lp[:, 0].tolist(), ranks.tolist()
    top_v_l, top_i_l = top_v.tolist(), top_i.tolist()
    return [TokenLogprobs(chosen_l[j], chosen_lp_l[j], ranks_l[j], tuple(zip(top_i_l[j][:n], top_v_l[j][:n])))
            for j, n in enumerate(top_n)]


def compute_logprobs(raw_logits: torch.Tensor, token_ids: torch.Tensor, params: Sequence) -> list[TokenLogprobs | None]:
    """Per-row :class:`TokenLogprobs` of the sampled ``token_ids`` for rows whose params ask for
    logprobs, else None."""
    rows = [b for b, p in enumerate(params) if p.logprobs is not None]
    result: list[TokenLogprobs | None] = [None] * len(params)
    if not rows:
        return result
    index = torch.tensor(rows, dtype=torch.int64, device=raw_logits.device)
    chosen = token_ids.to(raw_logits.device, torch.int64)[index]
    for b, entry in zip(rows, token_logprobs(raw_logits[index], chosen, [params[b].logprobs for b in rows])):
        result[b] = entry
    return result


def prompt_logprobs(hidden: torch.Tensor, rows: Sequence[int], targets: Sequence[int], top_n: Sequence[int],
                    compute_logits: Callable[[torch.Tensor], torch.Tensor], max_rows: int) -> list[TokenLogprobs]:
    """Logprobs of ``targets[i]`` (the prompt token at position p) from the hidden state of row
    ``rows[i]`` (position p - 1), in slices of at most ``max_rows`` rows through ``compute_logits``."""
    out: list[TokenLogprobs] = []
    index = torch.tensor(list(rows), dtype=torch.int64, device=hidden.device)
    target = torch.tensor(list(targets), dtype=torch.int64, device=hidden.device)
    step = max(1, int(max_rows))
    for lo in range(0, len(rows), step):
        hi = min(lo + step, len(rows))
        logits = compute_logits(hidden.index_select(0, index[lo:hi]))
        out.extend(token_logprobs(logits, target[lo:hi], top_n[lo:hi]))
    return out


__all__ = ["TokenLogprobs", "token_logprobs", "compute_logprobs", "prompt_logprobs", "finite_or_neg_inf"]
