"""vLLM's flags of issue 24 under ``catengine serve`` (catengine/cli/serve_flags.py), no engine needed: each one is
parsed by the serve parser (never argparse's top-level usage), does what it does in vLLM where catengine has the
feature, and otherwise fails with a ConfigError naming the flag and why."""
import argparse
import json
import shlex

import pytest

from catengine.cli import main, serve_flags
from catengine.cli import serve as serve_cli
from catengine.errors import ConfigError

# the seed's MTP line minus the speculation (test_speculation_flags_become_the_engine_setting has that part)
VLLM_LINE = ("--model /m --max-model-len 32k --mamba-ssm-cache-dtype float32 --max-cudagraph-capture-size 16 "
             "--default-chat-template-kwargs '{\"enable_thinking\": false}' --enable-reasoning "
             "--structured-outputs-config '{\"backend\": \"xgrammar\"}' --language-model-only "
             "--max-num-partial-prefills 2 --enable-prompt-tokens-details --return-tokens-as-token-ids "
             "--response-role bot --generation-config vllm --override-generation-config '{\"temperature\": 0.5}' "
             "--disable-log-requests --disable-log-stats --swap-space 4")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    serve_cli.add_arguments(p)
    return p


def parse(line: str) -> argparse.Namespace:
    return parser().parse_args(shlex.split(line))


def test_vllm_line_parses_and_each_flag_lands(monkeypatch):
    line = VLLM_LINE
    known = {a for action in parser()._actions for a in action.option_strings}
    if "--structured-outputs-config" not in known:   # another helper's flag (issue 24, structured outputs)
        line = line.replace("--structured-outputs-config '{\"backend\": \"xgrammar\"}' ", "")
    args = parse(line)
    kw = serve_cli.engine_kwargs(args)
    assert kw["cuda_graph_sizes"] == (1, 2, 4, 8, 16) and kw["max_model_len"] == 32000
    cfg = serve_cli.server_config(args, "m")
    assert cfg.reasoning_parser == "qwen3"   # --enable-reasoning alone: the parser of Qwen3.5/3.6
    assert cfg.default_chat_template_kwargs == {"enable_thinking": False} and cfg.response_role == "bot"
    assert cfg.enable_prompt_tokens_details and cfg.return_tokens_as_token_ids and not cfg.log_requests
    assert serve_flags.generation_defaults(args, {"temperature": 0.7, "top_k": 20}) == {"temperature": 0.5}
    assert args.language_model_only and args.max_num_partial_prefills == "2" and args.disable_log_stats


def test_cuda_graph_sizes_follow_vllm():
    sizes = lambda line: serve_cli.engine_kwargs(parse(line))["cuda_graph_sizes"]  # noqa: E731
    assert sizes("") is None                                           # the default: 1, 2, 4, 8, ... 256
    assert sizes("--cuda-graph-sizes 24") == (1, 2, 4, 8, 16, 24)      # one value: the pattern up to it
    assert sizes("--cuda-graph-sizes 3 1 8 8") == (1, 3, 8)            # several: exactly those
    assert sizes("--cuda-graph-sizes 1 4 32 --max-cudagraph-capture-size 8") == (1, 4)
    assert sizes("--max-cudagraph-capture-size 2") == (1, 2)
    with pytest.raises(ConfigError, match="--cuda-graph-sizes"):
        sizes("--cuda-graph-sizes 0")


