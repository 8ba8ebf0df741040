"""Acceptance of a verify step's drafts, and which requests may draft at all."""
from __future__ import annotations

import torch

from ..scheduler import SchedulerOutput


def can_draft(params, grammar=None) -> bool:
    """True when verifying drafts cannot change this request's tokens: greedy, and nothing that makes a
    position's logits depend on the tokens generated before it in the same step (penalties, min_tokens, a
    grammar) or asks for logprobs. Other requests decode one token a step as without speculation."""
    if params is None:
        return False
    return (params.is_greedy and not params.logit_bias and params.repetition_penalty == 1.0
            and params.presence_penalty == 0.0 and params.frequency_penalty == 0.0 and params.min_tokens == 0
            and params.logprobs is None and grammar is None and params.structured_outputs is None)


def verify_rows(out: SchedulerOutput) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Hidden rows of every verify item's positions (pending token + drafts), and for each of its sample
    rows (row -> (first index into those hidden rows, number of drafts))."""
    index: list[int] = []
    spans: dict[int, tuple[int, int]] = {}
    offset = row = 0
    for it in out.scheduled:
        if it.num_drafts:
            spans[row] = (len(index), it.num_drafts)
            index.extend(range(offset, offset + it.num_new))
        offset += it.num_new
        row += it.num_samples
    return index, spans


def accept_greedy(model, hidden: torch.Tensor, out: SchedulerOutput) -> dict[int, list[int]]:
    """row -> the tokens a verify item adds: its drafts up to the first that differs from the target's
    argmax, then the target's token there (the bonus token when every draft matched). Exactly the tokens
    greedy decoding one at a time would produce."""
    index, spans = verify_rows(out)
    if not index:
        return {}
    rows = torch.tensor(index, dtype=torch.int64, device=hidden.device)
    target = model.compute_logits(hidden.index_select(0, rows)).argmax(-1).tolist()
    drafts = {row: it.draft_tokens for row, it in _verify_items(out)}
    accepted = {}
    for row, (first, m) in spans.items():
        t, d = target[first:first + m + 1], drafts[row]
        n = 0
        while n < m and d[n] == t[n]:
            n += 1
        accepted[row] = t[:n + 1]
    return accepted


def _verify_items(out: SchedulerOutput):
    row = 0
    for it in out.scheduled:
        if it.num_drafts:
            yield row, it
        row += it.num_samples
