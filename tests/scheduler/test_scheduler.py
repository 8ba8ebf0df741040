"""Scheduler behaviour with no model: budget, chunking, preemption order, prefix hits, forks, aborts."""
from __future__ import annotations

import random

import pytest

from catengine.errors import CapacityExceeded, ContextTooLong, InvalidRequest
from catengine.scheduler import hash_block
from tests.scheduler.sim import assert_all_free, make, reference, run_all, step


def prompt(n: int, base: int = 100) -> list[int]:
    return [base + i for i in range(n)]


def test_decodes_first_then_prefill_chunks_within_budget():
    sched, runner = make(budget=8, caching=False)
    results, mt = {}, {"a": 5, "b": 5, "c": 5, "long": 3}
    for rid in "abc":
        sched.add(rid, prompt(3, ord(rid)), 8)
    out = step(sched, runner, mt, results)
    assert [i.num_new for i in out.scheduled] == [3, 3, 2]       # FCFS prompt chunks fill the budget
    out = step(sched, runner, mt, results)
    assert [i.num_new for i in out.scheduled] == [1, 1, 1]       # a, b decode; c finishes its prompt
    sched.add("long", prompt(40), 43)
    out = step(sched, runner, mt, results)
    # three decodes first, the new prompt gets what is left of the budget
    assert [(i.seq.request_id, i.num_new) for i in out.scheduled] == [("a", 1), ("b", 1), ("c", 1), ("long", 5)]
    assert out.scheduled[-1].num_samples == 0


@pytest.mark.parametrize("caching, budget, chunks", [
    (False, 16, [16, 16, 16, 2]),
    (True, 16, [16, 16, 16, 2]),       # the last full-block boundary before the end (48) is a chunk end
    (False, 15, [15, 15, 15, 5]),
    (True, 15, [12, 12, 12, 12, 2]),   # with prefix caching a budget-cut chunk ends on a block boundary
])
def test_chunked_prefill(caching, budget, chunks):
    sched, runner = make(budget=budget, caching=caching)
    sched.add("r", prompt(50), 52)
    seen = []
    results = {}
    while "r" not in {k[0] for k in results}:
        out = step(sched, runner, {"r": 2}, results)
        seen.append(out.scheduled[0].num_new)
    assert seen[:len(chunks)] == chunks and seen[len(chunks):] == [1]
    assert results[("r", 0)] == reference(prompt(50), 0, 2)


@pytest.mark.parametrize("length, first_chunk", [(10, 8), (16, 12), (17, 16), (3, 3)])
def test_prompt_chunk_stops_at_last_block_boundary_so_its_state_is_saved(length, first_chunk):
    sched, runner = make(block_size=4, budget=100)
    sched.add("r", prompt(length), length + 1)
    out = step(sched, runner, {"r": 1}, {})
    assert out.scheduled[0].num_new == first_chunk
    if first_chunk % 4 == 0:
        assert len(out.state_saves) == 1 and out.state_saves[0][0] == out.scheduled[0].seq.state_slot


def test_prefix_hits_need_a_state_snapshot_and_are_counted_in_tokens():
    bs = 4
    shared = prompt(20)
    sched, runner = make(block_size=bs)
    run_all(sched, runner, [("a", shared + [7, 8], 3, 0, 1)])
    q0, h0 = sched.prefix_queries, sched.prefix_hits
    assert h0 == 0 and q0 == 22
    res = run_all(sched, runner, [("b", shared + [1, 2, 3, 4, 5], 4, 0, 1)])
    assert sched.prefix_queries - q0 == 25
    assert sched.prefix_hits - h0 == 20         # snapshot saved at the boundary 20 of prompt "a"
    assert res[("b", 0)] == reference(shared + [1, 2, 3, 4, 5], 0, 4)
    # "b" saved a snapshot at 24; a prompt of exactly those 24 tokens still recomputes its last block,
    # because at least one token must run to give logits
    keys = [None]
    for i in range(6):
        keys.append(hash_block(keys[-1], tuple((shared + [1, 2, 3, 4])[4 * i:4 * i + 4])))
    assert sched.states.lookup(keys[6]) is not None and sched.states.lookup(keys[5]) is not None
    h1 = sched.prefix_hits
    res = run_all(sched, runner, [("c", shared + [1, 2, 3, 4], 2, 0, 1)])
    assert sched.prefix_hits - h1 == 20
    assert res[("c", 0)] == reference(shared + [1, 2, 3, 4], 0, 2)


