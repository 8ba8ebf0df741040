"""A real uvicorn server (in a thread, so the engine can be inspected): 50 concurrent streams with random
client disconnects all complete or abort, and the engine ends with every KV block and state slot free.
Then an engine failure: /health turns 503 and an in-flight stream ends with an error event."""
import asyncio
import json
import random
import threading
import time

import httpx
import pytest
import uvicorn

from catengine.server.app import build_app

from .conftest import free_port, make_context


class ThreadServer:
    def __init__(self, app):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


def wait_idle(engine, timeout=60.0):
    deadline = time.time() + timeout
    while True:
        stats = engine.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0:
            return stats
        assert time.time() < deadline, f"engine still busy: {stats}"
        time.sleep(0.05)


async def one_stream(client: httpx.AsyncClient, i: int, rng: random.Random) -> str:
    chat = i % 2 == 0
    body = {"max_tokens": rng.randint(4, 16), "stream": True, "ignore_eos": True, "temperature": 0, "seed": i,
            "n": 1 + (i % 5 == 0)}
    if chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": f"Tell me story {i}"}]
    else:
        path, body["prompt"] = "/v1/completions", f"Story number {i}:" * rng.randint(1, 8)
    disconnect_after = rng.choice([None, 0, 1, 3]) if i % 3 else None
    events = 0
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line:
                continue
            if disconnect_after is not None and events >= disconnect_after:
                return "aborted"   # leaving the block closes the connection mid-stream
            events += 1
            if line == "data: [DONE]":
                return "done"
            assert "error" not in json.loads(line[6:]), line
    raise AssertionError("stream ended without [DONE]")


def test_50_streams_with_disconnects(async_engine):
    ctx = make_context(async_engine)
    with ThreadServer(build_app(ctx)) as base:
        async def main():
            rng = random.Random(0)
            async with httpx.AsyncClient(base_url=base, timeout=120) as client:
                return await asyncio.gather(*(one_stream(client, i, rng) for i in range(50)))

        results = asyncio.run(main())
        assert len(results) == 50 and {"done", "aborted"} == set(results)
        stats = wait_idle(async_engine)
        metrics = httpx.get(base + "/metrics").text
    engine = async_engine.engine
    engine.check_integrity()
    sched = engine.scheduler
    assert not sched.running and not sched.waiting
    assert stats["num_free_kv_blocks"] == stats["num_kv_blocks"], stats
    assert all(count == 0 for count in sched.blocks.ref_count)
    assert sched.states.num_free_live == sched.states.num_live
    # disconnects reached the engine as aborts (not as requests left to run to the end)
    assert stats["request_success_total"].get("abort", 0) > 0, stats
    assert 'finished_reason="abort"} 0.0' not in metrics


def test_non_streaming_disconnect_aborts(async_engine):
    with ThreadServer(build_app(make_context(async_engine))) as base:
        before = wait_idle(async_engine)["request_success_total"].get("abort", 0)

        async def main():
            async with httpx.AsyncClient(base_url=base, timeout=120) as client:
                body = {"prompt": "x", "max_tokens": 800, "ignore_eos": True, "temperature": 0}
                task = asyncio.create_task(client.post("/v1/completions", json=body))
                deadline = time.time() + 60
                while async_engine.stats()["generation_tokens_total"] == generated:
                    assert time.time() < deadline and not task.done()
                    await asyncio.sleep(0.02)
                task.cancel()   # drops the connection while the engine is generating

        generated = async_engine.stats()["generation_tokens_total"]
        asyncio.run(main())
        stats = wait_idle(async_engine, timeout=30)
        assert stats["request_success_total"].get("abort", 0) == before + 1, stats
        assert stats["generation_tokens_total"] - generated < 800


def fail(*args, **kwargs):
    raise RuntimeError("injected failure")


def test_engine_failure_turns_health_503(async_engine_factory):
    engine = async_engine_factory()
    ctx = make_context(engine)
    with ThreadServer(build_app(ctx)) as base:
        assert httpx.get(base + "/health").status_code == 200

        async def main():
            body = {"prompt": "x", "max_tokens": 200, "stream": True, "ignore_eos": True}
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    lines = []
                    async for line in r.aiter_lines():
                        if line:
                            lines.append(line)
                        if len(lines) == 2:
                            engine.engine.runner.execute = fail
                    return lines

        lines = asyncio.run(main())
        assert lines[-1] == "data: [DONE]"
        assert "error" in json.loads(lines[-2][6:]), lines[-3:]
        assert httpx.get(base + "/health").status_code == 503
        r = httpx.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailableError"


@pytest.fixture
def async_engine_factory():
    made = []

    def make():
        from catengine.async_engine import AsyncEngine
        from catengine.tools.demo import demo_model_path
        engine = AsyncEngine(model=str(demo_model_path()), max_model_len=256, max_num_seqs=4,
                             kv_cache_memory_bytes=16 << 20)
        made.append(engine)
        return engine
    yield make
    for engine in made:
        engine.shutdown()
