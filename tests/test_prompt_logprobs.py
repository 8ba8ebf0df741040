"""SamplingParams.prompt_logprobs through the Engine: every prompt position's logprob, rank and top-N equal a
float32 transformers forward over the whole sequence, across chunked-prefill chunks, without a prefix-cache hit
skipping positions, once per request (n > 1), next to requests that do not ask."""
from __future__ import annotations

import pytest
import torch
import transformers

from catengine import Engine, SamplingParams
from tests.support import assert_clean

pytestmark = pytest.mark.usefixtures("single_thread")
ATOL = 1e-4   # float32 on both sides; paged, chunked attention and the GDN chunk rule reorder sums only


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    # an 8-token step budget cuts every prompt here into chunks; block_size 4 makes prefix hits likely
    return Engine(str(tiny_model_dir), max_model_len=128, block_size=4, max_num_seqs=4, max_num_batched_tokens=8,
                  seed=0)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> torch.Tensor:
        """[len(ids) - 1, V]: row p - 1 is the distribution of token p."""
        with torch.no_grad():
            return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)[:-1]
    return logprobs


def _prompt(engine, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, engine.vocab_size, (n,), generator=g).tolist()


def _check(entries, ids, ref, top_n):
    assert entries[0] is None and len(entries) == len(ids)
    for p in range(1, len(ids)):
        e, row = entries[p], ref[p - 1]
        assert e.token_id == ids[p]
        assert e.logprob == pytest.approx(row[ids[p]].item(), abs=ATOL), p
        higher_lo = int((row > row[ids[p]] + ATOL).sum())
        higher_hi = int((row > row[ids[p]] - ATOL).sum())
        assert higher_lo + 1 <= e.rank <= higher_hi + 1, (p, e.rank)
        assert len(e.top) == top_n
        assert [v for _, v in e.top] == pytest.approx(row.topk(top_n).values.tolist(), abs=ATOL)
        assert all(row[t].item() == pytest.approx(v, abs=ATOL) for t, v in e.top)


def test_prompt_logprobs_match_a_full_forward_across_chunks(engine, reference):
    ids = _prompt(engine, 29, seed=1)   # 29 tokens over 8-token steps: chunks cross block and step edges
    out = engine.generate([ids], SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3))[0]
    _check(out.prompt_logprobs, ids, reference(ids), 3)
    assert out.outputs[0].logprobs is None   # prompt logprobs do not turn on sampled-token logprobs
    assert_clean(engine)


def test_prefix_cache_hits_do_not_skip_positions(engine, reference):
    ids = _prompt(engine, 26, seed=2)
    greedy = SamplingParams(temperature=0, max_tokens=2)
    engine.generate([ids], greedy)
    hit = engine.generate([ids], greedy)[0]
    assert hit.num_cached_tokens > 0 and hit.prompt_logprobs is None   # the cache serves this prompt
    queries = engine.stats()["prefix_cache_queries"]
    out = engine.generate([ids], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0))[0]
    assert out.num_cached_tokens == 0
    assert engine.stats()["prefix_cache_queries"] == queries   # no lookup, so no query counted (as vLLM)
    _check(out.prompt_logprobs, ids, reference(ids), 0)
    assert out.token_ids == hit.token_ids
    assert_clean(engine)


def test_once_per_request_and_on_each_completions_first_delta(engine, reference):
    ids = _prompt(engine, 17, seed=3)
    rid = engine.add_request("plp-n2", ids, SamplingParams(n=2, temperature=0.9, seed=5, max_tokens=3,
                                                           prompt_logprobs=1))
    firsts, later = {}, []
    while engine.has_unfinished():
        for d in engine.step_deltas():
            assert d.request_id == rid
            if d.index not in firsts:
                firsts[d.index] = d.prompt_logprobs
            else:
                later.append(d.prompt_logprobs)
    assert set(firsts) == {0, 1} and all(p is None for p in later)
    assert firsts[0] is not None and firsts[0] == firsts[1]
    _check(firsts[0], ids, reference(ids), 1)
    assert_clean(engine)


def test_batched_with_requests_that_do_not_ask(engine, reference):
    prompts = [_prompt(engine, n, seed=10 + n) for n in (11, 19, 5)]
    greedy = SamplingParams(temperature=0, max_tokens=4)
    alone = [engine.generate([p], greedy)[0].token_ids for p in prompts]
    params = [greedy, SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=2), greedy]
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == alone
    assert outs[0].prompt_logprobs is None and outs[2].prompt_logprobs is None
    _check(outs[1].prompt_logprobs, prompts[1], reference(prompts[1]), 2)
    assert_clean(engine)


def test_lm_head_rows_only_for_requests_that_ask(engine, monkeypatch):
    """The normal path keeps its cost: without prompt_logprobs the lm_head sees one row per sample; with it,
    exactly the asking request's prompt positions more (len - 1 of them)."""
    rows = []
    real = engine.model.compute_logits
    monkeypatch.setattr(engine.model, "compute_logits", lambda h: rows.append(h.shape[0]) or real(h))
    prompts = [_prompt(engine, n, seed=40 + n) for n in (9, 14)]
    greedy = SamplingParams(temperature=0, max_tokens=3)
    engine.generate(prompts, greedy)
    assert sum(rows) == 2 * 3
    rows.clear()
    engine.generate(prompts, [greedy, SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=1)])
    assert sum(rows) == 2 * 3 + (14 - 1)


def test_one_token_prompt_and_validation(engine):
    out = engine.generate([[7]], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=5))[0]
    assert out.prompt_logprobs == [None]
    for bad in (-1, 21, 1.5, "2"):
        with pytest.raises(Exception, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)
    assert SamplingParams(n=3, prompt_logprobs=2).child(1).prompt_logprobs is None
    assert SamplingParams(n=3, prompt_logprobs=2).child(0).prompt_logprobs == 2


def test_preempted_prompt_recomputes_without_duplicates(tiny_model_dir, reference):
    """A tiny KV pool: the older request's decodes preempt the newer one (its prompt chunks, or after its first
    token); the recompute must neither repeat nor lose prompt positions."""
    eng = Engine(str(tiny_model_dir), max_model_len=48, block_size=4, max_num_seqs=4, max_num_batched_tokens=8,
                 num_kv_blocks=14, seed=0)
    older = _prompt(eng, 8, seed=20)
    newer = _prompt(eng, 36, seed=21)
    eng.add_request("older", older, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(12):   # older holds 5 of the 14 blocks when newer (10 blocks) arrives
        eng.step()
    eng.add_request("newer", newer, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=1))
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    assert eng.stats()["num_preemptions"] > 0
    _check(done["newer"].prompt_logprobs, newer, reference(newer), 1)
    assert_clean(eng)


def test_async_engine_generate_returns_them(engine, reference):
    """AsyncEngine.generate builds its output from the stream: the prompt logprobs ride on the first delta.
    Run last in this module: the AsyncEngine's thread drives ``engine`` from here on."""
    import asyncio

    from catengine import AsyncEngine
    ids = _prompt(engine, 13, seed=30)
    aengine = AsyncEngine(engine=engine)
    try:
        out = asyncio.run(aengine.generate(ids, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)))
    finally:
        aengine.shutdown()
    _check(out.prompt_logprobs, ids, reference(ids), 1)
