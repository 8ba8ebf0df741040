"""The Engine API: prompts of every shape, chat, step/abort, seeds, logprobs, stats, config errors."""
from __future__ import annotations

import math

import pytest

from catengine import Engine, EngineConfig, SamplingParams
from catengine.errors import ConfigError, ContextTooLong, InvalidRequest
from tests.support import assert_clean

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return Engine(str(tiny_model_dir), max_model_len=64, block_size=4, max_num_seqs=4, seed=3)


@pytest.fixture(scope="module")
def demo():
    return Engine(max_model_len=256, max_num_seqs=4)   # model=None: the embedded demo model


def test_demo_model_by_default_with_text_and_chat(demo):
    from catengine.tools.demo import serving_model_path
    assert demo.model_path == serving_model_path()   # the trained demo model (catengine/demo_model)
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    out = demo.generate("Hello, my name is", greedy)[0]
    assert out.prompt == "Hello, my name is" and out.prompt_token_ids == demo.tokenizer.encode("Hello, my name is")
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    assert out.text == demo.tokenizer.decode(out.token_ids)
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time == m.finished_time
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    chat = demo.chat(messages, greedy, chat_template_kwargs={"enable_thinking": False})[0]
    rendered = demo.tokenizer.apply_chat_template(messages, chat_template_kwargs={"enable_thinking": False})
    assert chat.prompt == rendered and "<|im_start|>assistant" in rendered
    assert chat.prompt_token_ids == demo.tokenizer.encode(rendered, add_special_tokens=False)
    assert len(demo.chat([messages, messages], greedy)) == 2
    assert_clean(demo)


def test_prompt_shapes(tiny):
    p = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    ids = tiny.tokenizer.encode("one two")
    by_text = tiny.generate("one two", p)
    assert len(by_text) == 1 and by_text[0].prompt_token_ids == ids
    assert [o.prompt_token_ids for o in tiny.generate(["one two", "three"], p)] == [ids, tiny.tokenizer.encode("three")]
    assert tiny.generate(ids, p)[0].token_ids == by_text[0].token_ids          # list[int]: one prompt
    assert len(tiny.generate([ids, ids[:1]], p)) == 2                           # list[list[int]]
    assert tiny.generate({"prompt_token_ids": ids}, p)[0].token_ids == by_text[0].token_ids
    assert tiny.generate([], p) == []
    two = tiny.generate(["a", "b"], [p, SamplingParams(temperature=0, max_tokens=1)])
    assert [len(o.token_ids) for o in two] == [2, 1]
    assert_clean(tiny)


def test_bad_requests_fail_before_anything_runs(tiny):
    p = SamplingParams(max_tokens=4)
    with pytest.raises(ContextTooLong, match="max_model_len"):
        tiny.generate(["ok", list(range(1, 62))], p)   # 61 + 4 > 64: the first prompt is not queued either
    with pytest.raises(ContextTooLong, match="no room"):
        tiny.generate([list(range(1, 65))], SamplingParams(max_tokens=None))
    with pytest.raises(InvalidRequest, match="token ids"):
        tiny.generate([[5, 99999]], p)
    with pytest.raises(InvalidRequest, match="empty"):
        tiny.generate([[]], p)
    with pytest.raises(InvalidRequest, match="one per prompt"):
        tiny.generate(["a", "b"], [p])
    with pytest.raises(InvalidRequest, match="logit_bias"):
        tiny.generate("a", SamplingParams(logit_bias={10**6: 1.0}))
    assert not tiny.has_unfinished()
    assert_clean(tiny)


def test_max_tokens_none_fills_the_context(tiny):
    out = tiny.generate([list(range(1, 60))], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))[0]
    assert len(out.token_ids) == 64 - 59 and out.finish_reason == "length"


def test_step_abort_and_outputs(tiny):
    p = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    tiny.add_request("keep", [1, 2, 3], p)
    tiny.add_request("drop", [4, 5, 6], SamplingParams(n=2, temperature=1.0, max_tokens=20))
    with pytest.raises(InvalidRequest, match="already in use"):
        tiny.add_request("keep", [1], p)
    first = {o.request_id: o for o in tiny.step()}
    assert set(first) == {"keep", "drop"} and len(first["drop"].outputs) == 2
    assert all(len(c.token_ids) == 1 and not c.finished for c in first["drop"].outputs)
    tiny.abort("drop")
    tiny.abort("no-such-request")
    tiny.check_integrity()
    outs = {o.request_id: o for o in tiny.step()}
    assert outs["drop"].finished and [c.finish_reason for c in outs["drop"].outputs] == ["abort", "abort"]
    assert len(outs["keep"].token_ids) == 2 and not outs["keep"].finished
    while tiny.has_unfinished():
        for o in tiny.step():
            assert o.request_id == "keep"
    assert tiny.stats()["request_success_total"]["abort"] >= 2
    assert_clean(tiny)


def test_seeds_reproduce(tiny_model_dir, tiny):
    prompts = [[7, 8, 9], [10, 11, 12, 13]]
    p = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)
    def fresh(seed):
        engine = Engine(str(tiny_model_dir), max_model_len=64, block_size=4, seed=seed)
        return [o.token_ids for o in engine.generate(prompts, p)]
    a, b, c = fresh(3), fresh(3), fresh(4)
    assert a == b and a != c   # unseeded requests draw their seeds from Engine(seed=...)
    seeded = SamplingParams(temperature=1.0, max_tokens=6, seed=42, ignore_eos=True)
    alone = tiny.generate(prompts[0], seeded)[0].token_ids
    batched = tiny.generate([prompts[1], prompts[0], prompts[1]], [p, seeded, p])[1].token_ids
    assert alone == batched


