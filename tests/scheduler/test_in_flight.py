"""Async scheduling's scheduler half (catengine/scheduler/in_flight.py) against the model-free FakeRunner, which
checks every KV slot and state a step reads: step n+1 is scheduled and run before step n's tokens are known
(placeholders the runner resolves from step n's tokens), sequences found finished one step late are discarded
from the step in flight, and the outputs, prefix hits and freed blocks are those of the synchronous loop."""
from __future__ import annotations

import random

import pytest

from catengine.scheduler import in_flight
from tests.scheduler.sim import assert_all_free, make, reference

STOP = 17   # a token that ends a sequence (as EOS would) wherever the fake model produces it


def expected(prompt, seed, max_tokens):
    out = reference(prompt, seed, max_tokens)
    return out[:out.index(STOP) + 1] if STOP in out else out


def run_async(sched, runner, requests) -> dict:
    """The engine's overlapped loop without a model: launch n+1, then take step n's tokens."""
    max_tokens, results = {}, {}
    for rid, prompt, mt, seed in requests:
        max_tokens[rid] = mt
        sched.add(rid, prompt, len(prompt) + mt, seed=seed)
    prev = None
    for _ in range(10_000):
        if not (sched.has_unfinished() or prev):
            break
        cur = None
        if sched.has_unfinished():
            out = sched.schedule()
            if not out.is_empty:
                cur = (out, runner.execute(out, prev[1] if prev else None))
                in_flight.advance(sched, out)
            else:
                assert prev is not None, "nothing scheduled and nothing in flight"
        if prev is not None:
            events = in_flight.resolve(sched, *prev)
            later = {}
            if cur is not None:
                in_flight.commit_snapshots(sched, cur[0])
                later = {it.seq: it for it in cur[0].scheduled}
            for seq, token, _row in events:
                if seq.num_resolved - seq.num_prompt_tokens >= max_tokens[seq.request_id] or token == STOP:
                    if seq in later:
                        in_flight.discard(later[seq])
                    results[seq.request_id] = seq.output_token_ids
                    sched.finish(seq, "stop")
        sched.check_integrity()
        prev = cur
    assert not sched.has_unfinished(), "the scheduler stopped making progress"
    assert_all_free(sched)
    return results


def run_sync(sched, runner, requests) -> dict:
    """The synchronous loop with the same stops (sim.run_all stops by length only)."""
    max_tokens, results = {}, {}
    for rid, prompt, mt, seed in requests:
        max_tokens[rid] = mt
        sched.add(rid, prompt, len(prompt) + mt, seed=seed)
    while sched.has_unfinished():
        out = sched.schedule()
        for seq, token, _row in sched.update(out, runner.execute(out)):
            if seq.num_output_tokens >= max_tokens[seq.request_id] or token == STOP:
                results[seq.request_id] = seq.output_token_ids
                sched.finish(seq, "stop")
        sched.check_integrity()
    assert_all_free(sched)
    return results


def _requests(n=14, seed=3):
    rng = random.Random(seed)
    shared = [rng.randrange(10, 60) for _ in range(9)]
    reqs = []
    for i in range(n):
        tail = [rng.randrange(10, 60) for _ in range(rng.randint(2, 11))]
        reqs.append((f"r{i}", shared + tail if i % 2 else tail, rng.randint(1, 20), 100 + i))
    return reqs


@pytest.mark.parametrize("kw", [dict(), dict(budget=6, max_num_seqs=3), dict(num_blocks=16, budget=12),
                                dict(caching=False), dict(hybrid=False, num_blocks=20)],
                         ids=["plain", "chunked", "preempting", "no-cache", "attention-only"])
def test_async_loop_gives_the_synchronous_outputs(kw):
    reqs = _requests()
    want = {rid: expected(p, seed, mt) for rid, p, mt, seed in reqs}
    assert any(len(w) < mt for w, (_, _, mt, _) in zip(want.values(), reqs)), "no stop token: a weak test"
    sched, runner = make(**kw)
    assert run_async(sched, runner, reqs) == want
    sync_sched, sync_runner = make(**kw)
    assert run_sync(sync_sched, sync_runner, reqs) == want
    if kw.get("num_blocks") == 16:
        assert sched.num_preemptions > 0
    if kw.get("caching", True):
        # admissions come a step later (a finished sequence frees its slot one step late), so the counts may
        # differ a little; placeholders hashed into keys would lose most hits
        assert sched.prefix_hits >= 0.8 * sync_sched.prefix_hits > 0


def test_placeholders_stay_out_of_hashes_and_are_resolved():
    sched, runner = make()
    sched.add("a", list(range(10, 17)), 7 + 6, seed=1)   # 7 prompt tokens: the first decode completes block 2
    while True:   # the prompt, in chunks (the first ends on block 1's boundary, for its snapshot)
        out = sched.schedule()
        sampled = runner.execute(out)
        in_flight.advance(sched, out)
        if out.num_sample_rows:
            break
    seq = out.scheduled[0].seq
    assert seq.token_ids[-1] == in_flight.placeholder(0) and seq.num_unresolved == 1 and seq.num_resolved == 7
    nxt = sched.schedule()   # the decode of the placeholder, which completes block 2: its snapshot key is unknown
    assert [(it.start, it.num_new) for it in nxt.scheduled] == [(7, 1)]
    assert any(isinstance(k, in_flight.UnknownKey) for k in nxt.snapshot_keys)
    assert len(seq.block_hashes) == 1   # block 1 only: block 2 holds the placeholder
    second = runner.execute(nxt, sampled)
    in_flight.advance(sched, nxt)
    assert in_flight.resolve(sched, out, sampled) == [(seq, sampled[0], 0)]
    in_flight.commit_snapshots(sched, nxt)
    assert seq.token_ids[7] == sampled[0] and seq.num_unresolved == 1 and len(seq.block_hashes) == 2
    assert sched.states.lookup(seq.block_hashes[1]) is not None and not sched.states.pending
    in_flight.resolve(sched, nxt, second)
    assert seq.token_ids[7:] == reference(list(range(10, 17)), 1, 2) and seq.num_unresolved == 0
