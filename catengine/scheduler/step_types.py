"""The scheduler's data: its settings, and what one step runs (:class:`SchedulerOutput`), which the runner turns
into tensors."""
from __future__ import annotations

from dataclasses import dataclass, field

from .request import Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool = True
    num_snapshot_slots: int = 0
    # True when the model has recurrent (GDN) layers: a prefix hit also needs a state snapshot
    hybrid: bool = True
    # speculative decoding: draft tokens a decoding sequence may verify per step (0: off), and no drafting in a
    # step with more running sequences than spec_disable_batch_size
    num_speculative_tokens: int = 0
    spec_disable_batch_size: int = 1 << 30

    @property
    def num_live_slots(self) -> int:
        """One live state slot per sequence, plus k draft slots for each sequence that can draft at once (no step
        drafts with more than spec_disable_batch_size sequences running); MemoryPlan.num_live_slots agrees."""
        return self.max_num_seqs + min(self.max_num_seqs, self.spec_disable_batch_size) * self.num_speculative_tokens


@dataclass
class ScheduledSeq:
    seq: Sequence
    start: int          # tokens already computed before this step
    num_new: int        # tokens computed in this step: seq.token_ids[start : start + num_new]
    num_samples: int    # 0: a prompt chunk; 1: sample the next token; 1 + forks: a leader's last prompt step
    # speculative verification: the last num_drafts of the num_new tokens are drafts the runner proposes
    # (draft_tokens, filled by its drafter before the forward), not yet in seq.token_ids
    num_drafts: int = 0
    draft_tokens: list[int] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + self.num_new


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    block_copies: list[tuple[int, int]] = field(default_factory=list)   # before the forward (fork)
    state_copies: list[tuple[int, int]] = field(default_factory=list)   # before the forward, in order
    state_saves: list[tuple[int, int]] = field(default_factory=list)    # after the forward: live -> snapshot
    preempted: list[Sequence] = field(default_factory=list)
    snapshot_keys: list[int] = field(default_factory=list)              # keys of state_saves, same order

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new for s in self.scheduled)

    @property
    def num_sample_rows(self) -> int:
        return sum(s.num_samples for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float        # fraction of KV blocks referenced by sequences
    num_blocks: int
    num_free_blocks: int         # free + cached-but-unreferenced
    num_cached_blocks: int
    num_evictable_blocks: int    # cached and unreferenced: reusable by a prefix hit, reclaimed when needed
    prefix_cache_queries: int    # tokens looked up (every admission counts its whole token list)
    prefix_cache_hits: int       # tokens served from the cache
    num_preemptions: int
    num_state_snapshots: int
