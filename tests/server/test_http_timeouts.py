"""Issue 25 on real sockets (loopback): a connection that sends nothing or trickles its headers is closed,
a body shorter than its Content-Length gets 408, idle keep-alive connections close, past
--limit-concurrency the answer is 503; and `catengine serve` on SIGTERM stops long streams at
--shutdown-timeout with a final event and exits 0."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from catengine.server.app import build_app
from catengine.server.http_server import HttpSettings, build_server

from .conftest import free_port, make_context


class Served:
    def __init__(self, app, ctx, settings):
        self.port = free_port()
        self.server = build_server(app, ctx, "127.0.0.1", self.port, settings, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return s


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(the server closed the connection within ``seconds``, what it sent before)."""
    sock.settimeout(seconds)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True, data
            data += chunk
    except socket.timeout:
        return False, data
    except ConnectionResetError:
        return True, data


@pytest.fixture(scope="module")
def served(async_engine):
    ctx = make_context(async_engine, body_timeout=1.0)
    settings = HttpSettings(timeout_keep_alive=1.0, header_timeout=1.0, limit_concurrency=4, shutdown_timeout=None)
    with Served(build_app(ctx), ctx, settings) as s:
        yield s


def test_silent_connection_is_closed(served):
    with served.connect() as s:
        closed, _ = closed_within(s, 5)
    assert closed


def test_slow_loris_headers_are_cut(served):
    with served.connect() as s:
        start = time.time()
        for piece in (b"GET /v1/models HTTP/1.1\r\n", b"Host: x\r\n", b"X-a: 1\r\n", b"X-b: 1\r\n"):
            try:
                s.sendall(piece)
            except OSError:
                break
            time.sleep(0.4)
        closed, _ = closed_within(s, 5)
    assert closed and time.time() - start < 5


def test_body_shorter_than_content_length_gets_408(served):
    with served.connect() as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"messages\": [")
        closed, data = closed_within(s, 5)
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"did not arrive" in data and closed


def test_idle_keep_alive_connection_closes(served):
    with served.connect() as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        closed, data = closed_within(s, 5)
    assert data.startswith(b"HTTP/1.1 200") and closed


def test_past_limit_concurrency_is_503(served):
    socks = [served.connect() for _ in range(4)]
    try:
        for s in socks:     # four connections open (their headers not finished)
            s.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.2)
        with served.connect() as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            _, data = closed_within(s, 3)
        assert data.startswith(b"HTTP/1.1 503"), data[:100]
    finally:
        for s in socks:
            s.close()


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("the server did not start")


def test_sigterm_stops_long_streams_at_the_deadline_and_exits_0(tmp_path):
    import httpx
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "catengine.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--max-model-len", "2048", "--shutdown-timeout", "1", "--disable-uvicorn-access-log"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_port(port, proc)
        events: list[list[str]] = [[] for _ in range(3)]

        def stream(i):
            body = {"prompt": f"story {i}", "max_tokens": 2000, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        events[i].append(line)
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.time() + 60
        while not all(events) and time.time() < deadline:
            time.sleep(0.1)
        assert all(events), "the streams did not start"
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        took = time.time() - start
        for t in threads:
            t.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0 and took < 1 + 5 + 5, (rc, took)
    for lines in events:
        assert lines[-1] == "data: [DONE]", lines[-3:]
        final = json.loads(lines[-2][len("data: "):])
        assert final["error"]["code"] == 503 and "shutting down" in final["error"]["message"], final
