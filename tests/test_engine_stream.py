"""AsyncEngine streams: deltas, stop strings, UTF-8 safety, aborts, engine failure."""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from catengine import AsyncEngine, Engine, SamplingParams
from catengine.errors import ContextTooLong, EngineDead
from catengine.request_state import PreparedRequest
from tests.support import assert_clean

pytestmark = pytest.mark.usefixtures("single_thread")

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Engine(str(tiny_model_dir), max_model_len=128, block_size=4, max_num_seqs=4)


@pytest.fixture
def aengine(engine):
    a = AsyncEngine(engine=engine)
    yield a
    a.shutdown()


def force_tokens(engine: Engine, script: dict[str, list[int]]) -> None:
    """Make the runner emit ``script[request_id]`` instead of sampling: the detokenizer and stop
    logic then see exactly the token boundaries a test wants."""
    def forced(sample_rows, hidden, masks=None):   # ModelRunner._sample's signature
        ids = []
        for seq, own in sample_rows.rows:
            assert own, "force_tokens scripts requests with n = 1 (no fork rows)"
            ids.append(script[seq.request_id][seq.num_output_tokens])
        return torch.tensor(ids, dtype=torch.int64), [None] * len(ids)
    engine.runner._sample = forced


def unforce(engine: Engine) -> None:
    engine.runner.__dict__.pop("_sample", None)


def collect(aengine: AsyncEngine, prompt, params, request_id=None):
    async def run():
        return [d async for d in aengine.stream(prompt, params, request_id=request_id)]
    return asyncio.run(run())


def test_stream_matches_generate(engine, aengine):
    prompt = [11, 22, 33, 44, 55]
    expected = engine.generate(prompt, GREEDY)[0]
    deltas = collect(aengine, prompt, GREEDY, "s1")
    assert all(d.request_id == "s1" and d.index == 0 for d in deltas)
    assert [t for d in deltas for t in d.token_ids] == expected.token_ids
    assert "".join(d.text for d in deltas) == expected.text
    assert [d.finish_reason for d in deltas] == [None] * (len(deltas) - 1) + ["length"]
    assert deltas[-1].num_output_tokens == 12 and deltas[-1].num_prompt_tokens == 5
    out = asyncio.run(aengine.generate(prompt, SamplingParams(n=2, temperature=0, max_tokens=4, ignore_eos=True)))
    assert [c.token_ids for c in out.outputs] == [expected.token_ids[:4]] * 2
    assert aengine.stats()["generation_tokens_total"] >= 12 + 8
    assert_clean(engine)


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_split_across_tokens_never_leaks(engine, aengine, include):
    text = "Hello world, this is a test of stop strings. More text."
    tokens = engine.tokenizer.encode(text)
    stop = "is a te"
    start = text.index(stop)
    # the stop string must span several tokens for the test to mean anything
    pieces = [engine.tokenizer.decode(tokens[:i]) for i in range(len(tokens) + 1)]
    assert not any(p.endswith(stop) for p in pieces)
    force_tokens(engine, {"stop": tokens})
    try:
        params = SamplingParams(max_tokens=len(tokens), stop=["zzz", stop], include_stop_str_in_output=include)
        deltas = collect(aengine, [1, 2, 3], params, "stop")
    finally:
        unforce(engine)
    streamed = ""
    for d in deltas:
        streamed += d.text
        # no streamed prefix ever shows the stop string's beginning beyond what the answer keeps
        assert text.startswith(streamed) and (include or len(streamed) <= start)
    assert streamed == (text[:start + len(stop)] if include else text[:start])
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason == stop
    assert_clean(engine)


