"""Issue 25, in-process: what one request may make the server do (body type and size, prompt length in
characters, prompts x n, the waiting queue, the preparation thread's turns), the trailing-slash and
Bearer rules, an upload that is abandoned, abort counting and the new /metrics figures."""
import asyncio
import json
import logging
import threading
import time

import httpx
import pytest
from starlette.testclient import TestClient

from catengine.prep_queue import prep_owner
from catengine.server.app import build_app

from .conftest import MAX_MODEL_LEN, make_context

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def client(async_engine):
    with TestClient(build_app(make_context(async_engine)), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
def test_post_needs_application_json(client, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    r = client.post("/v1/chat/completions", content=json.dumps(CHAT), headers=headers)
    assert r.status_code == 415, r.text
    assert "application/json" in r.json()["error"]["message"]


def test_json_with_charset_is_fine(client):
    r = client.post("/v1/chat/completions", content=json.dumps(CHAT),
                    headers={"content-type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200, r.text


def test_oversized_body_is_413(async_engine):
    with TestClient(build_app(make_context(async_engine, max_request_bytes=1000))) as c:
        big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]})
        r = c.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]

        def chunks():   # no Content-Length: counted as it arrives
            for _ in range(4):
                yield big[:600].encode()
        r = c.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413


def test_trailing_slash_is_served_without_a_host_built_redirect(client):
    r = client.get("/v1/models/", headers={"host": "evil.example"}, follow_redirects=False)
    assert r.status_code == 200 and "location" not in r.headers
    assert r.json()["data"][0]["id"] == "demo"
    r = client.post("/v1/chat/completions/", json=CHAT, follow_redirects=False)
    assert r.status_code == 200


def test_bearer_scheme_in_any_case(async_engine):
    with TestClient(build_app(make_context(async_engine, api_key="k3y"))) as c:
        for header, status in (("Bearer k3y", 200), ("bearer k3y", 200), ("BEARER  k3y", 200),
                               ("Bearer nope", 401), ("k3y", 401), ("Basic k3y", 401)):
            assert c.get("/v1/models", headers={"authorization": header}).status_code == status, header


def test_prompt_characters_checked_before_tokenizing(client, async_engine, monkeypatch):
    tok = async_engine.tokenizer
    limit = MAX_MODEL_LEN * tok.max_token_chars
    seen = []
    real = tok.encode
    monkeypatch.setattr(tok, "encode", lambda text, *a, **k: seen.append(len(text)) or real(text, *a, **k))
    long_text = "a" * (limit + 1)
    r = client.post("/v1/completions", json={"prompt": long_text, "max_tokens": 1})
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": long_text}]})
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text
    assert all(n <= limit for n in seen), seen      # neither was tokenized
    with pytest.raises(Exception, match="characters"):
        async_engine.engine.prepare_request(None, long_text)


