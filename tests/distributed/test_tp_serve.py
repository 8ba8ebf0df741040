"""``catengine serve --tensor-parallel-size 2`` on the CPU answers a completion and leaves no worker behind
when it is stopped (SIGTERM), or when a worker dies (/health turns 503)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import serve_subprocess

from .helpers import tiny_checkpoint


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _gone(pids, timeout: float = 20.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(Path(f"/proc/{p}").exists() and "zombie" not in Path(f"/proc/{p}/status").read_text()
                   for p in pids):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc to find the worker processes")
def test_serve_tp2_answers_and_stops_every_rank(tmp_path):
    path = tiny_checkpoint(tmp_path)
    args = ["--model", str(path), "--device", "cpu", "-tp", "2", "--num-kv-blocks", "32", "--block-size", "4",
            "--max-model-len", "64"]
    with serve_subprocess(args) as (base, log):
        r = httpx.post(base + "/v1/completions", json={"model": str(path), "prompt": [5, 17, 33, 2],
                                                       "max_tokens": 4, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        text = log.read_text()
        assert "tensor parallel rank 1/2" in text
        # the server is the only python child of the test; its workers are its children
        servers = [p for p in _children(os.getpid()) if "catengine.cli" in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(servers) == 1
        workers = [p for p in _children(servers[0]) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(workers) == 1
        os.kill(workers[-1], signal.SIGKILL)       # a rank dies: the next request fails and /health says so
        r = httpx.post(base + "/v1/completions", json={"model": str(path), "prompt": [5, 17], "max_tokens": 2},
                       timeout=60)
        assert r.status_code >= 500
        assert httpx.get(base + "/health", timeout=10).status_code == 503
        os.kill(servers[0], signal.SIGTERM)
        assert _gone([servers[0], *workers]), "a rank outlived the server"
