"""Structured outputs through the Engine on the demo model. Its weights are random, so whatever the
output is, it is the grammar that makes it valid: a check here fails if the mask is not applied."""
import json
import re

import pytest

from catengine import Engine, SamplingParams
from catengine.errors import InvalidRequest
from catengine.structured import StructuredOutputsParams as S

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "ok", "color"],
          "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"},
                         "ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}}}


@pytest.fixture(scope="module")
def engine():
    e = Engine(max_model_len=512, kv_cache_memory_bytes=64 << 20)
    yield e
    e.close()


def _gen(engine, spec, n=1, seed=1, max_tokens=120, prompt="Answer:"):
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, n=n, structured_outputs=spec)
    return engine.generate([prompt], params)[0].outputs


def test_regex_output_matches_in_full(engine):
    for c in _gen(engine, S(regex=r"[0-9]{3}-[a-z]{2}"), n=3):
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", c.text), c.text
        assert c.finish_reason == "stop"
    assert engine.stats()["num_grammar_matchers"] == 0


def test_choice_is_one_of_the_list(engine):
    outs = _gen(engine, S(choice=["yes", "no", "maybe"]), n=6)
    assert all(c.text in ("yes", "no", "maybe") and c.finish_reason == "stop" for c in outs), outs


def test_json_schema_output_validates(engine):
    for c in _gen(engine, S(json=SCHEMA, disable_any_whitespace=True), n=3, max_tokens=200):
        assert c.finish_reason == "stop", c.text
        obj = json.loads(c.text)
        assert set(obj) == {"name", "age", "ok", "color"}
        assert isinstance(obj["name"], str) and len(obj["name"]) <= 6
        assert isinstance(obj["age"], int) and isinstance(obj["ok"], bool) and obj["color"] in ("red", "blue")


def test_json_object_parses_when_it_ends(engine):
    outs = _gen(engine, S(json_object=True, disable_any_whitespace=True), n=6, seed=0, max_tokens=60)
    ended = [c for c in outs if c.finish_reason == "stop"]
    assert ended, [c.text for c in outs]
    for c in ended:
        assert isinstance(json.loads(c.text), dict)
    for c in outs:   # every output, ended or cut by max_tokens, starts like a JSON object
        assert c.text.startswith("{")


def test_grammar_ebnf(engine):
    (c,) = _gen(engine, S(grammar='root ::= "x" [0-9] [0-9]? ("!" | "?")'))
    assert re.fullmatch(r"x[0-9]{1,2}[!?]", c.text), c.text


def test_batch_mixes_constrained_and_free_rows(engine):
    free = SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    alone = engine.generate(["Hello"], free)[0].outputs[0].token_ids
    regex = SamplingParams(temperature=1.0, seed=3, max_tokens=40, structured_outputs=S(regex=r"[a-c]{4}"))
    mixed = engine.generate(["Hello", "Hi there", "Hello"], [free, regex, regex])
    assert mixed[0].outputs[0].token_ids == alone        # the free row is not masked
    for out in mixed[1:]:
        assert re.fullmatch(r"[a-c]{4}", out.outputs[0].text), out.outputs[0].text
    assert engine.stats()["num_grammar_matchers"] == 0


def test_abort_mid_stream_releases_the_matcher(engine):
    params = SamplingParams(temperature=1.0, seed=2, max_tokens=200, structured_outputs=S(regex=r"[a-z ]{150,}"))
    engine.add_request("so-abort", "Tell me", params)
    for _ in range(3):
        engine.step()
    assert engine.stats()["num_grammar_matchers"] == 1
    engine.abort("so-abort")
    outs = engine.step()
    assert [o.outputs[0].finish_reason for o in outs if o.request_id == "so-abort"] == ["abort"]
    assert engine.stats()["num_grammar_matchers"] == 0
    engine.check_integrity()


@pytest.mark.parametrize("spec,match", [
    (dict(json={"type": "objectx"}), "objectx"),
    (dict(regex="a(b"), "parenthesis"),
    (dict(grammar="root ::= undefined_rule"), "undefined_rule"),
])
def test_invalid_grammar_is_an_invalid_request_with_the_backend_message(engine, spec, match):
    with pytest.raises(InvalidRequest, match=match):
        engine.prepare_request(None, "x", SamplingParams(max_tokens=4, structured_outputs=S(**spec)))


def test_exactly_one_kind():
    with pytest.raises(InvalidRequest, match="exactly one"):
        S(regex="a", choice=["b"])
    with pytest.raises(InvalidRequest, match="unknown field"):
        SamplingParams(structured_outputs={"jsonn": "{}"})


def test_preempted_sequences_keep_their_grammar():
    """Preemption recomputes the KV of tokens that stay, so the matcher stays too: the outputs still match."""
    e = Engine(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32, num_kv_blocks=6,
               enable_prefix_caching=False)
    try:
        params = [SamplingParams(temperature=1.0, seed=s, max_tokens=50, structured_outputs=S(regex="[0-9]{40}"))
                  for s in range(4)]
        outs = e.generate(["Count:"] * 4, params)
        assert e.stats()["num_preemptions"] > 0
        for o in outs:
            assert re.fullmatch("[0-9]{40}", o.outputs[0].text) and o.outputs[0].finish_reason == "stop"
        assert e.stats()["num_grammar_matchers"] == 0
        e.check_integrity()
    finally:
        e.close()


@pytest.mark.gpu
def test_structured_outputs_on_the_gpu_with_decode_graphs():
    """CUDA: the mask is filled while the (graph-replayed) forward runs and applied by the Triton kernel."""
    import torch
    assert torch.cuda.is_available()
    e = Engine(max_model_len=512, device="cuda")
    try:
        assert e.runner.graphs is not None
        free = SamplingParams(temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
        alone = e.generate(["Hello"], free)[0].outputs[0].token_ids
        spec = [S(regex=r"[0-9]{3}-[a-z]{2}"), S(json=SCHEMA, disable_any_whitespace=True), S(choice=["yes", "no"])]
        params = [free] + [SamplingParams(temperature=1.0, seed=1, max_tokens=200, n=2, structured_outputs=s)
                           for s in spec]
        outs = e.generate(["Hello", "a", "b", "c"], params)
        assert outs[0].outputs[0].token_ids == alone
        for c in outs[1].outputs:
            assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", c.text)
        for c in outs[2].outputs:
            assert set(json.loads(c.text)) == {"name", "age", "ok", "color"}
        assert all(c.text in ("yes", "no") for c in outs[3].outputs)
        assert e.stats()["num_grammar_matchers"] == 0
    finally:
        e.close()
