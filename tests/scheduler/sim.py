"""A model-free runner for scheduler tests.

``FakeRunner`` keeps, per KV slot, the token id written there and, per state slot, the exact token
sequence the recurrent state has consumed. Before "computing" a scheduled chunk it checks that the
block table really holds the sequence's first ``start`` tokens and that the state slot holds the
state after exactly those tokens (or the chunk starts from zero): so prefix hits, fork copies,
snapshot saves/restores and preemption are verified, not just counted. The next token is a hash of
the whole context and the sequence's seed, so outputs depend on nothing but the tokens.
"""
from __future__ import annotations

from catengine.scheduler import Scheduler, SchedulerConfig


def next_token(context: list[int], seed: int) -> int:
    return 10 + hash((tuple(context), seed)) % 50


def reference(prompt: list[int], seed: int, max_tokens: int, first: int | None = None) -> list[int]:
    ctx, out = list(prompt), []
    while len(out) < max_tokens:
        t = first if (first is not None and not out) else next_token(ctx, seed)
        out.append(t)
        ctx.append(t)
    return out


class FakeRunner:
    def __init__(self, sched: Scheduler):
        self.bs = sched.block_size
        self.kv = [[None] * self.bs for _ in range(sched.config.num_blocks)]
        self.state: dict[int, tuple] = {}
        self.hybrid = sched.config.hybrid  # an attention-only model has no recurrent state to check
        self.steps = 0

    def execute(self, out, prev: list[int] | None = None) -> list[int]:
        """``prev``: the previous step's sampled tokens, which async scheduling's placeholders (``-1 - row``) in
        the token lists stand for (the device reads them there; the host does not know them yet)."""
        self.steps += 1
        for src, dst in out.block_copies:
            self.kv[dst] = list(self.kv[src])
        for src, dst in out.state_copies:
            self.state[dst] = self.state.get(src)
        sampled = []
        for item in out.scheduled:
            seq, bs = item.seq, self.bs
            tokens = [t if t >= 0 else prev[-1 - t] for t in seq.token_ids[:item.end]]
            for p in range(item.start):
                assert self.kv[seq.block_table[p // bs]][p % bs] == tokens[p], (seq, p)
            if item.start and self.hybrid:
                assert self.state.get(seq.state_slot) == tuple(tokens[:item.start]), (seq, item.start)
            for p in range(item.start, item.end):
                self.kv[seq.block_table[p // bs]][p % bs] = tokens[p]
            self.state[seq.state_slot] = tuple(tokens)
            if item.num_samples:
                ctx = tokens
                seeds = [seq.seed] + [s for s, _ in seq.forks]
                assert len(seeds) == item.num_samples
                sampled += [next_token(ctx, s) for s in seeds]
        for src, dst in out.state_saves:
            self.state[dst] = self.state[src]
        return sampled


def make(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, max_model_len=256, caching=True,
         snapshots=16, hybrid=True) -> tuple[Scheduler, FakeRunner]:
    s = Scheduler(SchedulerConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=budget, max_model_len=max_model_len,
                                  enable_prefix_caching=caching, num_snapshot_slots=snapshots, hybrid=hybrid))
    return s, FakeRunner(s)


def step(sched: Scheduler, runner: FakeRunner, max_tokens: dict[str, int], results: dict) -> object:
    """One engine-like step: schedule, run, update, finish sequences that reached max_tokens."""
    out = sched.schedule()
    assert out.num_tokens <= sched.config.max_num_batched_tokens
    assert len(out.scheduled) <= sched.config.max_num_seqs
    assert len({id(i.seq) for i in out.scheduled}) == len(out.scheduled)
    sampled = runner.execute(out)
    for seq, _tok, _row in sched.update(out, sampled):
        if seq.num_output_tokens >= max_tokens[seq.request_id]:
            results[(seq.request_id, seq.index)] = seq.output_token_ids
            sched.finish(seq, "length")
    sched.check_integrity()
    return out


def run_all(sched, runner, requests, max_steps=10_000) -> dict:
    """requests: list of (request_id, prompt, max_tokens, seed, n). Adds all, runs to completion."""
    max_tokens, results = {}, {}
    for rid, prompt, mt, seed, n in requests:
        max_tokens[rid] = mt
        sched.add(rid, prompt, len(prompt) + mt, seed=seed, forks=[(seed + i, None) for i in range(1, n)])
    for _ in range(max_steps):
        if not sched.has_unfinished():
            break
        step(sched, runner, max_tokens, results)
    assert not sched.has_unfinished(), "the scheduler stopped making progress"
    assert_all_free(sched)
    return results


def assert_all_free(sched: Scheduler) -> None:
    sched.check_integrity()
    assert sched.blocks.num_used == 0, "KV blocks still referenced"
    assert sched.states.num_free_live == sched.states.num_live, "live state slots still held"
    assert not sched.states.pending
