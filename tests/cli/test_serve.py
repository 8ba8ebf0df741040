"""No engine needed: the serve flags (vLLM's command lines must parse, every engine setting has a flag, what cannot
be honoured fails clearly)."""
import argparse

import pytest

from catengine.cli import serve as serve_cli
from catengine.errors import ConfigError

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
