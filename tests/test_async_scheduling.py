"""Async scheduling (catengine/step_loop.py) gives the synchronous engine's outputs, token for token and delta
for delta: greedy and seeded sampling, batches of different lengths, stops (stop ids, stop strings, max_tokens)
at different steps, n > 1, aborts mid-stream, preemption, prefix-cache hits, chunked prefill, the padded decode
graph buffers, prompt logprobs, generated blocks' snapshots for the next turn, the switch between the modes,
and the synchronous fall-back (penalties, grammars, speculative decoding). No block or slot leaks.
tests/scheduler/test_in_flight.py checks the scheduler's half against the model-free runner."""
from __future__ import annotations

import random

import pytest

from catengine import Engine, SamplingParams
from catengine.errors import ConfigError
from catengine.tools.tiny_model import TINY_VOCAB
from tests.support import assert_clean

pytestmark = pytest.mark.usefixtures("single_thread")


def _prompts(n: int = 12, seed: int = 7) -> list[list[int]]:
    """Prompts of 3..25 tokens, half sharing an 11-token prefix (prefix-cache hits at block size 4)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(TINY_VOCAB) for _ in range(11)]
    tails = [[rng.randrange(TINY_VOCAB) for _ in range(rng.randint(3, 14))] for _ in range(n)]
    return [prefix + t if i % 2 else t for i, t in enumerate(tails)]


PROMPTS = _prompts()


def _engine(path, overlap: bool, **kw) -> Engine:
    kw.setdefault("max_model_len", 64)
    kw.setdefault("block_size", 4)
    kw.setdefault("max_num_seqs", 6)
    engine = Engine(str(path), async_scheduling=overlap, **kw)
    assert engine.config.async_scheduling is overlap and engine.step_loop.overlap is overlap
    return engine


def _params(**kw) -> list[SamplingParams]:
    """Greedy and seeded rows mixed, max_tokens 2..13 (finishes land on different steps)."""
    return [SamplingParams(temperature=0.0 if i % 3 == 0 else 0.9, top_p=0.95, seed=100 + i,
                           max_tokens=2 + i, ignore_eos=True, **kw) for i in range(len(PROMPTS))]


def _outputs(outs) -> list:
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs]


def _both(path, prompts, params, check=None, **kw):
    """The outputs of the synchronous engine and of the async one (asserted equal); returns the async engine."""
    got = {}
    for overlap in (False, True):
        engine = _engine(path, overlap, **kw)
        got[overlap] = _outputs(engine.generate(prompts, params))
        if check is not None:
            check(engine)
        assert_clean(engine)
        if overlap:
            assert engine.step_loop.num_overlapped > 0, "no step overlapped: the test would prove nothing"
            assert engine.step_loop.in_flight is None
    assert got[True] == got[False]
    return got[True]


def test_config_default_and_validation(tiny_model_dir):
    engine = Engine(str(tiny_model_dir), max_model_len=64)
    assert engine.config.async_scheduling is False and not engine.step_loop.overlap   # CPU default: off
    with pytest.raises(ConfigError, match="async_scheduling"):
        Engine(str(tiny_model_dir), async_scheduling="yes")


def test_greedy_and_seeded_batch_of_different_lengths(tiny_model_dir):
    _both(tiny_model_dir, PROMPTS, _params())


def test_single_requests(tiny_model_dir):
    _both(tiny_model_dir, PROMPTS[:3], _params()[:3], max_num_seqs=1)


def test_stop_ids_and_stop_strings_at_different_steps(tiny_model_dir):
    # the reference outputs pick the stops: each request stops on a token (or the text) it produces at its own step
    engine = _engine(tiny_model_dir, False)
    free = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ref = engine.generate(PROMPTS, free)
    params = []
    for i, o in enumerate(ref):
        ids, text = o.outputs[0].token_ids, o.outputs[0].text
        k = 1 + i % 8
        if i % 2 and len(text) > k + 2:
            params.append(SamplingParams(temperature=0.0, max_tokens=12, stop=[text[k:k + 2]], ignore_eos=True))
        else:
            params.append(SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[ids[k]], ignore_eos=True))
    got = _both(tiny_model_dir, PROMPTS, params)
    reasons = [c[2] for o in got for c in o]
    assert reasons.count("stop") >= len(PROMPTS) // 2 and len({len(c[0]) for o in got for c in o}) > 3


def test_eos(tiny_model_dir):
    # the tiny model's EOS ids end the output where it samples one; stop_token_ids stands in when it never does
    _both(tiny_model_dir, PROMPTS, [SamplingParams(temperature=1.0, seed=i, max_tokens=20) for i in range(12)])


def test_n_completions(tiny_model_dir):
    params = [SamplingParams(n=3, temperature=0.8, seed=5 + i, max_tokens=3 + 2 * i, ignore_eos=True)
              for i in range(4)]
    got = _both(tiny_model_dir, PROMPTS[:4], params)
    assert [len(o) for o in got] == [3] * 4


def test_preemption_on_a_small_kv_pool(tiny_model_dir):
    def preempted(engine):
        assert engine.stats()["num_preemptions"] > 0
    _both(tiny_model_dir, PROMPTS, _params(), check=preempted, max_model_len=48, max_num_batched_tokens=16,
          num_kv_blocks=14)


def test_prefix_cache_hits_and_chunked_prefill(tiny_model_dir):
    def hits(engine):
        assert engine.stats()["prefix_cache_hits"] > 0
    # the shared prefix is cached by the first prompt that has it; budget 8 chunks every longer prompt
    _both(tiny_model_dir, PROMPTS, _params(), check=hits, max_num_batched_tokens=8, max_num_seqs=3)
    _both(tiny_model_dir, PROMPTS * 2, _params() * 2, check=hits, max_num_seqs=4)


def test_padded_decode_graph_buffers(tiny_model_dir):
    # the graph path resolves the placeholders in its static input buffer
    want = None
    for overlap in (False, True):
        engine = _engine(tiny_model_dir, overlap, max_num_seqs=8, enable_prefix_caching=False)
        engine.runner.enable_decode_graphs(capture=False)
        got = _outputs(engine.generate(PROMPTS[:8], _params()[:8]))
        assert engine.runner.graphs.num_runs > 5
        assert_clean(engine)
        want = got if want is None else want
    assert got == want


def test_penalties_logprobs_and_grammar_fall_back_to_sync_steps(tiny_model_dir):
    # negative penalties pull the output toward the tokens it has, the last one included: a placeholder in
    # the history the penalties read would change the output
    penalized = [SamplingParams(temperature=0.0, max_tokens=8, repetition_penalty=0.5, presence_penalty=-2.0,
                                frequency_penalty=-1.0, ignore_eos=True),
                 SamplingParams(temperature=0.7, seed=3, max_tokens=8, logprobs=2, ignore_eos=True),
                 SamplingParams(temperature=0.0, max_tokens=9, min_tokens=4, ignore_eos=True)]
    prompts = PROMPTS[:6]
    params = [penalized[i % 3] for i in range(6)]
    got = {}
    for overlap in (False, True):
        engine = _engine(tiny_model_dir, overlap)
        outs = engine.generate(prompts, params)
        got[overlap] = _outputs(outs), [[(lp.token_id, lp.logprob, lp.rank, lp.top) for lp in o.outputs[0].logprobs]
                                        for o in outs if o.outputs[0].logprobs is not None]
        assert_clean(engine)
    assert got[True] == got[False] and got[True][1]
    # the steps that sample a penalized row ran synchronously; the others (logprobs, min_tokens) overlapped
    assert 0 < engine.step_loop.num_overlapped < engine.stats()["num_steps"] - 8


def test_structured_outputs_fall_back(tiny_model_dir):
    pytest.importorskip("xgrammar")
    grammar = SamplingParams(temperature=0.0, max_tokens=10, structured_outputs={"choice": ["yes", "no", "maybe"]})
    params = [grammar if i % 2 else SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True) for i in range(4)]
    _both(tiny_model_dir, PROMPTS[:4], params)


def _stream(engine: Engine, prompts, params, abort_at: dict[int, int]) -> dict:
    """Deltas by request index: (text, token ids, finish_reason) per delta; request i is aborted once it has
    abort_at[i] tokens."""
    ids = [engine.add_request(None, p, sp) for p, sp in zip(prompts, params)]
    index = {rid: i for i, rid in enumerate(ids)}
    deltas: dict[int, list] = {i: [] for i in range(len(ids))}
    counts = [0] * len(ids)
    while engine.has_unfinished():
        for d in engine.step_deltas():
            i = index[d.request_id]
            deltas[i].append((d.index, d.text, tuple(d.token_ids), d.finish_reason))
            counts[i] += len(d.token_ids)
        for i, k in abort_at.items():
            if counts[i] >= k:
                engine.abort(ids[i])
    return deltas


def test_streaming_deltas_and_aborts_mid_stream(tiny_model_dir):
    params = _params()
    abort_at = {1: 2, 4: 5, 7: 1}
    got = {}
    for overlap in (False, True):
        engine = _engine(tiny_model_dir, overlap)
        got[overlap] = _stream(engine, PROMPTS, params, abort_at)
        assert_clean(engine)
    assert got[True] == got[False]
    for i, k in abort_at.items():
        assert got[True][i][-1][3] == "abort" and sum(len(d[2]) for d in got[True][i]) == k


def test_abort_everything_with_a_step_in_flight(tiny_model_dir):
    engine = _engine(tiny_model_dir, True)
    ids = [engine.add_request(None, p, sp) for p, sp in zip(PROMPTS, _params())]
    for _ in range(4):
        engine.step()
    assert engine.step_loop.in_flight is not None
    engine.abort(ids)
    outs = engine.step()
    assert all(o.finished for o in outs) and not engine.has_unfinished()
    assert_clean(engine)
    # the engine goes on afterwards with the same outputs as a fresh synchronous one
    again = _outputs(engine.generate(PROMPTS[:3], _params()[:3]))
    assert again == _outputs(_engine(tiny_model_dir, False).generate(PROMPTS[:3], _params()[:3]))
    assert_clean(engine)


def test_speculative_decoding_keeps_synchronous_steps(tmp_path):
    # a verify step's accepted count decides the next step: async scheduling stays off while speculating, and
    # the tokens equal those without speculation
    from tests.spec.helpers import engine as mtp_engine, write_tiny_mtp_model
    path = write_tiny_mtp_model(tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    want = _outputs(_engine(path, True).generate(PROMPTS[:4], params))
    spec = mtp_engine(path, 2, async_scheduling=True, max_model_len=64, block_size=4)
    assert spec.config.async_scheduling and not spec.step_loop.overlap
    assert _outputs(spec.generate(PROMPTS[:4], params)) == want
    assert spec.stats()["spec_decode_num_drafts"] > 0 and spec.step_loop.num_overlapped == 0
    assert_clean(spec)


def test_snapshots_of_generated_blocks_serve_the_next_turn(tiny_model_dir):
    # a decode step that completes a block saves the GDN state there under a key known only when its last token
    # comes back (UnknownKey): the next turn, prompt + output + more, hits as far as without the overlap
    got = {}
    for overlap in (False, True):
        engine = _engine(tiny_model_dir, overlap, num_state_snapshots=64)
        first = engine.generate(PROMPTS, _params())
        saves = engine.scheduler.states.num_saves
        turn2 = [p + o.outputs[0].token_ids + [5, 6, 7] for p, o in zip(PROMPTS, first)]
        hits = engine.stats()["prefix_cache_hits"]
        second = engine.generate(turn2, _params())
        got[overlap] = (_outputs(first), _outputs(second), saves, engine.stats()["prefix_cache_hits"] - hits)
        assert_clean(engine)
    assert got[True] == got[False]
    # more than the first turn's prompts alone could give (block size 4)
    assert got[True][3] > sum((len(p) - 1) // 4 * 4 for p in PROMPTS)


def test_aborts_at_every_step_leave_no_snapshot_slot_reserved(tiny_model_dir):
    engine = _engine(tiny_model_dir, True, num_state_snapshots=64)
    ids = [engine.add_request(None, p, sp) for p, sp in zip(PROMPTS, _params())]
    for _ in range(12):   # aborts land on all sorts of steps, some with a block-completing decode in flight
        engine.step()
        engine.abort(ids.pop())
    while engine.has_unfinished():
        engine.step()
    assert not engine.scheduler.states.pending
    assert_clean(engine)


def test_overlap_switched_between_steps(tiny_model_dir):
    # bench/bench_async_host.py times one engine both ways: a step in flight is finished by the next call either way
    want = _outputs(_engine(tiny_model_dir, False).generate(PROMPTS, _params()))
    engine = _engine(tiny_model_dir, True)
    ids = [engine.add_request(None, p, sp) for p, sp in zip(PROMPTS, _params())]
    done = {}
    step = 0
    while engine.has_unfinished():
        engine.step_loop.overlap = step % 3 != 2
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        step += 1
    assert _outputs([done[i] for i in ids]) == want
    assert engine.step_loop.num_overlapped > 0
    assert_clean(engine)


def test_prompt_logprobs(tiny_model_dir):
    # chunked prompts (budget 8) with prompt logprobs beside plain requests: the chunks' entries come with the step
    params = [SamplingParams(temperature=0.0, max_tokens=5, prompt_logprobs=2, ignore_eos=True) if i % 2 else
              SamplingParams(temperature=0.0, max_tokens=4 + i, ignore_eos=True) for i in range(6)]
    got = {}
    for overlap in (False, True):
        engine = _engine(tiny_model_dir, overlap, max_num_batched_tokens=8)
        outs = engine.generate(PROMPTS[:6], params)
        got[overlap] = _outputs(outs), [[(e.token_id, e.logprob, e.rank, e.top) if e is not None else None
                                         for e in o.prompt_logprobs] for o in outs if o.prompt_logprobs]
        assert_clean(engine)
    assert got[True] == got[False] and len(got[True][1]) == 3
    assert engine.step_loop.num_overlapped > 0
