"""Structured outputs through the openai SDK against ``catengine serve`` (demo model, random weights: the
grammar is what makes the answers valid), and the forced tool-call grammars of both parsers."""
import json
import re

import openai
import pytest

from .conftest import MAX_MODEL_LEN, serve_subprocess

MODEL = "demo"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def client():
    # disable_any_whitespace: random weights would otherwise fill JSON with blank space until max_tokens
    with serve_subprocess(["--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
                           "--kv-cache-memory-bytes", str(64 << 20), "--tool-call-parser", "qwen3_coder",
                           "--reasoning-parser", "qwen3", "--log-level", "warning", "--structured-outputs-config",
                           '{"backend": "xgrammar", "disable_any_whitespace": true}']) as (base, _):
        yield openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)

ALARM = [{"type": "function", "function": {"name": "set_alarm", "parameters": {
    "type": "object", "required": ["hour", "loud"],
    "properties": {"hour": {"type": "integer"}, "loud": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "required": ["c"], "properties": {"c": {"enum": ["a", "b"]}}}}}]
MSG = [{"role": "user", "content": "wake me"}]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["n", "ok"],
          "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}}}


def test_response_format_json_schema(client):
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=150, seed=1, extra_body=NO_THINK,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": SCHEMA}})
    text = r.choices[0].message.content
    obj = json.loads(text)
    assert set(obj) == {"n", "ok"} and isinstance(obj["n"], int) and isinstance(obj["ok"], bool), text


def test_structured_answer_with_thinking_on_is_content(client):
    """The template opens <think>; a grammar-constrained answer closes it first, so the JSON is the content."""
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=150, seed=5,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": SCHEMA}})
    msg = r.choices[0].message
    assert set(json.loads(msg.content)) == {"n", "ok"}
    assert getattr(msg, "reasoning_content", None) is None


def test_guided_choice_and_regex_on_completions(client):
    r = client.completions.create(model=MODEL, prompt="Pick:", max_tokens=10, n=3, seed=2,
                                  extra_body={"guided_choice": ["left", "right"]})
    assert all(c.text in ("left", "right") for c in r.choices), r.choices
    r = client.completions.create(model=MODEL, prompt="Code:", max_tokens=10, seed=2,
                                  extra_body={"structured_outputs": {"regex": "[A-Z]{2}[0-9]"}})
    assert re.fullmatch("[A-Z]{2}[0-9]", r.choices[0].text), r.choices[0].text


def test_streaming_regex(client):
    stream = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=20, seed=3, stream=True,
                                            extra_body={"guided_regex": "(ab|cd){3}", **NO_THINK})
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert re.fullmatch("(ab|cd){3}", text), text


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "set_alarm"}}])
@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call_is_a_parsed_call(client, choice, stream):
    kw = dict(model=MODEL, messages=MSG, tools=ALARM, tool_choice=choice, max_tokens=300, seed=4)
    if stream:
        name, args, reason = None, "", None
        for ch in client.chat.completions.create(stream=True, **kw):
            for c in ch.choices:
                for tc in c.delta.tool_calls or []:
                    name = tc.function.name or name
                    args += tc.function.arguments or ""
                reason = c.finish_reason or reason
    else:
        r = client.chat.completions.create(**kw)
        (call,) = r.choices[0].message.tool_calls
        name, args, reason = call.function.name, call.function.arguments, r.choices[0].finish_reason
    assert reason == "tool_calls"
    assert name in ("set_alarm", "pick") if choice == "required" else name == "set_alarm"
    obj = json.loads(args)
    if name == "set_alarm":
        assert isinstance(obj["hour"], int) and isinstance(obj["loud"], bool), args
    else:
        assert obj["c"] in ("a", "b"), args


def test_bad_requests_are_400(client):
    with pytest.raises(openai.BadRequestError, match="parenthesis"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body={"guided_regex": "a(b"})
    with pytest.raises(openai.BadRequestError, match="not among tools"):
        client.chat.completions.create(model=MODEL, messages=MSG, tools=ALARM, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="2 ways"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=4,
                                  extra_body={"guided_regex": "a", "guided_choice": ["b"]})
    with pytest.raises(openai.BadRequestError, match="xgrammar"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=4,
                                  extra_body={"guided_regex": "a", "guided_decoding_backend": "outlines"})


@pytest.mark.parametrize("parser", ["qwen3_coder", "hermes"])
def test_tool_grammar_accepts_the_call_its_parser_reads(parser):
    from catengine.server.structured import tool_call_grammar
    from catengine.server.tool_parsers import get_tool_parser
    from catengine.structured import GrammarBackend
    from catengine.tokenizer import Tokenizer
    from catengine.tools.demo import demo_model_path
    tok = Tokenizer(demo_model_path())
    backend = GrammarBackend(tok.hf, 248320, [248046])
    prefix = {"qwen3_coder": "<tool_call>\n<function=set_alarm>\n",
              "hermes": '<tool_call>\n{"name": "set_alarm", "arguments": '}[parser]
    rest = {"qwen3_coder": "<parameter=hour>\n7\n</parameter>\n<parameter=loud>\ntrue\n</parameter>\n</function>\n"
                           "</tool_call>",
            "hermes": '{"hour": 7, "loud": true}}\n</tool_call>'}[parser]
    m = backend.matcher(backend.compile(tool_call_grammar(ALARM, parser, "set_alarm")))
    assert m._matcher.accept_string(rest), rest
    parsed = get_tool_parser(parser).parse(prefix + rest, ALARM)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("set_alarm", {"hour": 7, "loud": True})]
    m.release()
