"""Per-choice processing (reasoning then tool calls) streamed vs folded, and logprob formatting with
-inf values still encoding to valid JSON."""
import json
import math
from types import SimpleNamespace

from catengine.server.choices import ChatChoiceProcessor, TokenTexts, chat_logprobs, completion_logprobs
from catengine.server.protocol import encode
from catengine.server.reasoning import Qwen3ReasoningParser
from catengine.server.tool_qwen3_coder import Qwen3CoderToolParser

TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"properties": {"n": {"type": "integer"}}}}}]
TEXT = ("I should call get.\n</think>\n\nCalling now.\n<tool_call>\n<function=get>\n<parameter=n>\n42\n"
        "</parameter>\n<parameter=q>\nfree text\n</parameter>\n</function>\n</tool_call>")


def make(prefix=""):
    return ChatChoiceProcessor(Qwen3ReasoningParser(True, True), Qwen3CoderToolParser(TOOLS), prefix)


def fold(deltas):
    content = "".join(d.content for d in deltas)
    reasoning = "".join(d.reasoning for d in deltas)
    calls = {}
    for d in deltas:
        for tc in d.tool_calls:
            entry = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert entry["id"] is None, "two headers for one call"
                assert tc.type == "function" and tc.function.name and tc.function.arguments == ""
                entry["id"], entry["name"] = tc.id, tc.function.name
            assert entry["id"] is not None, "argument fragment before the call header"
            entry["arguments"] += tc.function.arguments or ""
    return content, reasoning, calls


def test_streamed_deltas_fold_to_the_calls():
    proc = make()
    deltas = [proc.feed(ch) for ch in TEXT] + [proc.finish()]
    content, reasoning, calls = fold(deltas)
    assert reasoning == "I should call get." and content == "Calling now."
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [("get", '{"n": 42, "q": "free text"}')]
    assert [(c.function.name, c.function.arguments) for c in proc.calls] == [("get", '{"n": 42, "q": "free text"}')]

    whole = make()
    one = [whole.feed(TEXT), whole.finish()]
    assert fold(one)[:2] == (content, reasoning)
    assert [c.function.arguments for c in whole.calls] == [c.function.arguments for c in proc.calls]


def test_forced_prefix_is_parsed_as_output():
    proc = make("<tool_call>\n<function=get>\n")
    proc.reasoning = Qwen3ReasoningParser(True, False)   # the server closed thinking for a forced call
    deltas = [proc.feed("<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>"), proc.finish()]
    content, _, calls = fold(deltas)
    assert content == "" and [c["arguments"] for c in calls.values()] == ['{"n": 7}']


class FakeTokenizer:
    def token_text(self, t):
        return {1: "a", 2: "\ufffd", 3: "c"}[t]

    def token_bytes(self, t):
        return {1: b"a", 2: b"\xe4", 3: b"c"}[t]


def test_logprobs_neg_inf_is_valid_json():
    texts = TokenTexts(FakeTokenizer())
    entries = [SimpleNamespace(token_id=1, logprob=-0.5, top=((1, -0.5), (2, -math.inf))),
               SimpleNamespace(token_id=2, logprob=-math.inf, top=((3, -0.1),))]
    chat = json.loads(encode(chat_logprobs(texts, entries, 2)))
    assert chat["content"][0]["top_logprobs"][1] == {"token": "\ufffd", "logprob": -9999.0, "bytes": [0xE4]}
    assert chat["content"][1]["logprob"] == -9999.0
    legacy = json.loads(encode(completion_logprobs(texts, [1, 2], entries, 1, text_offset=5)))
    assert legacy["tokens"] == ["a", "\ufffd"] and legacy["text_offset"] == [5, 6]
    assert legacy["token_logprobs"] == [-0.5, -9999.0]
    assert legacy["top_logprobs"] == [{"a": -0.5}, {"c": -0.1, "\ufffd": -9999.0}]
    echoed = json.loads(encode(completion_logprobs(texts, [3], [None], 1, 0)))
    assert echoed["token_logprobs"] == [None] and echoed["top_logprobs"] == [None]
