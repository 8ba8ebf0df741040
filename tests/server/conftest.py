"""Shared fixtures of the server tests: one demo-model AsyncEngine for the in-process tests, helpers to
find a free port, start a real ``catengine serve`` subprocess and read SSE streams."""
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import pytest

# Small enough that "prompt longer than the context" tests are cheap, large enough for chat prompts
# with tool definitions.
MAX_MODEL_LEN = 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_subprocess(args: list[str], timeout: float = 240.0):
    """``catengine serve --host 127.0.0.1 --port P *args`` in a subprocess running this checkout; yields
    (base URL, log path) once /health answers, raises with the log if it exits or is not up in ``timeout`` s,
    and terminates it afterwards."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "catengine.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base, deadline = f"http://127.0.0.1:{port}", time.time() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError("catengine serve exited:\n" + Path(log.name).read_text())
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("catengine serve did not come up:\n" + Path(log.name).read_text())
            time.sleep(0.5)
        yield base, Path(log.name)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(log.name)


def sse_events(lines) -> list:
    """Parsed ``data:`` payloads of an SSE body (``"[DONE]"`` kept as the string)."""
    out = []
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture(scope="session")
def async_engine():
    from catengine.async_engine import AsyncEngine
    from catengine.tools.demo import demo_model_path
    # the random-weight demo model with the real Qwen3.5 vocabulary (ids up to 248K in the fuzz tests), not the
    # trained one model=None serves (8K vocabulary, and its 4-bit weights decode slowly on CPU)
    engine = AsyncEngine(model=str(demo_model_path()), max_model_len=MAX_MODEL_LEN, max_num_seqs=64,
                         kv_cache_memory_bytes=64 << 20)
    yield engine
    engine.shutdown()


def make_context(engine, **overrides):
    from catengine.server.serving import ServerConfig, ServerContext
    settings = dict(served_model_names=("demo",), enable_auto_tool_choice=True, tool_call_parser="qwen3_coder",
                    reasoning_parser="qwen3")
    settings.update(overrides)
    return ServerContext(engine, ServerConfig(**settings))
