"""The runner's side of a verify step: the state slots its GDN layers write, and its sample rows."""
from __future__ import annotations

import torch

from ..sample_rows import SampleRows


def intermediate_slots(items, max_query_len: int) -> torch.Tensor:
    """[B, max_query_len] int32: where the GDN layers put the state after each new token. A verify item's
    tokens 0..m-1 go to its spare slots, token m (the last draft) to its live slot, which the recurrent rule
    writes last anyway; the scheduler then makes slot n the live one when n drafts are accepted (k+1 slots per
    sequence, no copy). Other items: -1 (only the live slot, as without speculation)."""
    out = torch.full((len(items), max_query_len), -1, dtype=torch.int32)
    for b, it in enumerate(items):
        m = it.num_drafts
        if m:
            out[b, :m + 1] = torch.tensor(it.seq.spare_slots[:m] + [it.seq.state_slot], dtype=torch.int32)
    return out


def intermediate_targets(slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat b * Q + j, slot) of the saved entries of :func:`intermediate_slots`'s table, on the host."""
    flat = slots.reshape(-1)
    rows = (flat >= 0).nonzero().flatten()
    return rows, flat[rows].to(torch.int64)


def without_rows(rows: SampleRows, drop: dict) -> SampleRows:
    """``rows`` less the rows in ``drop`` (the verify rows, which the acceptance samples)."""
    if not drop:
        return rows
    keep = [i for i in range(len(rows.rows)) if i not in drop]
    return SampleRows(*([getattr(rows, f)[i] for i in keep]
                        for f in ("rows", "last_index", "params", "seeds", "steps", "grammars")))


def merge_rows(token_ids: list[int], logprobs: list, accepted: dict[int, list[int]]):
    """The sampled rows' tokens with the verify rows' first tokens put back in row order (a verify row asks
    for no logprobs: see spec.accept.can_draft)."""
    if not accepted:
        return token_ids, logprobs
    n = len(token_ids) + len(accepted)
    tokens, lps = [0] * n, [None] * n
    rest = iter(zip(token_ids, logprobs))
    for row in range(n):
        if row in accepted:
            tokens[row] = accepted[row][0]
        else:
            tokens[row], lps[row] = next(rest)
    return tokens, lps
