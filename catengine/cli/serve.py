"""``catengine serve``: the OpenAI-compatible server, with vLLM's flag names.

A vLLM command line works after ``catengine serve`` unchanged: the flags we implement behave as in
vLLM; flags that only tune vLLM internals (attention backend, remote code, swap space...) are accepted
and logged as ignored; flags asking for something we cannot do yet (tensor parallelism above 1, fp8
e4m3 KV, speculative methods other than MTP) fail at startup with a message saying what to use instead. The vLLM
flags beyond catengine's own settings are in :mod:`catengine.cli.serve_flags`. The port is bound before
the model loads (a port in use fails at once) and the banner is printed once it is ours.
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import os
import re
import socket
import sys

from ..errors import CatEngineError, ConfigError
from . import serve_flags

log = logging.getLogger("catengine.server")

def parse_size(text: str) -> int:
    """An integer with an optional k/m/g suffix (as vLLM accepts for --max-model-len): 32k, 1M."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number like 32768 or 32k")
    value = float(m.group(1)) * {"": 1, "k": 1000, "m": 10**6, "g": 10**9}[m.group(2).lower()]
    if m.group(2) in ("K", "M", "G"):  # upper case: binary multiples, as in vLLM
        value = float(m.group(1)) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
    return int(value)


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """Engine flags shared by ``serve`` and ``generate`` (vLLM names)."""
    p.add_argument("--model", default=None, help="model directory (Hugging Face layout); omit for the demo model")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    p.add_argument("--dtype", default="auto", help="auto, float16/half, bfloat16, float32")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--max-model-len", type=parse_size, default=None, help="context length in tokens (32k ok)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="most sequences running at once")
    p.add_argument("--max-num-batched-tokens", type=parse_size, default=None, help="token budget of one step")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="fraction of GPU memory to use")
    p.add_argument("--kv-cache-memory-bytes", type=parse_size, default=None, help="exact KV cache + state bytes")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto or fp8_e5m2")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse KV blocks of shared prompt prefixes")
    p.add_argument("--kv-cache-auto-trim-ratio", type=float, default=1.05,
                   help="cap the KV cache at RATIO * max_model_len * max_num_seqs tokens; 0 disables")
    p.add_argument("--num-state-snapshots", type=int, default=None,
                   help="GDN state snapshot slots for hybrid prefix caching (default: about 10%% of the cache)")
    p.add_argument("--num-gpu-blocks-override", "--num-kv-blocks", dest="num_kv_blocks", type=int, default=None,
                   help="exact number of KV blocks (testing)")
    p.add_argument("--enforce-eager", action="store_true", help="never use CUDA graphs for decode steps")
    p.add_argument("--seed", type=int, default=0, help="seed of the per-request seeds")
    p.add_argument("--chat-template", default=None, help="a .jinja file or template text overriding the model's")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="ranks (one GPU each; gloo ranks on CPU) splitting every layer: 1, 2, 4 or 8")
    p.add_argument("--distributed-executor-backend", default="mp", choices=("mp", "external_launcher"),
                   help="mp: the engine spawns the ranks; external_launcher: torchrun-style env vars, the other "
                        "ranks run 'python -m catengine.distributed.worker'")
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1, help="only 1 is supported")
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1, help="only 1 is supported")
    serve_flags.add_engine_compat_arguments(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .serve_limits import add_limit_arguments, port
    p.add_argument("model_tag", nargs="?", default=None, help="model directory (like `vllm serve MODEL`)")
    add_engine_arguments(p)
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default all interfaces)")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use in 'model' (default: the model path)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY") or os.environ.get("CATENGINE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (env VLLM_API_KEY / CATENGINE_API_KEY)")
    p.add_argument("--enable-auto-tool-choice", action="store_true", help="let the model decide to call tools")
    p.add_argument("--tool-call-parser", default=None, help="qwen3_coder or hermes")
    p.add_argument("--reasoning-parser", default=None, help="qwen3: split <think> into reasoning_content")
    add_limit_arguments(p)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve_flags.add_server_compat_arguments(p)
    serve_flags.add_ignored_arguments(p)   # last: see its docstring


def engine_kwargs(args: argparse.Namespace) -> dict:
    """EngineConfig fields from the parsed flags; ConfigError for what cannot be honoured."""
    for name in ("pipeline_parallel_size", "data_parallel_size"):
        if getattr(args, name) != 1:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(args, name)} is not supported yet: catengine runs one GPU per "
                              f"process; drop {flag} (use a model that fits one GPU, e.g. a 4-bit checkpoint)")
    model = getattr(args, "model_tag", None) or args.model
    if getattr(args, "model_tag", None) and args.model and args.model_tag != args.model:
        raise ConfigError(f"two models given ({args.model_tag!r} and --model {args.model!r}); give one")
    return dict(model=model, tokenizer=args.tokenizer, chat_template=args.chat_template, dtype=args.dtype,
                device=args.device, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_dtype=args.kv_cache_dtype,
                block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching,
                gpu_memory_utilization=args.gpu_memory_utilization, kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                kv_cache_auto_trim_ratio=args.kv_cache_auto_trim_ratio, num_state_snapshots=args.num_state_snapshots,
                num_kv_blocks=args.num_kv_blocks, seed=args.seed, enforce_eager=args.enforce_eager,
                tensor_parallel_size=args.tensor_parallel_size,
                distributed_executor_backend=args.distributed_executor_backend, **serve_flags.engine_compat_kwargs(args))