def test_byte_fallback_never_streams_replacement_characters(engine, aengine):
    text = "naïve 😀 世界 ok"
    tokens = engine.tokenizer.encode(text)
    assert any("\ufffd" in engine.tokenizer.decode([t]) for t in tokens), "no multi-token character to test"
    force_tokens(engine, {"utf8": tokens})
    try:
        deltas = collect(aengine, [1, 2], SamplingParams(max_tokens=len(tokens)), "utf8")
    finally:
        unforce(engine)
    assert all("\ufffd" not in d.text for d in deltas)
    assert any(d.text == "" and d.token_ids for d in deltas)   # text held back while a character is incomplete
    assert "".join(d.text for d in deltas) == text
    assert_clean(engine)


def test_abandoned_and_cancelled_streams_abort_and_free_everything(engine, aengine):
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)

    async def abandon():
        agen = aengine.stream([5, 6, 7], params, request_id="gone")
        got = [await agen.__anext__() for _ in range(3)]
        await agen.aclose()
        return got

    async def cancel():
        started = asyncio.Event()

        async def consume():
            async for _ in aengine.stream([8, 9], params, request_id="cancelled"):
                started.set()
        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def explicit_abort():
        deltas = []
        async for d in aengine.stream([1, 2, 3, 4], params, request_id="aborted"):
            deltas.append(d)
            if len(deltas) == 2:
                aengine.abort("aborted")
        return deltas

    assert len(asyncio.run(abandon())) == 3
    asyncio.run(cancel())
    deltas = asyncio.run(explicit_abort())
    assert deltas[-1].finish_reason == "abort" and len(deltas) < 100
    _wait_idle(aengine)
    assert_clean(engine)


def test_bad_request_raises_before_the_first_delta(aengine):
    with pytest.raises(ContextTooLong):
        collect(aengine, list(range(1, 120)), SamplingParams(max_tokens=50))
    assert not aengine.is_dead


def test_prepare_then_stream_prepared_prepares_once_on_the_prep_thread(engine, aengine, monkeypatch):
    threads = []
    real = engine.prepare_request

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)
    monkeypatch.setattr(engine, "prepare_request", spy)
    prompt = [11, 22, 33, 44, 55]

    async def run():
        with pytest.raises(ContextTooLong):   # before anything is queued
            await aengine.prepare(list(range(1, 120)), SamplingParams(max_tokens=50))
        prep = await aengine.prepare(prompt, GREEDY, "two-phase")
        assert isinstance(prep, PreparedRequest) and prep.request_id == "two-phase"
        return [d async for d in aengine.stream_prepared(prep)]
    two_phase = [t for d in asyncio.run(run()) for t in d.token_ids]
    assert len(threads) == 2 and all(name.startswith("catengine-prep") for name in threads)
    one_phase = [t for d in collect(aengine, prompt, GREEDY, "one-phase") for t in d.token_ids]
    assert two_phase == one_phase and len(one_phase) == GREEDY.max_tokens
    assert len(threads) == 3   # stream() prepares once as well
    assert aengine.vocab_size == engine.vocab_size and aengine.model_path == engine.model_path
    assert_clean(engine)


def test_engine_failure_marks_it_dead(tiny_model_dir):
    engine = Engine(str(tiny_model_dir), max_model_len=32, block_size=4)
    aengine = AsyncEngine(engine=engine)

    def boom(out, prev_tokens=None):
        raise RuntimeError("device lost")
    engine.runner.launch = boom
    with pytest.raises(EngineDead, match="device lost"):
        collect(aengine, [1, 2, 3], SamplingParams(max_tokens=3))
    assert aengine.is_dead
    with pytest.raises(EngineDead):
        collect(aengine, [1, 2, 3], SamplingParams(max_tokens=3))
    aengine.shutdown()


def _wait_idle(aengine: AsyncEngine, timeout: float = 10.0) -> None:
    """The engine thread processes aborts asynchronously: wait until it has nothing left."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not aengine.engine.has_unfinished() and not aengine._commands:
            time.sleep(0.05)
            if not aengine.engine.has_unfinished():
                return
        time.sleep(0.02)
    raise AssertionError("the engine did not become idle")