def test_graph_sizes_reach_the_runner():
    from catengine.config import EngineConfig
    from catengine.cuda_graphs import capture_sizes
    assert capture_sizes(None, 20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes((1, 4, 64, 2), 16) == [1, 2, 4]           # never above max_num_seqs
    assert capture_sizes((64,), 16) == []
    EngineConfig(cuda_graph_sizes=(1, 2)).validate()
    with pytest.raises(ConfigError, match="cuda_graph_sizes"):
        EngineConfig(cuda_graph_sizes=(0,)).validate()


@pytest.mark.parametrize("line,match", [
    ("--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 2}'",
     "method 'ngram' is not supported: catengine drafts with the checkpoint's own MTP head"),
    ("--speculative-config '{\"method\": \"mtp\"}'", "needs num_speculative_tokens"),
    ("--speculative-config '{\"method\": \"qwen3_next_mtp\", \"num_speculative_tokens\": 9}'",
     "num_speculative_tokens must be an integer in \\[1, 8\\]"),
    ("--speculative-config '{\"method\": \"magic\"}'", "not a vLLM speculative method"),
    ("--speculative-config '{\"num_speculative_tokens\": 2}' --num-speculative-tokens 3", "disagrees"),
])
def test_refused_flags_name_themselves_and_why(line, match):
    with pytest.raises(ConfigError, match=match):
        serve_cli.engine_kwargs(parse(line))


def test_enable_expert_parallel_is_real():
    assert serve_cli.engine_kwargs(parse("--enable-expert-parallel"))["enable_expert_parallel"] is True
    assert serve_cli.engine_kwargs(parse(""))["enable_expert_parallel"] is False


@pytest.mark.parametrize("line,want", [("", "auto"), ("--mamba-ssm-cache-dtype float32", "float32"),
                                       ("--mamba-ssm-cache-dtype float16", "float16"),
                                       ("--mamba-cache-dtype bfloat16", "bfloat16"),
                                       ("--mamba-ssm-cache-dtype auto", "auto")])
def test_mamba_ssm_cache_dtype_is_real(line, want):
    assert serve_cli.engine_kwargs(parse(line))["mamba_ssm_cache_dtype"] == want


def test_bad_mamba_ssm_cache_dtype_is_a_config_error():
    from catengine.config import EngineConfig
    with pytest.raises(ConfigError, match="mamba_ssm_cache_dtype 'int8' is not supported; use auto, float32"):
        EngineConfig(**serve_cli.engine_kwargs(parse("--mamba-ssm-cache-dtype int8"))).validate()


def test_speculation_off_is_accepted():
    assert serve_flags.speculative_config(parse("--speculative-config '{\"num_speculative_tokens\": 0}'")) is None
    assert serve_flags.speculative_config(parse("")) is None


def test_speculation_flags_become_the_engine_setting():
    kw = serve_cli.engine_kwargs(parse("--speculative-config '{\"method\": \"qwen3_5_mtp\", "
                                       "\"num_speculative_tokens\": 2}'"))
    assert kw["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    kw = serve_cli.engine_kwargs(parse("--num-speculative-tokens 3 --speculative-disable-by-batch-size 8"))
    assert kw["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3, "disable_by_batch_size": 8}
    assert serve_cli.engine_kwargs(parse(""))["speculative_config"] is None


def test_refusal_is_one_line_from_serve_not_the_top_level_usage(capsys):
    rc = main(["serve", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}'])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("catengine serve: --speculative-config") and "usage: catengine" not in err
    with pytest.raises(SystemExit):
        main(["serve", "--speculative-config", "{not json"])
    err = capsys.readouterr().err
    assert "usage: catengine serve" in err and "--speculative-config takes a JSON object" in err


def test_generation_config_sources(tmp_path):
    model = {"temperature": 0.7, "top_p": 0.8}
    assert serve_flags.generation_defaults(parse(""), model) == model
    assert serve_flags.generation_defaults(parse("--generation-config vllm"), model) == {}
    assert serve_flags.generation_defaults(parse("--override-generation-config '{\"top_p\": 0.5}'"), model) == \
        {"temperature": 0.7, "top_p": 0.5}
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": 5}))
    assert serve_flags.generation_defaults(parse(f"--generation-config {tmp_path}"), model) == {"top_k": 5}
    with pytest.raises(ConfigError, match="--generation-config .*cannot read"):
        serve_flags.generation_defaults(parse(f"--generation-config {tmp_path / 'none'}"), model)


def test_ssl_files_checked_before_the_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="--ssl-keyfile needs --ssl-certfile"):
        serve_flags.check_ssl(parse("--ssl-keyfile k.pem"))
    with pytest.raises(ConfigError, match="--ssl-certfile .*no such file"):
        serve_flags.check_ssl(parse(f"--ssl-certfile {tmp_path / 'c.pem'}"))
    (tmp_path / "c.pem").write_text("x")
    (tmp_path / "k.pem").write_text("x")
    assert serve_flags.check_ssl(parse(f"--ssl-certfile {tmp_path / 'c.pem'} --ssl-keyfile {tmp_path / 'k.pem'}")) \
        == {"ssl_certfile": str(tmp_path / "c.pem"), "ssl_keyfile": str(tmp_path / "k.pem")}


def test_port_in_use_fails_fast_with_one_line(capsys):
    import time
    busy = serve_cli.listen_socket("127.0.0.1", 0)
    port = busy.getsockname()[1]
    try:
        t0 = time.perf_counter()
        rc = main(["serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"])
        elapsed = time.perf_counter() - t0
    finally:
        busy.close()
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == f"catengine serve: 127.0.0.1:{port} is already in use (another server?); stop it " \
                              f"or pick another --port"
    assert elapsed < 5   # before the model loads (the demo model takes longer than this)


def test_ignored_flags_are_logged_and_yield_to_real_ones(caplog):
    import logging
    args = parse("--swap-space 4 --trust-remote-code")
    with caplog.at_level(logging.WARNING, logger="catengine.server"):
        serve_flags.log_accepted(args)
    text = caplog.text
    assert "--swap-space 4 is a vLLM-internal setting" in text and "--trust-remote-code" in text
    assert "--attention-backend" not in text   # only the flags given
    p = argparse.ArgumentParser()
    p.add_argument("--swap-space", type=int, default=0)   # a flag that gained a meaning keeps it
    serve_flags.add_ignored_arguments(p)
    args = p.parse_args(["--swap-space", "3"])
    assert args.swap_space == 3 and "--swap-space" not in args.ignored_flags


def test_structured_outputs_flags_pick_the_backend():
    kw = serve_cli.engine_kwargs(parse("--structured-outputs-config '{\"backend\": \"xgrammar\", "
                                       "\"disable_any_whitespace\": true, \"disable_fallback\": true}'"))
    assert kw["structured_outputs_backend"] == "xgrammar" and kw["structured_outputs_disable_any_whitespace"]
    assert serve_cli.engine_kwargs(parse("--guided-decoding-backend auto"))["structured_outputs_backend"] == "auto"
    for line in ("--guided-decoding-backend guidance", "--structured-outputs-config '{\"backend\": \"outlines\"}'"):
        with pytest.raises(ConfigError, match="xgrammar only"):
            serve_cli.engine_kwargs(parse(line))
    with pytest.raises(ConfigError, match="not a JSON object"):
        serve_cli.engine_kwargs(parse("--structured-outputs-config xgrammar"))
