"""The server prepares (tokenizes, validates) every prompt of a request exactly once and all of them before
any runs; errors that are not the client's fault (a kernel contract broken, a ConfigError while serving) answer
500 with an OpenAI error body and one log line, never 400 (in-process app, real demo engine)."""
import logging

import pytest
from starlette.testclient import TestClient

from catengine.errors import CapacityExceeded, ConfigError, KernelContractError
from catengine.server.app import build_app

from .conftest import make_context, sse_events

MSG = [{"role": "user", "content": "hi"}]
REQUESTS = [
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 2}, 1),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 2, "stream": True, "n": 2}, 1),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}, 1),
    ("/v1/completions", {"prompt": ["a", "b c", "d"], "max_tokens": 2}, 3),
    ("/v1/completions", {"prompt": [[1, 2], [3]], "max_tokens": 2, "stream": True}, 2),
]


@pytest.fixture
def prepare_calls(async_engine, monkeypatch):
    """The request ids ``Engine.prepare_request`` was called with, in order."""
    calls = []
    real = async_engine.engine.prepare_request

    def counting(request_id, *args, **kwargs):
        calls.append(request_id)
        return real(request_id, *args, **kwargs)
    monkeypatch.setattr(async_engine.engine, "prepare_request", counting)
    return calls


@pytest.mark.parametrize("path,body,prompts", REQUESTS)
def test_each_prompt_is_prepared_once(async_engine, prepare_calls, path, body, prompts):
    with TestClient(build_app(make_context(async_engine)), raise_server_exceptions=False) as client:
        r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    if body.get("stream"):
        assert sse_events(r.text.split("\n\n"))[-1] == "[DONE]"
    assert len(prepare_calls) == prompts, prepare_calls
    assert len(set(prepare_calls)) == prompts   # one call per prompt, not two calls of one


@pytest.mark.parametrize("stream", [False, True])
def test_batch_is_validated_before_any_prompt_runs(async_engine, prepare_calls, monkeypatch, stream):
    """A prompt the KV cache cannot hold is a plain 400, even for a stream, and no earlier prompt started."""
    real = async_engine.engine.prepare_request   # the counting one

    def last_too_big(request_id, *args, **kwargs):
        prep = real(request_id, *args, **kwargs)
        if request_id.endswith("-2"):
            raise CapacityExceeded("a sequence of 9999 tokens needs 625 KV blocks but the cache has 64")
        return prep
    monkeypatch.setattr(async_engine.engine, "prepare_request", last_too_big)
    started = []
    stream_prepared = async_engine.stream_prepared
    monkeypatch.setattr(async_engine, "stream_prepared", lambda prep: started.append(prep) or stream_prepared(prep))
    body = {"prompt": ["a", "b", "c"], "max_tokens": 2, "stream": stream}
    with TestClient(build_app(make_context(async_engine)), raise_server_exceptions=False) as client:
        r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and "KV blocks" in err["message"]
    assert len(prepare_calls) == 3 and not started


class BrokenEngine:
    """The real engine, except that running a request raises ``error`` (as a kernel would on the engine side)."""

    def __init__(self, inner, error: Exception):
        self._inner = inner
        self._error = error

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def stream_prepared(self, prep):
        raise self._error
        yield   # an async generator, like AsyncEngine.stream_prepared


@pytest.mark.parametrize("error", [KernelContractError("w4a16_linear: x must be contiguous, got strides (1, 64)"),
                                   ConfigError("kv_cache_dtype 'fp8' is not supported")])
def test_internal_error_is_500_with_a_log_line(async_engine, caplog, error):
    ctx = make_context(BrokenEngine(async_engine, error))
    with TestClient(build_app(ctx), raise_server_exceptions=False) as client, \
            caplog.at_level(logging.ERROR, logger="catengine.server"):
        r = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err == {"message": f"internal error: {type(error).__name__}", "type": "InternalServerError",
                       "param": None, "code": 500}
        records = [rec for rec in caplog.records if rec.name == "catengine.server"]
        assert len(records) == 1, [rec.getMessage() for rec in records]
        assert "/v1/chat/completions" in records[0].getMessage() and records[0].exc_info[1] is error
        caplog.clear()

        # a stream has sent its headers already: the error travels as an SSE event, with code 500
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True})
        assert r.status_code == 200
        events = sse_events(r.text.split("\n\n"))
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 500, events
        assert len([rec for rec in caplog.records if rec.name == "catengine.server"]) == 1
    assert not ctx.is_dead   # a request-level bug does not mark the engine dead
