"""Every response and every stream chunk validates against the openai SDK's own pydantic models
(in-process app, real demo engine). The SDK parses responses without validating them, so a missing
required field (``object`` in the chunks, once) only shows up here.

Where the SDK's types are narrower than what OpenAI itself sends, the test widens exactly that field
and says so: completion stream chunks carry ``finish_reason: null`` until the last one (the SDK shares
one ``CompletionChoice`` between streamed and whole responses and types it non-null), and echoed
prompt logprobs start with ``null`` for the first token (OpenAI's legacy format; the SDK types
``token_logprobs`` as a list of floats).
"""
from typing import Dict, List, Literal, Optional

import openai.types as ot
import openai.types.chat as oc
import pytest
from starlette.testclient import TestClient

from catengine.server.app import build_app

from .conftest import make_context, sse_events

MSG = [{"role": "user", "content": "hi there"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


class _EchoLogprobs(ot.completion_choice.Logprobs):
    token_logprobs: Optional[List[Optional[float]]] = None
    top_logprobs: Optional[List[Optional[Dict[str, float]]]] = None


class _StreamChoice(ot.CompletionChoice):
    finish_reason: Optional[Literal["stop", "length", "content_filter"]]
    logprobs: Optional[_EchoLogprobs] = None


class _WholeChoice(ot.CompletionChoice):
    logprobs: Optional[_EchoLogprobs] = None


class _StreamCompletion(ot.Completion):
    choices: List[_StreamChoice]


class _EchoCompletion(ot.Completion):
    choices: List[_WholeChoice]


def _strict(model, data):
    return model.model_validate(data, strict=True)


@pytest.fixture(scope="module")
def client(async_engine):
    with TestClient(build_app(make_context(async_engine)), raise_server_exceptions=False) as c:
        yield c


CHAT = [
    {"messages": MSG, "max_tokens": 4, **NO_THINK},
    {"messages": MSG, "max_tokens": 4, "n": 2, "logprobs": True, "top_logprobs": 2, "temperature": 0.8, "seed": 1},
    {"messages": MSG, "max_tokens": 6, "tools": TOOLS, "tool_choice": "required"},
]


@pytest.mark.parametrize("body", CHAT)
def test_chat_response_validates(client, body):
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    resp = _strict(oc.ChatCompletion, r.json())
    assert resp.object == "chat.completion" and len(resp.choices) == body.get("n", 1)


@pytest.mark.parametrize("body", CHAT)
def test_chat_stream_chunks_validate(client, body):
    r = client.post("/v1/chat/completions", json={**body, "stream": True,
                                                  "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    events = sse_events(r.text.split("\n\n"))
    assert events[-1] == "[DONE]"
    chunks = [_strict(oc.ChatCompletionChunk, e) for e in events[:-1]]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert sum(1 for c in chunks for ch in c.choices if ch.finish_reason) == body.get("n", 1)


COMPLETIONS = [
    {"prompt": "Hello", "max_tokens": 4},
    {"prompt": ["a", "b c"], "max_tokens": 3, "n": 2, "temperature": 0.7, "seed": 3, "logprobs": 2},
    {"prompt": [[1, 2, 3]], "max_tokens": 2, "echo": True},
]


@pytest.mark.parametrize("body", COMPLETIONS)
def test_completion_response_validates(client, body):
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    resp = _strict(ot.Completion, r.json())
    assert resp.object == "text_completion"


@pytest.mark.parametrize("body", COMPLETIONS)
def test_completion_stream_chunks_validate(client, body):
    r = client.post("/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    events = sse_events(r.text.split("\n\n"))
    assert events[-1] == "[DONE]"
    for e in events[:-1]:
        assert e["object"] == "text_completion", e
        assert all("finish_reason" in ch for ch in e["choices"]), e
        _strict(_StreamCompletion, e)
    assert events[-2]["choices"] == [] and events[-2]["usage"]["total_tokens"] > 0


def test_models_validate(client):
    listing = client.get("/v1/models").json()
    for card in listing["data"]:
        _strict(ot.Model, card)


@pytest.mark.parametrize("body", [{"prompt": "Hello there", "max_tokens": 2, "echo": True, "logprobs": 1},
                                  {"prompt": [[5, 6, 7], [8]], "max_tokens": 0, "echo": True, "logprobs": 0}])
def test_echo_logprobs_validate(client, body):
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    resp = _strict(_EchoCompletion, r.json())
    for choice in resp.choices:
        assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
        assert all(x is not None for x in choice.logprobs.token_logprobs[1:])
    r = client.post("/v1/completions", json={**body, "stream": True})
    events = sse_events(r.text.split("\n\n"))
    assert events[-1] == "[DONE]"
    for e in events[:-1]:
        _strict(_StreamCompletion, e)


def test_prompt_logprobs_responses_validate(client):
    r = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "prompt_logprobs": 1})
    assert r.status_code == 200, r.text
    _strict(oc.ChatCompletion, r.json())
    r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "prompt_logprobs": 1})
    assert r.status_code == 200, r.text
    _strict(ot.Completion, r.json())
