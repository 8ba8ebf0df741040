"""Block manager and state-slot pool: ref counts, prefix cache, LRU eviction, integrity checks."""
from __future__ import annotations

import pytest

from catengine.scheduler import BlockManager, Sequence, StateCache


def seq(tokens, computed=None, sid=0) -> Sequence:
    s = Sequence(seq_id=sid, request_id=f"r{sid}", index=0, token_ids=list(tokens), num_prompt_tokens=len(tokens),
                 max_total_tokens=len(tokens) + 8, arrival=sid)
    s.num_computed = len(tokens) if computed is None else computed
    return s


def test_allocate_free_and_cache_full_blocks_only():
    bm = BlockManager(8, 4)
    a = seq(range(10))
    assert bm.allocate(a, 10) and len(a.block_table) == 3
    bm.register_full_blocks(a)
    assert len(bm.cached) == 2 and bm.num_used == 3
    bm.free_seq(a)
    bm.check_integrity([])
    assert len(bm.evictable) == 2 and bm.num_used == 0 and bm.usage == 0.0
    # the same prefix finds both cached blocks, in order
    b = seq(list(range(8)) + [99])
    hits = bm.lookup(b.compute_hashes(2, 4))
    assert len(hits) == 2
    bm.take_cached(b, hits)
    assert bm.allocate(b, 9)
    bm.check_integrity([b])
    assert not bm.evictable and bm.ref_count[hits[0]] == 1
    # a different first block breaks the chain even when the second block's tokens match
    c = seq([5, 1, 2, 3] + list(range(4, 8)))
    assert bm.lookup(c.compute_hashes(2, 4)) == []


def test_lru_evicts_least_recently_freed_tail_first_and_notifies():
    bm = BlockManager(4, 2)
    evicted = []
    bm.on_evict.append(evicted.append)
    a, b = seq([1, 2, 3, 4], sid=1), seq([7, 8], sid=2)
    for s in (a, b):
        assert bm.allocate(s, s.num_tokens)
        bm.register_full_blocks(s)
    bm.free_seq(a)           # a's tail block is released first: it is evicted before a's head
    bm.free_seq(b)
    assert len(bm.free) == 1 and len(bm.evictable) == 3
    c = seq(range(100, 106), sid=3)
    assert bm.allocate(c, 6)   # the free block, then two evictions
    assert evicted == [a.block_hashes[1], a.block_hashes[0]]
    assert bm.num_evictions == 2
    assert bm.lookup(b.compute_hashes(1, 2)) != [] and bm.lookup(a.compute_hashes(2, 2)) == []
    assert not bm.allocate(seq(range(4), sid=4), 4)   # one block left: a 2-block request fails
    bm.check_integrity([c])


def test_allocate_fails_without_side_effects():
    bm = BlockManager(3, 4)
    a = seq(range(12))
    assert not bm.allocate(a, 13)
    assert a.block_table == [] and bm.num_available == 3


def test_fork_shares_full_blocks_and_copies_partial_one():
    bm = BlockManager(8, 4)
    p = seq(range(10))
    assert bm.allocate(p, 10)
    bm.register_full_blocks(p)
    child = seq(range(10), sid=1)
    copy = bm.fork(p, child)
    assert child.block_table[:2] == p.block_table[:2] and copy == (p.block_table[2], child.block_table[2])
    assert [bm.ref_count[b] for b in p.block_table] == [2, 2, 1]
    bm.check_integrity([p, child])
    bm.free_seq(p)
    bm.free_seq(child)
    bm.check_integrity([])


def test_integrity_check_catches_corruption():
    bm = BlockManager(4, 2)
    a = seq([1, 2, 3])
    assert bm.allocate(a, 3)
    bm.check_integrity([a])
    with pytest.raises(AssertionError, match="ref counts"):
        bm.check_integrity([])           # a leak: blocks referenced by nobody
    bm.free.append(a.block_table[0])
    with pytest.raises(AssertionError):
        bm.check_integrity([a])          # a block both owned and free


def test_state_cache_live_slots_and_snapshot_lru():
    sc = StateCache(num_live=2, num_snapshots=2)
    s0, s1 = sc.allocate_live(), sc.allocate_live()
    assert (s0, s1) == (0, 1) and sc.allocate_live() is None
    k1, k2, k3 = 11, 22, 33
    a = sc.reserve(k1)
    assert a in (2, 3) and sc.lookup(k1) is None      # invisible until the step that writes it ran
    assert sc.reserve(k1) is None                      # already being written
    sc.commit(k1)
    assert sc.lookup(k1) == a and sc.reserve(k1) is None
    sc.reserve(k2)
    sc.commit(k2)
    sc.touch(k1)                                       # k2 is now least recently used
    assert sc.reserve(k3, evict=False) is None          # a decode save never evicts
    c = sc.reserve(k3)
    assert sc.lookup(k2) is None and sc.lookup(k1) == a and c != a
    sc.cancel(k3)
    sc.drop(k1)
    assert sc.lookup(k1) is None
    sc.release_live(s0)
    sc.check_integrity([s1])
    with pytest.raises(AssertionError, match="leaked"):
        sc.check_integrity([])
    assert StateCache(1, 0).reserve(k1) is None        # no snapshot pool: nothing is saved