def test_shared_system_prompt_hits_from_the_third_request():
    system = prompt(10)
    sched, runner = make(block_size=4)
    run_all(sched, runner, [("a", system + [1, 2, 3, 4, 5], 2, 0, 1)])   # snapshot only at 12 (its own prompt)
    sched.add("b", system + [6, 7, 8], 13 + 2)
    out = step(sched, runner, {"b": 2}, {})
    # "b" shares two cached blocks with "a" but there is no state at 8: it computes from 0 and stops at 8
    assert sched.prefix_hits == 0 and out.scheduled[0].num_new == 8 and out.state_saves
    while sched.has_unfinished():
        step(sched, runner, {"b": 2}, {})
    res = run_all(sched, runner, [("c", system + [9], 2, 0, 1)])
    assert sched.prefix_hits == 8
    assert res[("c", 0)] == reference(system + [9], 0, 2)


def test_without_snapshot_no_hit_on_hybrid_but_attention_only_model_hits():
    shared = prompt(16)
    for hybrid, snapshots, hits in ((True, 0, 0), (False, 0, 16)):
        sched, runner = make(block_size=4, hybrid=hybrid, snapshots=snapshots)
        run_all(sched, runner, [("a", shared + [1], 2, 0, 1)])
        res = run_all(sched, runner, [("b", shared + [2, 3], 2, 0, 1)])
        assert sched.prefix_hits == hits
        assert res[("b", 0)] == reference(shared + [2, 3], 0, 2)


def test_caching_off_counts_nothing():
    sched, runner = make(caching=False)
    run_all(sched, runner, [("a", prompt(20), 2, 0, 1), ("b", prompt(20), 2, 0, 1)])
    assert sched.prefix_queries == 0 and sched.prefix_hits == 0 and not sched.blocks.cached


def test_preemption_takes_the_newest_and_everyone_finishes_correctly():
    # 10 blocks of 4 tokens; three sequences growing to 20 tokens each cannot all stay resident
    sched, runner = make(num_blocks=10, block_size=4, budget=64, caching=False)
    reqs = [(f"r{i}", prompt(6, 10 * i), 14, i, 1) for i in range(3)]
    mt, results = {r[0]: r[2] for r in reqs}, {}
    for rid, p, m, seed, _ in reqs:
        sched.add(rid, p, len(p) + m, seed=seed)
    victims = []
    while sched.has_unfinished():
        running_before = sorted(s.sort_key for s in sched.running)
        out = step(sched, runner, mt, results)
        for v in out.preempted:
            victims.append(v.request_id)
            # the victim was the newest of the sequences running when it was chosen
            assert v.sort_key == max(running_before)
            running_before.remove(v.sort_key)
    assert victims and "r0" not in victims
    assert sched.num_preemptions == len(victims)
    for rid, p, m, seed, _ in reqs:
        assert results[(rid, 0)] == reference(p, seed, m)
    assert_all_free(sched)


def test_fork_shares_prompt_blocks_and_copies_state():
    sched, runner = make(block_size=4)
    p = prompt(10)
    sched.add("r", p, 10 + 5, seed=7, forks=[(8, None), (9, None)])
    results, mt = {}, {"r": 5}
    step(sched, runner, mt, results)   # 8 tokens (boundary)
    step(sched, runner, mt, results)   # last 2 tokens: three samples, fork
    seqs = sched.requests["r"]
    assert len(seqs) == 3 and all(s.status.value == "running" for s in seqs)
    t0, t1, t2 = (s.block_table for s in seqs)
    assert t0[:2] == t1[:2] == t2[:2] and len({t0[2], t1[2], t2[2]}) == 3
    assert all(sched.blocks.ref_count[b] == 3 for b in t0[:2])
    out = step(sched, runner, mt, results)   # the fork copies run before this step's forward
    assert out.block_copies == [(t0[2], t1[2]), (t0[2], t2[2])]
    assert out.state_copies == [(seqs[0].state_slot, seqs[1].state_slot), (seqs[0].state_slot, seqs[2].state_slot)]
    out = step(sched, runner, mt, results)
    assert not out.block_copies and not out.state_copies
    while sched.has_unfinished():
        step(sched, runner, mt, results)
    for i, seed in enumerate((7, 8, 9)):
        assert results[("r", i)] == reference(p, seed, 5)
    assert_all_free(sched)