def test_prompts_times_n_is_capped(client):
    r = client.post("/v1/completions", json={"prompt": ["a", "b", "c"], "n": 100, "max_tokens": 1})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "300 sequences" in message and "--max-sequences-per-request" in message
    r = client.post("/v1/completions", json={"prompt": "a", "n": 128, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text   # one prompt at OpenAI's largest n always passes


def test_abort_counts_requests_not_sequences(async_engine):
    from catengine.server.completions import plan_completion
    from catengine.server.protocol import CompletionRequest, decode_request
    ctx = make_context(async_engine)
    body = json.dumps({"prompt": "Once upon a time", "n": 4, "max_tokens": 50, "ignore_eos": True}).encode()

    async def main():
        plan = await plan_completion(ctx, decode_request(body, CompletionRequest))
        gen = ctx.generate(plan.jobs)
        async for _ in gen:
            break
        await gen.aclose()
    asyncio.run(main())
    assert ctx.metrics.finished["abort"] == 1


def _gate(async_engine, owner="gate"):
    """Hold one preparation worker until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def hold():
        started.set()
        release.wait(60)
    future = async_engine._prep.submit(hold, owner=owner)
    assert started.wait(60)
    return release, future


def test_preparation_takes_turns_by_request(async_engine):
    (release, gate), (release2, gate2) = [_gate(async_engine, owner=f"gate{i}") for i in range(2)]
    order = []

    async def main():
        async def request(name, tasks):
            prep_owner.set(name)
            for i in range(tasks):
                await async_engine.run_on_prep_thread(order.append, f"{name}{i}")
        big = asyncio.create_task(request("big", 3))
        await asyncio.sleep(0.05)
        small = asyncio.create_task(request("small", 1))
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(big, small)
    try:
        asyncio.run(main())
    finally:
        release2.set()
    gate.result(10)
    gate2.result(10)
    assert order.index("small0") < order.index("big1"), order


def test_a_long_task_does_not_hold_back_other_requests(async_engine):
    """A second worker (with its own tokenizer copy) serves others while one task runs long."""
    release, gate = _gate(async_engine, owner="long")
    try:
        async def main():
            prep_owner.set("other")
            return await asyncio.wait_for(async_engine.run_on_prep_thread(async_engine.tokenizer.encode, "hi"), 60)
        assert asyncio.run(main()) == async_engine.tokenizer.encode("hi")
        assert not gate.done() and async_engine.stats()["prep_workers"] == 2
    finally:
        release.set()
    gate.result(10)


def test_waiting_preparation_work_is_in_metrics(async_engine):
    ctx = make_context(async_engine)
    gates = [_gate(async_engine, owner=f"gate{i}") for i in range(2)]   # both workers held
    try:
        futures = [async_engine._prep.submit(time.sleep, 0, owner=owner) for owner in ("a", "a", "b")]
        text = ctx.metrics.render(ctx.engine_stats())
        assert 'catengine:prep_queue_tasks{model_name="demo"} 3.0' in text
        assert 'catengine:prep_queue_requests{model_name="demo"} 2.0' in text
        assert 'catengine:prep_queue_running{model_name="demo"} 2.0' in text
    finally:
        for release, _ in gates:
            release.set()
    for _, gate in gates:
        gate.result(10)
    for f in futures:
        f.result(10)


def test_evictable_kv_blocks_in_metrics(client):
    prompt = "The history of the printing press begins " * 8   # several full KV blocks
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200
    text = client.get("/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("catengine:kv_cache_evictable_blocks{"))
    assert float(line.rsplit(" ", 1)[1]) >= 2, line
    assert "catengine:kv_cache_blocks{" in text


def test_max_waiting_requests_answers_429(async_engine):
    app = build_app(make_context(async_engine, max_waiting_requests=1))
    gates = [_gate(async_engine, owner=f"gate{i}") for i in range(2)]   # both workers held

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            first = asyncio.create_task(c.post("/v1/chat/completions", json=CHAT))
            await asyncio.sleep(0.3)      # the first waits behind the gate, in preparation
            second = await c.post("/v1/chat/completions", json=CHAT)
            for release, _ in gates:
                release.set()
            return await first, second
    try:
        first, second = asyncio.run(main())
    finally:
        for release, gate in gates:
            release.set()
    for _, gate in gates:
        gate.result(10)
    assert second.status_code == 429, second.text
    err = second.json()["error"]
    assert err["type"] == "RateLimitError" and "--max-waiting-requests 1" in err["message"]
    assert first.status_code == 200, first.text


def test_disconnect_during_upload_is_one_quiet_line(async_engine, caplog):
    app = build_app(make_context(async_engine))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "server": ("t", 80), "client": ("c", 1),
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"500")]}
    messages = iter([{"type": "http.request", "body": b'{"messages": [', "more_body": True},
                     {"type": "http.disconnect"}])
    sent = []

    async def receive():
        return next(messages)

    async def send(message):
        sent.append(message)
    with caplog.at_level(logging.DEBUG):
        asyncio.run(app(scope, receive, send))
    assert sent == []     # nobody is there: no response attempted
    records = [r for r in caplog.records if r.name.startswith("catengine")]
    assert len(records) <= 1 and all(r.levelno <= logging.INFO and not r.exc_info for r in records), records
