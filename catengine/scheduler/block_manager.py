"""Paged KV blocks: reference counts, a hash-keyed prefix cache of full blocks, LRU eviction.

A block is in exactly one of three places:
- referenced (``ref_count > 0``): in the block tables of that many running sequences;
- evictable: unreferenced but still holding a cached full block (``block_hash`` set); kept in LRU
  order and reused for new allocations only when the free list is empty;
- free: unreferenced and holding nothing worth keeping.

Pure Python on host integers: the GPU only ever sees block ids through the runner.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Callable, Iterable

from .request import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.cached: dict[int, int] = {}                          # block key -> block id
        # called with the key of a cached block whose contents are being discarded
        self.on_evict: list[Callable[[int], None]] = []
        self.num_evictions = 0

    # ------------------------------------------------------------------ capacity
    @property
    def num_available(self) -> int:
        """Blocks an allocation can take now (free ones, then evicting cached ones)."""
        return len(self.free) + len(self.evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_available

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by sequences (cached-but-idle blocks count as free)."""
        return self.num_used / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks ``seq`` must get so that its table covers ``num_tokens`` tokens."""
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    # ------------------------------------------------------------------ prefix cache
    def lookup(self, keys: Iterable[int]) -> list[int]:
        """Block ids of the longest run of leading ``keys`` present in the cache (refs unchanged)."""
        hits = []
        if not self.enable_caching:
            return hits
        for key in keys:
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_evictable_among(self, blocks: Iterable[int]) -> int:
        return sum(1 for b in blocks if b in self.evictable)

    def take_cached(self, seq: Sequence, blocks: list[int]) -> None:
        """Append cache hits ``blocks`` to an empty block table, taking a reference on each."""
        assert not seq.block_table, "prefix hits only start a fresh block table"
        for b in blocks:
            if self.ref_count[b] == 0:
                del self.evictable[b]
            self.ref_count[b] += 1
        seq.block_table.extend(blocks)
        seq.num_registered = len(blocks)

    def register_full_blocks(self, seq: Sequence) -> None:
        """Offer ``seq``'s fully computed blocks to the prefix cache (after a step ran them), up to its first
        token the host does not know yet (async scheduling's placeholder: its block's key is not known)."""
        full = min(min(seq.num_computed, seq.num_resolved) // self.block_size, len(seq.block_table))
        if full <= seq.num_registered:
            return
        if not self.enable_caching:
            seq.num_registered = full
            return
        keys = seq.compute_hashes(full, self.block_size)
        for i in range(seq.num_registered, full):
            block, key = seq.block_table[i], keys[i]
            # A block computed twice (two sequences missed the same prefix together) stays uncached.
            if self.block_hash[block] is None and key not in self.cached:
                self.block_hash[block] = key
                self.cached[key] = block
        seq.num_registered = full

    # ------------------------------------------------------------------ allocation
    def _pop_block(self) -> int:
        if self.free:
            block = self.free.popleft()
        else:
            block, _ = self.evictable.popitem(last=False)
            key = self.block_hash[block]
            self.block_hash[block] = None
            del self.cached[key]
            self.num_evictions += 1
            for callback in self.on_evict:
                callback(key)
        self.ref_count[block] = 1
        return block

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow ``seq``'s block table to cover ``num_tokens`` tokens; False (nothing changed) if the
        pool cannot."""
        need = self.blocks_needed(seq, num_tokens)
        if need > self.num_available:
            return False
        for _ in range(need):
            seq.block_table.append(self._pop_block())
        return True

    def free_seq(self, seq: Sequence) -> None:
        """Drop ``seq``'s references. Its tail blocks are released first so that, among equally old
        cached blocks, the end of a prefix is evicted before its beginning."""
        for block in reversed(seq.block_table):
            self.ref_count[block] -= 1
            assert self.ref_count[block] >= 0, f"block {block} freed twice"
            if self.ref_count[block] == 0:
                if self.block_hash[block] is not None:
                    self.evictable[block] = None
                else:
                    self.free.append(block)
        seq.block_table = []
        seq.num_registered = 0

    def fork(self, parent: Sequence, child: Sequence) -> tuple[int, int] | None:
        """Give ``child`` (empty table) the parent's blocks covering ``parent.num_computed`` tokens:
        full blocks shared by reference, a partly filled last block copied into a new block. Returns
        the (src, dst) block copy the runner must do before the child runs, or None. The caller has
        checked that one block is available when a copy is needed."""
        assert not child.block_table
        full = parent.num_computed // self.block_size
        shared = parent.block_table[:full]
        for b in shared:
            self.ref_count[b] += 1
        child.block_table = list(shared)
        child.num_registered = min(parent.num_registered, full)
        child.block_hashes = list(parent.block_hashes[:full])
        if parent.num_computed % self.block_size == 0:
            return None
        dst = self._pop_block()
        child.block_table.append(dst)
        return (parent.block_table[full], dst)

    # ------------------------------------------------------------------ checks
    def check_integrity(self, seqs: Iterable[Sequence]) -> None:
        """Raise AssertionError unless the bookkeeping is consistent with ``seqs`` (every sequence
        holding blocks): ref counts equal table occurrences, each block in exactly one place,
        the cache map and block hashes agree."""
        refs = [0] * self.num_blocks
        for seq in seqs:
            for b in seq.block_table:
                refs[b] += 1
        assert refs == self.ref_count, "block ref counts differ from the block tables: " + str(
            [(b, self.ref_count[b], refs[b]) for b in range(self.num_blocks) if refs[b] != self.ref_count[b]][:8])
        free, evictable = set(self.free), set(self.evictable)
        assert len(free) == len(self.free), "a block is twice in the free list"
        assert not free & evictable, "a block is both free and evictable"
        for b in range(self.num_blocks):
            in_use = self.ref_count[b] > 0
            assert in_use + (b in free) + (b in evictable) == 1, f"block {b} is lost or in two places"
            if b in evictable:
                assert self.block_hash[b] is not None, f"evictable block {b} has no hash"
            if b in free:
                assert self.block_hash[b] is None, f"free block {b} still has a hash"
        assert all(self.block_hash[b] == k for k, b in self.cached.items()), "cache map and block hashes differ"
        assert len(self.cached) == sum(h is not None for h in self.block_hash), "hashed block missing from cache"
