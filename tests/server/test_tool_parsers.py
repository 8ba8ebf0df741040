"""Tool-call parsers: typed values, several calls, content around calls, malformed blocks, and the
streaming machine fed in arbitrary pieces giving exactly the non-streaming result."""
import json
import random

import pytest
from hypothesis import given, settings, strategies as st

from catengine.server.tool_parsers import HermesToolParser, ParsedOutput, collect, get_tool_parser
from catengine.server.tool_qwen3_coder import Qwen3CoderToolParser, convert_value

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "scale": {"type": "number"},
        "metric": {"type": "boolean"}, "opts": {"type": "object"}, "hours": {"type": "array"},
        "note": {"type": ["string", "null"]}, "nothing": {"type": "null"}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}}}},
]


def qcall(name, params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def hcall(name, args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def plain(out: ParsedOutput):
    return out.content, [(c.name, c.arguments) for c in out.tool_calls]


def stream(parser_cls, text, cuts, tools=TOOLS):
    parser = parser_cls(tools)
    events, last = [], 0
    for c in sorted(set(cuts)) + [len(text)]:
        events += parser.feed(text[last:c])
        last = c
    return events + parser.finish()


# --- qwen3_coder: values typed by the schema

def test_qwen3_coder_typed_values():
    text = qcall("get_weather", [("city", "Paris"), ("days", "3"), ("scale", "2.5"), ("metric", "true"),
                                 ("opts", '{"a": [1, 2]}'), ("hours", "[1, 2]"), ("note", "null"),
                                 ("nothing", "null"), ("extra", "42")])
    out = Qwen3CoderToolParser.parse(text, TOOLS)
    assert out.content is None
    assert len(out.tool_calls) == 1 and out.tool_calls[0].name == "get_weather"
    assert out.tool_calls[0].id.startswith("call_")
    args = json.loads(out.tool_calls[0].arguments)
    assert args == {"city": "Paris", "days": 3, "scale": 2.5, "metric": True, "opts": {"a": [1, 2]},
                    "hours": [1, 2], "note": None, "nothing": None, "extra": "42"}


@pytest.mark.parametrize("value,types,expected", [
    ("7", ["integer"], 7), ("-7", ["integer"], -7), ("7.5", ["integer"], "7.5"), ("x", ["integer"], "x"),
    ("1e3", ["number"], 1000.0), ("3", ["number"], 3), ("nan", ["number"], "nan"),
    ("False", ["boolean"], False), ("yes", ["boolean"], "yes"),
    ("[1]", ["object"], "[1]"), ("{bad", ["object"], "{bad"), ('{"k": 1}', ["object"], {"k": 1}),
    ("null", ["string"], "null"), ("null", ["integer", "null"], None), ("5", ["integer", "null"], 5),
    (" 12 ", ["integer"], 12), ("text", [], "text"),
])
def test_convert_value(value, types, expected):
    assert convert_value(value, types) == expected


def test_qwen3_coder_strips_one_newline_each_side():
    text = qcall("write_file", [("path", "a.py"), ("content", "\ndef f():\n    return 1 < 2\n\n")])
    args = json.loads(Qwen3CoderToolParser.parse(text, TOOLS).tool_calls[0].arguments)
    # qcall adds one newline each side: the value keeps its own leading and trailing newline
    assert args == {"path": "a.py", "content": "\ndef f():\n    return 1 < 2\n\n"}


def test_qwen3_coder_several_calls_and_text_before():
    text = ("Let me look that up.\n\n" + qcall("get_weather", [("city", "Oslo"), ("days", "2")]) + "\n"
            + qcall("write_file", [("path", "x"), ("content", "y")]) + "\n")
    content, calls = plain(Qwen3CoderToolParser.parse(text, TOOLS))
    assert content == "Let me look that up."
    assert calls == [("get_weather", '{"city": "Oslo", "days": 2}'),
                     ("write_file", '{"path": "x", "content": "y"}')]


def test_qwen3_coder_no_parameters_and_unknown_function():
    content, calls = plain(Qwen3CoderToolParser.parse(qcall("ping", []) + qcall("nope", [("n", "1")]), TOOLS))
    assert content is None and calls == [("ping", "{}"), ("nope", '{"n": "1"}')]


@pytest.mark.parametrize("bad", [
    "<tool_call>\nnot a call\n</tool_call>",
    "<tool_call>\n<function=\n>x</function>\n</tool_call>",
    "<tool_call>\n<function=>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weath",
    "<tool_call>",
])
def test_qwen3_coder_malformed_kept_as_content(bad):
    text = "before " + bad
    assert plain(Qwen3CoderToolParser.parse(text, TOOLS)) == (text, [])


def test_qwen3_coder_malformed_then_valid():
    text = "<tool_call>\noops\n</tool_call>\nthen " + qcall("ping", [])
    content, calls = plain(Qwen3CoderToolParser.parse(text, TOOLS))
    assert content == "<tool_call>\noops\n</tool_call>\nthen" and calls == [("ping", "{}")]


def test_qwen3_coder_unclosed_call_at_end_is_a_call():
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nRo"
    content, calls = plain(Qwen3CoderToolParser.parse(text, TOOLS))
    assert content is None and calls == [("get_weather", '{"city": "Ro"}')]


def test_qwen3_coder_unclosed_parameter_ends_at_next_tag():
    text = "<tool_call>\n<function=get_weather>\n<parameter=days>\n4\n<parameter=city>\nRome\n</function>\n</tool_call>"
    assert plain(Qwen3CoderToolParser.parse(text, TOOLS))[1] == [("get_weather", '{"days": 4, "city": "Rome"}')]


def test_no_calls_keeps_text_verbatim():
    text = "Just an answer with a < sign and <tool_ and trailing space \n"
    assert plain(Qwen3CoderToolParser.parse(text, TOOLS)) == (text, [])
    assert plain(HermesToolParser.parse(text, TOOLS)) == (text, [])


# --- streaming

def test_qwen3_coder_streaming_header_first_then_fragments():
    text = "Hi " + qcall("write_file", [("path", "a"), ("content", "line1\nline2")])
    events = stream(Qwen3CoderToolParser, text, list(range(len(text))))
    kinds = [e[0] for e in events]
    assert kinds.index("start") < kinds.index("args")
    start = events[kinds.index("start")]
    assert start[1] == 0 and start[3] == "write_file" and start[2].startswith("call_")
    # string values stream as they arrive: many fragments, not one
    assert kinds.count("args") > 5
    assert "".join(e[2] for e in events if e[0] == "args") == '{"path": "a", "content": "line1\\nline2"}'


SAMPLES_Q = [
    "Sure.\n\n" + qcall("get_weather", [("city", "New \"York\"\n"), ("days", "10"), ("opts", '{"x": "</"}')]),
    qcall("write_file", [("path", "p"), ("content", "a</parame\nb<parameter\n</functio")]) + "\n\n"
    + qcall("get_weather", [("metric", "false"), ("hours", "[1,\n2]")]) + "\n",
    "<tool_call>\nbroken</tool_call> text <tool_call>\n<function=ping>\n</function>\n</tool_call> after\n",
    "no calls at all < <t <tool <tool_call",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nunterminated value\n",
    "x\n<tool_call>\n<function=get_weather>\nstray <b> text\n<parameter=days>\n1\n</parameter>\n"
    "</function>junk</tool_call>",
]
SAMPLES_H = [
    "Checking.\n" + hcall("get_weather", {"city": "Zürich", "days": 2}) + "\n" + hcall("ping", {}),
    "<tool_call>\n{\"name\": \"x\", \"arguments\": {bad}}\n</tool_call> then " + hcall("ping", {"a": [1]}),
    "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}",
    "<tool_call>\n{\"name\": \"f\"",
    "plain <tool_ text",
]


def _same(events_a, events_b):
    return plain(collect(events_a)) == plain(collect(events_b))


@pytest.mark.parametrize("parser_cls,samples", [(Qwen3CoderToolParser, SAMPLES_Q), (HermesToolParser, SAMPLES_H)])
def test_streaming_char_by_char_matches(parser_cls, samples):
    for text in samples:
        whole = parser_cls.parse(text, TOOLS)
        events = stream(parser_cls, text, list(range(len(text))))
        assert plain(collect(events)) == plain(whole), text


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data())
def test_streaming_random_splits_match(data):
    parser_cls, samples = data.draw(st.sampled_from([(Qwen3CoderToolParser, SAMPLES_Q),
                                                     (HermesToolParser, SAMPLES_H)]))
    text = data.draw(st.sampled_from(samples))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=30))
    assert _same(stream(parser_cls, text, cuts), stream(parser_cls, text, []))


