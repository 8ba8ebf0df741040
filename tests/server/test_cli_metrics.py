"""No engine needed: the serve flags (vLLM's command lines must parse), request decoding, the
Prometheus exposition."""
import argparse
import math
import re

import pytest

from catengine.errors import ConfigError, InvalidRequest
from catengine.metrics import Metrics
from catengine.server import cli as serve_cli
from catengine.server.protocol import ChatCompletionRequest, CompletionRequest, decode_request, error_body

VLLM_LINE = ("--model /path/Qwen3.5-27B-AWQ --served-model-name Qwen3.5-27B-AWQ --tensor-parallel-size 1 "
             "--gpu-memory-utilization 0.88 --max-model-len 262144 --max-num-seqs 1 --max-num-batched-tokens 16384 "
             "--attention-backend FLASH_ATTN_V100 --enable-auto-tool-choice --tool-call-parser qwen3_coder "
             "--kv-cache-dtype fp8_e5m2 --host 0.0.0.0 --port 8000 --reasoning-parser qwen3 --api-key k "
             "--chat-template t.jinja --trust-remote-code --enforce-eager --dtype float16 --block-size 32 "
             "--no-enable-prefix-caching --seed 3 --disable-log-requests --swap-space 4")


def parse(line: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve_cli.add_arguments(p)
    return p.parse_args(line.split())


def test_vllm_command_line_parses():
    args = parse(VLLM_LINE)
    kw = serve_cli.engine_kwargs(args)
    assert kw["model"] == "/path/Qwen3.5-27B-AWQ" and kw["max_model_len"] == 262144
    assert kw["gpu_memory_utilization"] == 0.88 and kw["max_num_seqs"] == 1
    assert kw["max_num_batched_tokens"] == 16384 and kw["kv_cache_dtype"] == "fp8_e5m2"
    assert kw["enable_prefix_caching"] is False and kw["enforce_eager"] is True and kw["block_size"] == 32
    assert kw["dtype"] == "float16" and kw["seed"] == 3 and kw["chat_template"] == "t.jinja"
    cfg = serve_cli.server_config(args, kw["model"])
    assert cfg.served_model_names == ("Qwen3.5-27B-AWQ",) and cfg.api_key == "k"
    assert cfg.tool_call_parser == "qwen3_coder" and cfg.enable_auto_tool_choice and cfg.reasoning_parser == "qwen3"
    assert (args.host, args.port, args.attention_backend, args.trust_remote_code) == ("0.0.0.0", 8000,
                                                                                      "FLASH_ATTN_V100", True)


def test_every_engine_setting_has_a_flag():
    import dataclasses

    from catengine.config import EngineConfig
    defaults = serve_cli.engine_kwargs(parse(""))
    assert set(defaults) == {f.name for f in dataclasses.fields(EngineConfig)}
    # the flag defaults are the engine's defaults
    assert all(defaults[f.name] == f.default for f in dataclasses.fields(EngineConfig))
    kw = serve_cli.engine_kwargs(parse("--kv-cache-auto-trim-ratio 0 --num-state-snapshots 5 "
                                       "--num-gpu-blocks-override 77"))
    assert (kw["kv_cache_auto_trim_ratio"], kw["num_state_snapshots"], kw["num_kv_blocks"]) == (0.0, 5, 77)


def test_positional_model_and_sizes():
    args = parse("/m --max-model-len 32k --max-num-batched-tokens 8K")
    kw = serve_cli.engine_kwargs(args)
    assert kw["model"] == "/m" and kw["max_model_len"] == 32000 and kw["max_num_batched_tokens"] == 8192


@pytest.mark.parametrize("line,match", [
    ("--tensor-parallel-size 4", "tensor-parallel-size 4 is not supported"),
    ("-tp 2", "tensor-parallel-size 2 is not supported"),
    ("--pipeline-parallel-size 2", "pipeline-parallel-size"),
])
def test_unsupported_parallelism_fails_clearly(line, match):
    with pytest.raises(ConfigError, match=match):
        serve_cli.engine_kwargs(parse(line))


def test_parser_flags_checked():
    with pytest.raises(ConfigError, match="use one of"):
        serve_cli.server_config(parse("--tool-call-parser nope"), "m")
    with pytest.raises(ConfigError, match="needs --tool-call-parser"):
        serve_cli.server_config(parse("--enable-auto-tool-choice"), "m")
    with pytest.raises(ConfigError, match="use one of"):
        serve_cli.server_config(parse("--reasoning-parser nope"), "m")


def test_decode_request_errors():
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        decode_request(b"{", ChatCompletionRequest)
    with pytest.raises(InvalidRequest, match="empty"):
        decode_request(b"", ChatCompletionRequest)
    with pytest.raises(InvalidRequest, match="temperature"):
        decode_request(b'{"messages": [], "temperature": "hot"}', ChatCompletionRequest)
    with pytest.raises(InvalidRequest, match="prompt"):
        decode_request(b'{"max_tokens": 3}', CompletionRequest)
    req = decode_request(b'{"prompt": [1, 2], "unknown_field": {"x": 1}, "echo": true}', CompletionRequest)
    assert req.prompt == [1, 2] and req.echo


def test_error_body_shape():
    import json
    body = json.loads(error_body(400, "bad", "n"))
    assert body == {"error": {"message": "bad", "type": "BadRequestError", "param": "n", "code": 400}}


def test_metrics_exposition():
    m = Metrics('my "model"')
    m.observe_first_token(0.05)
    m.observe_token_gap(0.02, 2)
    m.observe_finished("stop", 10, 5, 1.2)
    m.observe_finished("length", 3, 7, 0.4)
    text = m.render({"num_running": 2, "num_waiting": 1, "kv_cache_usage": 0.25, "prefix_cache_queries": 64,
                     "prefix_cache_hits": 32})
    label = 'model_name="my \\"model\\""'
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
                 "spec_decode_num_drafts_total", "spec_decode_num_accepted_tokens_total"):
        assert re.search(rf"^vllm:{name}\{{{re.escape(label)}\}} \S+$", text, re.M), name
    assert f"vllm:num_requests_running{{{label}}} 2.0" in text
    assert f"vllm:kv_cache_usage_perc{{{label}}} 0.25" in text
    assert f"vllm:prompt_tokens_total{{{label}}} 13.0" in text
    assert f"vllm:generation_tokens_total{{{label}}} 12.0" in text
    assert f'vllm:request_success_total{{{label},finished_reason="stop"}} 1.0' in text
    assert f"vllm:time_to_first_token_seconds_count{{{label}}} 1.0" in text
    assert f"vllm:inter_token_latency_seconds_count{{{label}}} 2.0" in text
    assert f'vllm:e2e_request_latency_seconds_bucket{{{label},le="+Inf"}} 2.0' in text
    assert f'vllm:e2e_request_latency_seconds_bucket{{{label},le="0.5"}} 1.0' in text
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    # every sample line is NAME{labels} VALUE with a parseable value
    for line in text.splitlines():
        if not line.startswith("#"):
            value = line.rsplit(" ", 1)[1]
            assert value in ("+Inf", "NaN") or math.isfinite(float(value)), line
