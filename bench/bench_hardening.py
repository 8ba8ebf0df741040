"""Issue 25's load and abuse experiments against a loopback server (demo model, CPU), bounded in time.

    python bench/bench_hardening.py [--fuzz 300] [--max-model-len 2048]

Starts `catengine serve`'s server in this process on 127.0.0.1 (never another interface) and prints one
line per experiment: a small request's latency alone and beside a 256-prompt batch and a long prompt
(the preparation queue's turns), how fast over-long prompts and a 131,072-sequence request are refused,
a fuzz of random bodies, headers and content types (count of 5xx), slow-loris connections, uploads
abandoned halfway (log lines they cost), a burst past --max-waiting-requests, and the CPU sampler with
one sampled row among greedy ones. Figures go to bench/NOTES.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import torch  # noqa: E402

from catengine.async_engine import AsyncEngine  # noqa: E402
from catengine.server.app import build_app  # noqa: E402
from catengine.server.http_server import HttpSettings, build_server  # noqa: E402
from catengine.server.serving import ServerConfig, ServerContext  # noqa: E402

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0}


class CountingHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def start(engine, max_waiting=None):
    ctx = ServerContext(engine, ServerConfig(served_model_names=("demo",), max_waiting_requests=max_waiting,
                                             body_timeout=2.0))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = build_server(build_app(ctx), ctx, "127.0.0.1", port,
                          HttpSettings(header_timeout=2.0, shutdown_timeout=5.0, access_log=False), "warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}", port


def timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def small_latency(base: str) -> float:
    r, dt = timed(httpx.post, base + "/v1/chat/completions", json=CHAT, timeout=600)
    assert r.status_code == 200, r.text
    return dt


def beside(base: str, body: dict) -> tuple[float, float, int]:
    """(small request latency, big request latency, big status) with the big one sent first."""
    box = {}

    def big():
        box["r"], box["t"] = timed(httpx.post, base + "/v1/completions", json=body, timeout=600)
    t = threading.Thread(target=big)
    t.start()
    time.sleep(0.2)
    small = small_latency(base)
    t.join()
    return small, box["t"], box["r"].status_code


def fuzz(base: str, n: int, rng: random.Random) -> dict:
    kinds = ["application/json"] * 6 + ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
    fields = ["model", "prompt", "messages", "max_tokens", "n", "temperature", "stream", "logprobs", "stop", "seed",
              "top_k", "logit_bias", "tools", "response_format", "echo"]
    values = [None, True, -1, 0, 1, 3, 2**70, 1.5, "x", "", [], [1, 2], ["a"], {}, {"a": 1},
              [{"role": "user", "content": "hi"}], [{"role": "user"}], "a" * 5000]
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=base, timeout=120) as c:
        for i in range(n):
            body = {f: rng.choice(values) for f in rng.sample(fields, rng.randint(0, 6))}
            body.setdefault("max_tokens", 2)
            raw = json.dumps(body).encode()
            if rng.random() < 0.1:
                raw = raw[: rng.randint(0, len(raw))]
            ctype = rng.choice(kinds)
            path = rng.choice(["/v1/completions", "/v1/chat/completions", "/v1/completions/", "/v1/models"])
            headers = {} if ctype is None else {"content-type": ctype}
            try:
                r = c.post(path, content=raw, headers=headers) if path != "/v1/models" else c.get(path)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            except httpx.HTTPError as e:
                statuses[-1] = statuses.get(-1, 0) + 1
                print("  transport error:", type(e).__name__, e)
    return statuses


def slow_loris(port: int, count: int, header_timeout: float) -> tuple[int, float]:
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    t0 = time.perf_counter()
    closed = 0
    for s in socks:
        s.settimeout(header_timeout + 5 - (time.perf_counter() - t0))
        try:
            while s.recv(1024):
                pass
            closed += 1
        except (socket.timeout, ValueError):
            pass
        except ConnectionResetError:
            closed += 1
        s.close()
    return closed, time.perf_counter() - t0


def abandoned_uploads(port: int, count: int) -> None:
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{\"messages\": [")
        time.sleep(0.05)
        s.close()
    time.sleep(0.5)


async def burst(base: str, count: int) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=600) as c:
        rs = await asyncio.gather(*(c.post("/v1/chat/completions", json=CHAT) for _ in range(count)))
    out: dict[int, int] = {}
    for r in rs:
        out[r.status_code] = out.get(r.status_code, 0) + 1
    return out


def shutdown_during_streams(server, thread, base: str, count: int) -> tuple[list[str], float]:
    """What SIGTERM does, without a signal (the server runs in a thread): streams started, then should_exit."""
    last: list[list[str]] = [[] for _ in range(count)]

    def stream(i):
        body = {"prompt": f"story {i}", "max_tokens": 1900, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    last[i] = (last[i] + [line])[-2:]
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    while not all(last):
        time.sleep(0.1)
    t0 = time.perf_counter()
    server.should_exit = True
    thread.join(60)
    took = time.perf_counter() - t0
    for t in threads:
        t.join(10)
    finals = []
    for lines in last:
        finals.append("[DONE]" if lines[-1] == "data: [DONE]" else "cut")
        finals.append("error" if '"error"' in lines[0] else "other")
    return finals, took


def sampler_rows(vocab: int) -> tuple[float, float]:
    from catengine.kernels.sampling import naive
    B = 64
    logits = torch.randn(B, vocab)
    z = torch.zeros(B)
    args = (torch.zeros(B, dtype=torch.int32), torch.ones(B), torch.zeros(B), torch.arange(B), torch.zeros(B))
    greedy = timed(naive.sample_tokens, logits, z, *args)[1]
    one = z.clone()
    one[0] = 0.7
    k = args[0].clone()
    k[0] = 20
    sampled = timed(naive.sample_tokens, logits, one, k, *args[1:])[1]
    return greedy, sampled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fuzz", type=int, default=300)
    ap.add_argument("--max-model-len", type=int, default=2048)
    args = ap.parse_args()
    rng = random.Random(0)
    handler = CountingHandler()
    logging.getLogger("catengine").addHandler(handler)
    logging.getLogger("catengine").setLevel(logging.INFO)
    engine = AsyncEngine(max_model_len=args.max_model_len, max_num_seqs=64, kv_cache_memory_bytes=64 << 20)
    server, thread, base, port = start(engine)
    try:
        small_latency(base)   # warm-up
        alone = min(small_latency(base) for _ in range(3))
        print(f"small chat request alone: {alone:.2f} s")
        batch = {"prompt": [f"Item {i}: " + "words " * 40 for i in range(256)], "max_tokens": 1, "temperature": 0}
        small, big, status = beside(base, batch)
        print(f"beside a 256-prompt completions batch ({status}, {big:.1f} s): small request {small:.2f} s")
        limit = args.max_model_len * engine.tokenizer.max_token_chars
        long_prompt = {"prompt": "word " * (args.max_model_len // 2), "max_tokens": 1}
        small, big, status = beside(base, long_prompt)
        print(f"beside a {args.max_model_len // 2}-token prompt ({status}, {big:.1f} s): small request {small:.2f} s")
        for chars in (limit + 1, 30 << 20):
            r, dt = timed(httpx.post, base + "/v1/completions", json={"prompt": "a" * chars, "max_tokens": 1},
                          timeout=600)
            print(f"prompt of {chars} characters: {r.status_code} in {dt:.2f} s")
        huge = {"prompt": ["hi"] * 1024, "n": 128, "max_tokens": 1}
        r, dt = timed(httpx.post, base + "/v1/completions", json=huge, timeout=600)
        print(f"1,024 prompts x n=128: {r.status_code} in {dt:.2f} s")
        before = len(handler.records)
        statuses, dt = timed(fuzz, base, args.fuzz, rng)
        print(f"fuzz, {args.fuzz} bodies in {dt:.0f} s: statuses {dict(sorted(statuses.items()))}, "
              f"5xx {sum(v for k, v in statuses.items() if k >= 500)}, {len(handler.records) - before} log lines")
        closed, dt = slow_loris(port, 50, 2.0)
        print(f"50 slow-loris connections: {closed} closed by the server in {dt:.1f} s; "
              f"a request meanwhile: {small_latency(base):.2f} s")
        before = len(handler.records)
        abandoned_uploads(port, 20)
        new = handler.records[before:]
        print(f"20 uploads abandoned halfway: {len(new)} log lines, {sum(bool(r.exc_info) for r in new)} tracebacks")
    finally:
        server.should_exit = True
        thread.join(30)
    server, thread, base, port = start(engine, max_waiting=8)
    try:
        print(f"burst of 40 with --max-waiting-requests 8: {asyncio.run(burst(base, 40))}")
    finally:
        server.should_exit = True
        thread.join(30)
    server, thread, base, port = start(engine)
    try:
        finals, took = shutdown_during_streams(server, thread, base, 20)
        print(f"shutdown during 20 long streams (--shutdown-timeout {server.shutdown_timeout:g}): {took:.1f} s, "
              f"{finals.count('error')} final error events, {finals.count('[DONE]')} [DONE]")
    finally:
        server.should_exit = True
        thread.join(30)
        engine.shutdown()
    greedy, sampled = sampler_rows(engine.vocab_size)
    print(f"CPU sampler twin, 64 rows x {engine.vocab_size}: all greedy {greedy * 1e3:.0f} ms, "
          f"one top-k row {sampled * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
