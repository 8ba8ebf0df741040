"""Request validation as OpenAI and vLLM clients expect it (in-process app, real demo engine): messages that
OpenAI requires content for are refused without it, booleans are strict, unknown fields are ignored with
one warning per field name."""
import logging

import pytest
from starlette.testclient import TestClient

from catengine.server.app import build_app

from .conftest import make_context

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def client(async_engine):
    with TestClient(build_app(make_context(async_engine)), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("messages", [
    [{"role": "user"}],
    [{"role": "user", "content": None}],
    [{"role": "system"}, {"role": "user", "content": "hi"}],
    [{"role": "system", "content": "be brief"}, {"role": "developer", "content": None}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
                                         "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
     {"role": "tool", "tool_call_id": "c1"}],
])
def test_message_without_required_content_is_400(client, messages):
    r = client.post(CHAT, json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "has no content" in err["message"] and err["code"] == 400


def test_assistant_message_with_only_tool_calls_is_accepted(client):
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    r = client.post(CHAT, json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("value", ["no", "false", 0, 1, None])
def test_enable_thinking_must_be_a_boolean(client, value):
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                "chat_template_kwargs": {"enable_thinking": value}})
    assert r.status_code == 400, r.text
    assert "enable_thinking must be true or false" in r.json()["error"]["message"]


@pytest.mark.parametrize("value", [True, False])
def test_enable_thinking_booleans_work(client, value):
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                "chat_template_kwargs": {"enable_thinking": value}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path,field,value", [
    (CHAT, "stream", "no"), (CHAT, "logprobs", "true"), (CHAT, "ignore_eos", 1),
    (COMPLETIONS, "echo", "yes"), (COMPLETIONS, "stream", 0), (COMPLETIONS, "skip_special_tokens", "false"),
])
def test_top_level_booleans_are_strict(client, path, field, value):
    body = {"messages": [{"role": "user", "content": "hi"}]} if path == CHAT else {"prompt": "hi"}
    r = client.post(path, json={**body, "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]


def test_unknown_fields_are_ignored_and_logged_once_per_name(client, caplog):
    caplog.set_level(logging.WARNING, logger="catengine.server")
    body = {"prompt": "hi", "max_tokens": 1, "lp24_unknown_a": {"x": 1}}
    for _ in range(3):
        assert client.post(COMPLETIONS, json=body).status_code == 200
    assert client.post(COMPLETIONS, json={**body, "lp24_unknown_b": 2}).status_code == 200
    hits = [r.getMessage() for r in caplog.records if "lp24_unknown" in r.getMessage()]
    assert len(hits) == 2, hits
    assert "lp24_unknown_a" in hits[0] and "lp24_unknown_b" in hits[1] and "lp24_unknown_a" not in hits[1]
    assert "CompletionRequest" in hits[0]