def log_ignored(args: argparse.Namespace) -> None:
    serve_flags.log_accepted(args)


def server_config(args: argparse.Namespace, model_path: str):
    from ..server.reasoning import get_reasoning_parser
    from .serve_limits import limit_config
    from ..server.serving import ServerConfig
    from ..server.tool_parsers import get_tool_parser
    reasoning_parser = args.reasoning_parser
    if args.enable_reasoning and not reasoning_parser:
        reasoning_parser = "qwen3"   # the parser of every model catengine serves
        log.info("--enable-reasoning without --reasoning-parser: using the qwen3 reasoning parser")
    if args.tool_call_parser:
        get_tool_parser(args.tool_call_parser)
    if reasoning_parser:
        get_reasoning_parser(reasoning_parser)
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ConfigError("--enable-auto-tool-choice needs --tool-call-parser (qwen3_coder for Qwen3.5/3.6, "
                          "hermes for older Qwen)")
    if not args.response_role or not args.response_role.strip():
        raise ConfigError("--response-role must be a non-empty role name, e.g. assistant")
    names = tuple(args.served_model_name or [model_path])
    return ServerConfig(served_model_names=names, api_key=args.api_key or None,
                        enable_auto_tool_choice=args.enable_auto_tool_choice, tool_call_parser=args.tool_call_parser,
                        reasoning_parser=reasoning_parser, response_role=args.response_role,
                        default_chat_template_kwargs=args.default_chat_template_kwargs,
                        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
                        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
                        log_requests=not args.disable_log_requests, **limit_config(args))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        kwargs = engine_kwargs(args)
        log_ignored(args)
        model_label = kwargs["model"] or "demo"
        config = server_config(args, model_label)
        ssl = serve_flags.check_ssl(args)
        serve_flags.generation_defaults(args, {})   # a bad --generation-config folder fails before the model loads
    except (CatEngineError, OSError) as e:
        print(f"catengine serve: {e}", file=sys.stderr)
        return 2
    # the port first: a port in use is one line now, not after minutes of loading
    try:
        sock = listen_socket(args.host, args.port)
    except (OSError, OverflowError) as e:
        print(f"catengine serve: {describe_bind_error(args.host, args.port, e)}", file=sys.stderr)
        return 2
    try:
        from ..async_engine import AsyncEngine
        engine = AsyncEngine(**kwargs)
        gen = serve_flags.generation_defaults(args, engine.tokenizer.generation_config)
        if gen != engine.tokenizer.generation_config:
            config = dataclasses.replace(config, generation_config=gen)
    except (CatEngineError, OSError) as e:
        sock.close()
        print(f"catengine serve: {e}", file=sys.stderr)
        return 2
    from .serve_limits import http_settings
    return serve(engine, config, args.host, args.port, args.log_level, http_settings(args), sock=sock, ssl=ssl,
                 log_stats=not args.disable_log_stats)


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket (what uvicorn would open), so the address is ours before the model loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn: restart over TIME_WAIT
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def describe_bind_error(host: str, port: int, e: BaseException) -> str:
    if isinstance(e, OverflowError) or not 0 <= port <= 65535:
        return f"--port {port} is not a TCP port; use 1-65535"
    if getattr(e, "errno", None) == errno.EADDRINUSE:
        return (f"{host}:{port} is already in use (another server?); stop it or pick another --port")
    if getattr(e, "errno", None) == errno.EACCES:
        return f"no permission to listen on {host}:{port}; ports below 1024 need root: pick --port 8000"
    return f"cannot listen on {host}:{port} ({e.strerror or e}); check --host and --port"


def serve(engine, config, host: str, port: int, log_level: str = "info", http=None, *,
          sock: socket.socket | None = None, ssl: dict | None = None, log_stats: bool = True) -> int:
    from ..server.app import build_app
    from ..server.http_server import HttpSettings, build_server
    from ..server.serving import ServerContext
    from ..server.stats_log import StatsLogger
    ctx = ServerContext(engine, config)
    app = build_app(ctx)
    stats = ctx.engine_stats()
    cfg = engine.config
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if ssl else "http"
    server = build_server(app, ctx, host, port, http or HttpSettings(), log_level, ssl=ssl)
    if sock is None:
        sock = listen_socket(host, port)
    print(f"catengine serving {', '.join(config.served_model_names)} ({engine.model_path}) "
          f"at {scheme}://{shown}:{port}/v1\n"
          f"  device {cfg.device}, dtype {cfg.dtype}, KV cache {stats.get('kv_capacity_tokens', '?')} tokens "
          f"({cfg.kv_cache_dtype}, block {cfg.block_size}), max_model_len {ctx.max_model_len}, "
          f"max_num_seqs {cfg.max_num_seqs}, max_num_batched_tokens {cfg.max_num_batched_tokens}, "
          f"prefix caching {'on' if cfg.enable_prefix_caching else 'off'}\n"
          f"  tools: {config.tool_call_parser or 'off'}{' (auto)' if config.enable_auto_tool_choice else ''}, "
          f"reasoning: {config.reasoning_parser or 'off'}, api key: {'required' if config.api_key else 'none'}",
          flush=True)
    stats_logger = StatsLogger(ctx) if log_stats else None
    if stats_logger is not None:
        stats_logger.start()
    try:
        server.run(sockets=[sock])
    finally:
        if stats_logger is not None:
            stats_logger.stop()
        sock.close()
        ctx.close()
        engine.shutdown()
    return 0
