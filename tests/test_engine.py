"""Greedy outputs do not depend on how requests are scheduled: alone, batched, chunked, preempted,
served from the prefix cache. After every scenario every KV block and state slot is free."""
from __future__ import annotations

import random

import pytest

from catengine import Engine, SamplingParams
from catengine.tools.tiny_model import TINY_VOCAB
from tests.support import assert_clean

pytestmark = pytest.mark.usefixtures("single_thread")

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _prompts() -> list[list[int]]:
    """16 prompts of 3..29 tokens; three groups share 9-, 13- and 17-token prefixes."""
    rng = random.Random(1234)
    prefixes = [[rng.randrange(TINY_VOCAB) for _ in range(n)] for n in (9, 13, 17)]
    prompts = []
    for i in range(16):
        tail = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(3, 12))]
        prompts.append(tail if i % 4 == 3 else prefixes[i % 4] + tail)
    return prompts


PROMPTS = _prompts()


def _engine(path, **kw) -> Engine:
    kw.setdefault("max_model_len", 64)
    kw.setdefault("block_size", 4)
    return Engine(str(path), **kw)


@pytest.fixture(scope="module")
def alone(tiny_model_dir):
    """Each prompt run by itself, no prefix caching: the reference."""
    engine = _engine(tiny_model_dir, max_num_seqs=1, enable_prefix_caching=False)
    outs = [engine.generate(p, GREEDY)[0].token_ids for p in PROMPTS]
    assert_clean(engine)
    assert len({tuple(o) for o in outs}) > 8, "the tiny model barely depends on its prompt; the test would be weak"
    return outs


def test_batch_of_16(tiny_model_dir, alone):
    engine = _engine(tiny_model_dir, max_num_seqs=16, enable_prefix_caching=False)
    outs = engine.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == alone
    assert all(o.finish_reason == "length" and len(o.token_ids) == MAX_TOKENS for o in outs)
    assert [o.prompt_token_ids for o in outs] == PROMPTS
    assert engine.stats()["num_steps"] == MAX_TOKENS   # one prefill step for all, then decodes
    assert_clean(engine)


def test_every_prompt_chunked(tiny_model_dir, alone):
    # a budget of 3 tokens is below the shortest prompt: every prompt runs in several chunks, mixed
    # with other sequences' decodes
    engine = _engine(tiny_model_dir, max_num_seqs=3, max_num_batched_tokens=3, enable_prefix_caching=False)
    outs = engine.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == alone
    assert_clean(engine)


def test_tiny_kv_pool_preempts_and_resumes(tiny_model_dir, alone):
    # 12 blocks of 4 tokens: the longest sequence (29 + 6 tokens) needs 9 blocks, so sequences are
    # preempted and recomputed, with prefix caching helping the recompute
    engine = _engine(tiny_model_dir, max_model_len=48, max_num_seqs=6, max_num_batched_tokens=16, num_kv_blocks=12)
    outs = engine.generate(PROMPTS, GREEDY)
    assert engine.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in outs] == alone
    assert_clean(engine)


def test_prefix_cache_hits_give_identical_outputs(tiny_model_dir, alone):
    # pools large enough that nothing is evicted, so the hit lengths are exact
    engine = _engine(tiny_model_dir, max_num_seqs=8, num_kv_blocks=400, num_state_snapshots=128)
    first = engine.generate(PROMPTS[:3], GREEDY)      # one prompt of each shared-prefix group
    assert engine.stats()["prefix_cache_hits"] == 0
    rest = engine.generate(PROMPTS[3:], GREEDY)
    stats = engine.stats()
    assert stats["prefix_cache_hits"] > 0
    assert stats["prefix_cache_queries"] == sum(map(len, PROMPTS))
    assert sum(o.num_cached_tokens for o in rest) == stats["prefix_cache_hits"]
    assert [o.token_ids for o in first + rest] == alone
    # the same prompts again hit their own cached prefixes
    again = engine.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in again] == alone
    # the longest prefix ending on a block boundary before the last token: its state was saved there
    assert [o.num_cached_tokens for o in again] == [(len(p) - 1) // 4 * 4 for p in PROMPTS]
    assert_clean(engine)


def test_n_completions_share_the_prompt(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=8)
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=5, ignore_eos=True)
    out = engine.generate(PROMPTS[0], params)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    # completion i equals a single request with seed 11 + i (vLLM's child seeds), whatever the batch
    for i, c in enumerate(out.outputs):
        single = engine.generate([PROMPTS[0], PROMPTS[5]], SamplingParams(temperature=1.0, seed=11 + i,
                                                                          max_tokens=5, ignore_eos=True))[0]
        assert c.token_ids == single.token_ids
    assert_clean(engine)
