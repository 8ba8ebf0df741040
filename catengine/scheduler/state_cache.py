"""Gated DeltaNet state slots: one live slot per running sequence, plus a small LRU pool of
snapshot slots keyed by block hash.

A hybrid model can reuse a cached KV prefix only if it can also restore the recurrent state at the
prefix's last token. The runner copies a sequence's live slot into a snapshot slot whenever its
computed-token count lands on a full-block boundary at the end of a step; a later sequence whose
prompt starts with that prefix has its live slot initialised from the snapshot.

Slots ``0 .. num_live-1`` are live slots, ``num_live .. num_live+num_snapshots-1`` snapshot slots,
matching the state tensors the model allocates with ``num_live + num_snapshots + 1`` slots (the last
one is the decode CUDA graphs' padding slot, see :class:`catengine.memory.MemoryPlan`).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Iterable


class StateCache:
    def __init__(self, num_live: int, num_snapshots: int = 0):
        if num_live < 1 or num_snapshots < 0:
            raise ValueError(f"need num_live >= 1 and num_snapshots >= 0, got {num_live}, {num_snapshots}")
        self.num_live = num_live
        self.num_snapshots = num_snapshots
        self.free_live: deque[int] = deque(range(num_live))
        self.free_snapshots: deque[int] = deque(range(num_live, num_live + num_snapshots))
        self.snapshots: OrderedDict[int, int] = OrderedDict()  # block key -> slot, least recently used first
        self.pending: dict[int, int] = {}                      # key -> slot being written this step
        self.num_saves = 0
        self.num_restores = 0

    @property
    def num_slots(self) -> int:
        return self.num_live + self.num_snapshots

    @property
    def num_free_live(self) -> int:
        return len(self.free_live)

    # ------------------------------------------------------------------ live slots
    def allocate_live(self) -> int | None:
        return self.free_live.popleft() if self.free_live else None

    def release_live(self, slot: int) -> None:
        assert 0 <= slot < self.num_live and slot not in self.free_live, f"live slot {slot} freed twice"
        self.free_live.append(slot)

    # ------------------------------------------------------------------ snapshots
    def lookup(self, key: int) -> int | None:
        """Slot of a committed snapshot for ``key`` (a snapshot being written this step is not visible)."""
        return self.snapshots.get(key)

    def touch(self, key: int) -> None:
        """Mark a snapshot as just used (a prefix hit restored it)."""
        self.snapshots.move_to_end(key)
        self.num_restores += 1

    def reserve(self, key: int, evict: bool = True) -> int | None:
        """A slot to save the state at block ``key`` into during this step, or None when a snapshot
        of it exists or is being written, or there is no snapshot pool. With ``evict``, the least
        recently used snapshot makes room when no slot is free: the restore of an evicted snapshot
        scheduled in the same step still reads it, since restores run before the forward and saves
        after it."""
        if self.num_snapshots == 0 or key in self.snapshots or key in self.pending:
            return None
        if self.free_snapshots:
            slot = self.free_snapshots.popleft()
        elif self.snapshots and evict:
            _, slot = self.snapshots.popitem(last=False)
        else:
            return None  # every snapshot slot is being written this step
        self.pending[key] = slot
        return slot

    def commit(self, key: int) -> None:
        """The step that saved ``key`` ran: the snapshot becomes visible to lookups."""
        self.snapshots[key] = self.pending.pop(key)
        self.num_saves += 1

    def rekey(self, old, key: int) -> bool:
        """A reservation made before its block's key was known (async scheduling) takes the key; False, the slot
        given back, when a snapshot of ``key`` exists or is being written."""
        slot = self.pending.pop(old)
        if key in self.snapshots or key in self.pending:
            self.free_snapshots.append(slot)
            return False
        self.pending[key] = slot
        return True

    def cancel(self, key: int) -> None:
        """Give back a reserved slot whose snapshot is of no use (its KV block is not cached)."""
        self.free_snapshots.append(self.pending.pop(key))

    def drop(self, key: int) -> None:
        """The KV block ``key`` left the prefix cache; its snapshot can no longer be used."""
        slot = self.snapshots.pop(key, None)
        if slot is not None:
            self.free_snapshots.append(slot)

    # ------------------------------------------------------------------ checks
    def check_integrity(self, live_owned: Iterable[int]) -> None:
        owned = list(live_owned)
        assert len(set(owned)) == len(owned), f"a live state slot has two owners: {sorted(owned)}"
        free = list(self.free_live)
        assert len(set(free)) == len(free), "a live slot is twice in the free list"
        assert not set(owned) & set(free), "a live slot is both owned and free"
        assert sorted(owned + free) == list(range(self.num_live)), "live state slots leaked"
        snaps = list(self.snapshots.values()) + list(self.pending.values()) + list(self.free_snapshots)
        assert sorted(snaps) == list(range(self.num_live, self.num_slots)), "snapshot slots leaked or shared"
