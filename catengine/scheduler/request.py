"""The scheduler's unit of work: one sequence (one completion of a request).

A request with ``n > 1`` starts as one *leader* sequence; when its prompt is computed the scheduler
forks ``n - 1`` children that share the prompt's KV blocks. Every sequence simply has a list of
tokens, of which ``num_computed`` are in the KV cache / GDN state; the rest are what it wants to run
next (a prompt chunk, one decode token, or everything again after a preemption).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def hash_block(parent: int | None, tokens: tuple[int, ...]) -> int:
    """Prefix-cache key of a full block: chained over the parent block's key, so equal keys mean
    equal whole prefixes (up to a 64-bit hash collision). Python's hash of an int tuple does not
    depend on PYTHONHASHSEED, so keys are stable across processes too."""
    return hash((parent, tokens))


@dataclass(eq=False)
class Sequence:
    """Host-side bookkeeping of one sequence. Identity (``is``) is its equality: the scheduler keeps
    sequences in lists and dicts by object."""

    seq_id: int
    request_id: str
    index: int                      # completion index inside its request (0 for the leader)
    token_ids: list[int]            # prompt followed by the tokens generated so far
    num_prompt_tokens: int
    max_total_tokens: int           # prompt + max output tokens: the most this sequence can ever hold
    arrival: int                    # FCFS order (children inherit the leader's); lower = older
    params: Any = None              # opaque to the scheduler (the runner reads SamplingParams)
    grammar: Any = None             # opaque too: the engine's structured-outputs matcher (the runner fills masks)
    seed: int = 0                   # sampling seed of this sequence
    # leader of an n > 1 request: (seed, params) of completions 1..n-1, forked once the prompt is computed
    forks: list[tuple[int, Any]] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0           # tokens whose KV and state are in the caches
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # keys of this sequence's full blocks, in order
    num_registered: int = 0         # leading blocks of block_table already offered to the prefix cache
    state_slot: int | None = None
    num_cached_tokens: int = 0      # prefix-cache hit of the first admission (reported to the user)
    num_preemptions: int = 0
    # a block boundary a prompt chunk must end at, so that the GDN state there gets saved: the end of
    # the cached KV prefix this sequence shares with an earlier one (0 = none)
    save_point: int = 0
    admitted: bool = False          # admitted at least once (stats count each prompt's first lookup only)
    # every prompt position must be computed (prompt logprobs): no prefix hit until the first token is sampled
    skip_prefix_cache: bool = False
    finish_status: str | None = None
    # speculative decoding: this sequence's params allow drafting (set by the engine), and the live state slots
    # it holds besides state_slot while it drafts (the verify step writes the state after each token there)
    can_draft: bool = False
    spare_slots: list[int] = field(default_factory=list)
    # async scheduling: the last num_unresolved entries of token_ids are placeholders (-1 - row: the row of the
    # in-flight step's sampled tokens that the runner reads on the device) until that step's tokens reach the host
    num_unresolved: int = 0

    # ------------------------------------------------------------------ derived
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def num_pending(self) -> int:
        """Tokens it wants computed: the rest of a prompt, one decode token, or all after preemption."""
        return len(self.token_ids) - self.num_computed

    @property
    def num_resolved(self) -> int:
        """Leading tokens whose values the host knows (all but async scheduling's placeholders)."""
        return len(self.token_ids) - self.num_unresolved

    @property
    def reads_prefix_cache(self) -> bool:
        """False while a ``skip_prefix_cache`` sequence has not sampled its first token."""
        return not (self.skip_prefix_cache and self.num_output_tokens == 0)

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.arrival, self.index)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(int(token_id))

    def compute_hashes(self, num_blocks: int, block_size: int) -> list[int]:
        """Extend ``block_hashes`` to cover the first ``num_blocks`` full blocks of ``token_ids``."""
        num_blocks = min(num_blocks, len(self.token_ids) // block_size)
        hashes = self.block_hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, tuple(self.token_ids[i * block_size:(i + 1) * block_size])))
        return hashes

    def __repr__(self) -> str:  # short: these show up in assertion messages
        return (f"Sequence({self.request_id}#{self.index}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed}, blocks={len(self.block_table)}, slot={self.state_slot})")