def test_logprobs(tiny):
    out = tiny.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=3, logprobs=2, ignore_eos=True))[0]
    assert len(out.logprobs) == 3
    for token, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == token and lp.rank == 1 and math.isfinite(lp.logprob) and lp.logprob <= 0
        assert len(lp.top) == 2 and lp.top[0][0] == token
    assert out.outputs[0].cumulative_logprob == pytest.approx(sum(lp.logprob for lp in out.logprobs))
    assert tiny.generate([[3]], SamplingParams(max_tokens=1))[0].logprobs is None


def test_stats(tiny):
    s = tiny.stats()
    for key in ("num_running", "num_waiting", "kv_cache_usage", "prefix_cache_queries", "prefix_cache_hits",
                "num_preemptions", "prompt_tokens_total", "generation_tokens_total", "request_success_total",
                "kv_capacity_tokens"):
        assert key in s
    assert s["num_running"] == s["num_waiting"] == 0 and s["kv_cache_usage"] == 0.0
    assert s["generation_tokens_total"] > 0 and s["prompt_tokens_total"] > 0


def test_config_validation_says_what_to_change():
    cases = [
        (dict(dtype="int8"), "float16"), (dict(device="tpu"), "cpu"), (dict(kv_cache_dtype="fp8"), "fp8_e5m2"),
        (dict(block_size=12), "power of two"), (dict(max_model_len=0), "positive"),
        (dict(gpu_memory_utilization=1.5), "(0, 1]"), (dict(kv_cache_auto_trim_ratio=-1.0), ">= 0"),
        (dict(max_num_seqs=8, max_num_batched_tokens=4), "raise it"), (dict(enable_prefix_caching="yes"), "True"),
        (dict(seed=1.5), "integer"), (dict(kv_cache_memory_bytes=0), "positive"),
    ]
    for kwargs, hint in cases:
        with pytest.raises(ConfigError, match=hint.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
            EngineConfig(**kwargs).validate()
    EngineConfig().validate()
    with pytest.raises(ConfigError, match="unknown engine setting"):
        Engine(max_model_length=5)


def test_memory_too_small_for_one_sequence(tiny_model_dir):
    with pytest.raises(ConfigError) as err:
        Engine(str(tiny_model_dir), max_model_len=4096, kv_cache_memory_bytes=200_000, max_num_seqs=2)
    msg = str(err.value)
    assert "max_model_len 4096 needs" in msg and "Lower max_model_len to at most" in msg and "fp8_e5m2" in msg
    # unset max_model_len is lowered to what fits instead
    engine = Engine(str(tiny_model_dir), kv_cache_memory_bytes=200_000, max_num_seqs=2, block_size=4)
    assert engine.config.max_model_len == engine.memory_plan.kv_capacity_tokens < 4096


def test_auto_trim(tiny_model_dir):
    trimmed = Engine(str(tiny_model_dir), max_model_len=64, max_num_seqs=2, block_size=16)
    assert trimmed.memory_plan.num_blocks == math.ceil(1.05 * 64 * 2 / 16)
    full = Engine(str(tiny_model_dir), max_model_len=64, max_num_seqs=2, block_size=16, kv_cache_auto_trim_ratio=0,
                  kv_cache_memory_bytes=None)
    assert full.memory_plan.num_blocks > 100 * trimmed.memory_plan.num_blocks
    assert trimmed.config.device == "cpu" and trimmed.config.dtype == "float32"


def test_fp8_kv_cache_runs(tiny_model_dir):
    engine = Engine(str(tiny_model_dir), max_model_len=64, block_size=4, kv_cache_dtype="fp8_e5m2")
    auto = Engine(str(tiny_model_dir), max_model_len=64, block_size=4)
    assert engine.memory_plan.kv_bytes_per_block * 4 == auto.memory_plan.kv_bytes_per_block   # 1 byte vs fp32
    out = engine.generate([[1, 2, 3, 4, 5, 6]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    assert_clean(engine)


def test_profile_step_runs_and_keeps_the_caches(tiny):
    caches = tiny.runner.caches
    nbytes = tiny.runner.profile_step(40, 6)
    assert nbytes > 0 and tiny.runner.caches is caches
    assert tiny.generate([[1, 2]], SamplingParams(max_tokens=2))[0].token_ids


def test_stop_token_ids_min_tokens_and_penalties(tiny):
    prompt = [[21, 22, 23, 24]]
    greedy = tiny.generate(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0].token_ids
    first = greedy[0]
    stopped = tiny.generate(prompt, SamplingParams(temperature=0, max_tokens=4, stop_token_ids=[first]))[0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop" and stopped.stop_reason == first
    assert stopped.text == ""     # a stop token's text is not part of the output
    held = tiny.generate(prompt, SamplingParams(temperature=0, max_tokens=4, stop_token_ids=[first], min_tokens=2,
                                                ignore_eos=True))[0]
    assert first not in held.token_ids[:2] and len(held.token_ids) >= 2
    penalised = tiny.generate(prompt, SamplingParams(temperature=0, max_tokens=8, repetition_penalty=1.5,
                                                     presence_penalty=1.0, frequency_penalty=1.0, ignore_eos=True))[0]
    assert len(penalised.token_ids) == 8
    assert_clean(tiny)