def test_fork_without_room_recomputes_the_child():
    sched, runner = make(max_num_seqs=1, block_size=4)
    p = prompt(9)
    res = run_all(sched, runner, [("r", p, 3, 1, 3)])
    for i in range(3):
        assert res[("r", i)] == reference(p, 1 + i, 3)


def test_rejects_requests_that_can_never_fit():
    sched, _ = make(num_blocks=8, block_size=4, max_model_len=40)
    with pytest.raises(ContextTooLong, match="max_model_len"):
        sched.add("a", prompt(30), 41)
    with pytest.raises(CapacityExceeded, match="KV blocks"):
        sched.add("b", prompt(30), 33)
    with pytest.raises(InvalidRequest, match="empty"):
        sched.add("c", [], 5)
    sched.add("d", prompt(3), 5)
    with pytest.raises(InvalidRequest, match="already in use"):
        sched.add("d", prompt(3), 5)
    assert [s.request_id for s in sched.waiting] == ["d"]


@pytest.mark.parametrize("when", [0, 1, 2, 4, 7])
def test_abort_at_any_point_frees_everything(when):
    sched, runner = make(block_size=4, budget=8)
    mt, results = {"a": 6, "b": 6}, {}
    sched.add("a", prompt(14), 20, forks=[(1, None)])
    sched.add("b", prompt(5, 7), 11)
    for _ in range(when):
        step(sched, runner, mt, results)
    aborted = sched.abort("a")
    assert all(s.finish_status == "abort" for s in aborted)
    sched.check_integrity()
    while sched.has_unfinished():
        step(sched, runner, mt, results)
    assert results[("b", 0)] == reference(prompt(5, 7), 0, 6)
    assert "a" not in sched.requests and sched.abort("a") == []
    assert_all_free(sched)


@pytest.mark.parametrize("seed", range(6))
def test_random_workload_matches_reference(seed):
    """Random prompts sharing prefixes, n > 1, small pools and budgets, random aborts: every
    surviving completion equals the reference and nothing leaks."""
    rng = random.Random(seed)
    bs = rng.choice([2, 4, 8])
    sched, runner = make(num_blocks=rng.randint(12, 40), block_size=bs, max_num_seqs=rng.randint(1, 6),
                         budget=rng.randint(6, 40), caching=rng.random() < 0.8, snapshots=rng.randint(0, 6),
                         hybrid=rng.random() < 0.8, max_model_len=10_000)
    prefixes = [prompt(rng.randint(0, 24), 1000 * k) for k in range(3)]
    reqs, mt, results, aborted = [], {}, {}, set()
    for i in range(14):
        p = rng.choice(prefixes) + [rng.randint(1, 9) for _ in range(rng.randint(1, 12))]
        m, n = rng.randint(1, 10), rng.choice([1, 1, 1, 2, 3])
        if sched.blocks.blocks_for(len(p) + m) > sched.config.num_blocks:
            continue
        reqs.append((f"r{i}", p, m, i * 10, n))
    pending = list(reqs)
    while pending or sched.has_unfinished():
        if pending and rng.random() < 0.5:
            rid, p, m, s, n = pending.pop(0)
            mt[rid] = m
            sched.add(rid, p, len(p) + m, seed=s, forks=[(s + j, None) for j in range(1, n)])
        if rng.random() < 0.04 and sched.requests:
            rid = rng.choice(sorted(sched.requests))
            sched.abort(rid)
            aborted.add(rid)
        if sched.has_unfinished():
            step(sched, runner, mt, results)
    assert_all_free(sched)
    for rid, p, m, s, n in reqs:
        for j in range(n):
            if (rid, j) in results:
                assert results[(rid, j)] == reference(p, s + j, m), (rid, j)
            else:
                assert rid in aborted, (rid, j)