def test_streaming_random_concatenations_match():
    # longer random mixtures of calls, malformed blocks and text, cut at random points
    rng = random.Random(0)
    pieces = SAMPLES_Q + ["plain text ", "\n", "<tool_call>\n", "</tool_call>", "<function=f>", "</parameter>"]
    for _ in range(40):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
        cuts = [rng.randint(0, len(text)) for _ in range(rng.randint(0, 40))]
        assert _same(stream(Qwen3CoderToolParser, text, cuts), stream(Qwen3CoderToolParser, text, [])), text


def test_hermes_calls():
    content, calls = plain(HermesToolParser.parse(SAMPLES_H[0], TOOLS))
    assert content == "Checking."
    assert calls == [("get_weather", '{"city": "Zürich", "days": 2}'), ("ping", "{}")]
    content, calls = plain(HermesToolParser.parse(SAMPLES_H[1], TOOLS))
    assert content.startswith("<tool_call>\n{\"name\": \"x\"") and content.endswith("then")
    assert calls == [("ping", '{"a": [1]}')]
    # double-encoded arguments and a block left open at the end
    assert plain(HermesToolParser.parse(SAMPLES_H[2], TOOLS)) == (None, [("f", '{"a": 1}')])
    assert plain(HermesToolParser.parse(SAMPLES_H[3], TOOLS)) == (SAMPLES_H[3], [])


def test_registry():
    assert get_tool_parser("qwen3_coder") is Qwen3CoderToolParser
    assert get_tool_parser("hermes") is HermesToolParser
    with pytest.raises(ValueError, match="use one of"):
        get_tool_parser("llama3_json")
