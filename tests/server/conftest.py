"""Shared fixtures of the server tests: one demo-model AsyncEngine for the in-process tests, helpers to
find a free port and to read SSE streams."""
import json
import socket

import pytest

# Small enough that "prompt longer than the context" tests are cheap, large enough for chat prompts
# with tool definitions.
MAX_MODEL_LEN = 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
