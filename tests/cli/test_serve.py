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


def test_tensor_parallel_flags_reach_the_config():
    kw = serve_cli.engine_kwargs(parse("-tp 4 --distributed-executor-backend external_launcher"))
    assert kw["tensor_parallel_size"] == 4 and kw["distributed_executor_backend"] == "external_launcher"
    assert serve_cli.engine_kwargs(parse("--tensor-parallel-size 2"))["tensor_parallel_size"] == 2


@pytest.mark.parametrize("line,match", [
    ("--pipeline-parallel-size 2", "pipeline-parallel-size"),
    ("--data-parallel-size 2", "data-parallel-size"),
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


# ------------------------------------------------------------------ issue 25: limits, start-up errors

def test_limit_flags_and_their_defaults():
    from catengine.cli.serve_limits import http_settings
    args = parse("")
    cfg = serve_cli.server_config(args, "m")
    assert cfg.cors_origins == () and cfg.max_waiting_requests is None and cfg.body_timeout == 30.0
    http = http_settings(args)
    assert (http.timeout_keep_alive, http.header_timeout, http.limit_concurrency, http.shutdown_timeout,
            http.access_log) == (5.0, 10.0, 1024, 20.0, True)
    args = parse("--allowed-origins [\"https://ui.example\"] --allow-credentials --max-waiting-requests 50 "
                 "--max-sequences-per-request 64 --shutdown-timeout 0 --header-timeout 3 --limit-concurrency 0 "
                 "--disable-uvicorn-access-log --max-request-bytes 1000 --body-timeout 2.5")
    cfg = serve_cli.server_config(args, "m")
    assert cfg.cors_origins == ("https://ui.example",) and cfg.cors_credentials
    assert (cfg.max_waiting_requests, cfg.max_sequences_per_request, cfg.max_request_bytes,
            cfg.body_timeout) == (50, 64, 1000, 2.5)
    http = http_settings(args)
    assert (http.shutdown_timeout, http.header_timeout, http.limit_concurrency, http.access_log) == (None, 3.0,
                                                                                                 None, False)


@pytest.mark.parametrize("line,match", [("--port 99999", "not a TCP port"), ("--port x", "not a TCP port"),
                                        ("--shutdown-timeout -1", "seconds"), ("--timeout-keep-alive 0", "> 0"),
                                        ("--max-waiting-requests -3", "positive")])
def test_bad_limit_values_are_one_line(line, match, capsys):
    with pytest.raises(SystemExit) as e:
        parse(line)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert match in err[-1] and "Traceback" not in "\n".join(err)


def test_api_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("CATENGINE_API_KEY", "from-env")
    assert serve_cli.server_config(parse(""), "m").api_key == "from-env"
    monkeypatch.setenv("VLLM_API_KEY", "vllm-env")
    assert serve_cli.server_config(parse(""), "m").api_key == "vllm-env"
    assert serve_cli.server_config(parse("--api-key flag"), "m").api_key == "flag"


def _broken_model(tmp_path, breakage: str):
    import shutil

    from catengine.tools.demo import demo_model_path
    src = demo_model_path()
    dst = tmp_path / "model"
    dst.mkdir()
    for f in src.iterdir():
        if f.name == "model.safetensors" and breakage == "config":
            (dst / f.name).symlink_to(f)
        elif f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    weights = dst / "model.safetensors"
    if breakage == "truncated":
        with open(src / "model.safetensors", "rb") as fin, open(weights, "wb") as fout:
            fout.write(fin.read(src.joinpath("model.safetensors").stat().st_size // 2))
    elif breakage == "garbage":
        weights.write_bytes(b"this is not a safetensors file" * 10)
    elif breakage == "config":
        (dst / "config.json").write_text('{"model_type": "qwen3_5", ')
    return dst


@pytest.mark.parametrize("breakage,match", [("truncated", "is truncated"), ("garbage", "not a safetensors file"),
                                            ("config", "is not valid JSON")])
def test_broken_checkpoint_is_one_clear_line(tmp_path, capsys, breakage, match):
    model = _broken_model(tmp_path, breakage)
    rc = serve_cli.run(parse(f"--model {model} --device cpu --port 8123"))
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("catengine serve:")]
    assert rc != 0 and len(err) == 1 and match in err[0], err


def test_readme_documents_the_key_from_the_environment_and_the_limits():
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for needle in ("CATENGINE_API_KEY", "VLLM_API_KEY", "--allowed-origins", "--shutdown-timeout",
                   "--max-waiting-requests", "--limit-concurrency", "--header-timeout"):
        assert needle in text, needle
