"""Speculative decoding's share of the scheduler: how many drafts a decoding sequence verifies, the live state
slots that takes, and the bookkeeping of a verify step's result (the GDN rollback is a swap of two slot ids)."""
from __future__ import annotations

from .request import Sequence
from .state_cache import StateCache


def take_draft_slots(seq: Sequence, states: StateCache, k: int, budget: int, reserve: int) -> int:
    """Drafts ``seq`` verifies this step: ``k`` (0: no drafting), fewer near its token limit (a verify step adds at
    most num_drafts + 1 tokens), the step's budget or the draft slots there are beyond ``reserve`` free live slots.
    It holds one spare live slot per draft (the verify step writes the state after each token there); a sequence
    not drafting gives its spares back (they hold nothing it needs after a step)."""
    m = max(0, min(k, seq.max_total_tokens - seq.num_tokens - 1, budget - 1)) if seq.can_draft else 0
    m = min(m, len(seq.spare_slots) + max(0, states.num_free_live - reserve))
    while len(seq.spare_slots) < m:
        seq.spare_slots.append(states.allocate_live())
    if not m:
        for slot in seq.spare_slots:
            states.release_live(slot)
        seq.spare_slots = []
    return m


def commit_verify(seq: Sequence, start: int, num_drafts: int, tokens: list[int]) -> list[int]:
    """Apply a verify step that added ``tokens`` (accepted drafts, then the target's next token) to ``seq``;
    returns them."""
    n = len(tokens) - 1   # accepted drafts
    assert 0 <= n <= num_drafts, (n, num_drafts, seq)
    for token in tokens:
        seq.append_token(token)
    seq.num_computed = start + 1 + n
    if n < num_drafts:
        # rollback without a copy: the state after the last accepted token is in spare slot n (the runner's
        # intermediate_state_slots row); the old live slot becomes a spare
        seq.state_slot, seq.spare_slots[n] = seq.spare_slots[n], seq.state_slot
    return tokens
