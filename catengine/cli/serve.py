"""``catengine serve``: the OpenAI-compatible server, with vLLM's flag names.

A vLLM command line works after ``catengine serve`` unchanged: the flags we implement behave as in
vLLM; flags that only tune vLLM internals (attention backend, remote code, logging, swap space...)
are accepted and logged as ignored; flags asking for something we cannot do yet (tensor parallelism
above 1, fp8 e4m3 KV) fail at startup with a message saying what to use instead.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys

from ..errors import CatEngineError, ConfigError

log = logging.getLogger("catengine.server")

# vLLM flags that tune vLLM internals: accepted (with or without a value) and logged as ignored.
IGNORED_WITH_VALUE = ("--attention-backend", "--swap-space", "--distributed-executor-backend", "--load-format",
                      "--download-dir", "--revision", "--tokenizer-mode", "--max-seq-len-to-capture",
                      "--compilation-config", "--max-log-len", "--uvicorn-log-level", "--quantization",
                      "--max-logprobs",
                      "--cpu-offload-gb", "--override-generation-config", "--generation-config",
                      "--scheduling-policy", "--tokenizer-pool-size", "--code-revision", "--limit-mm-per-prompt",
                      "--mm-processor-kwargs", "--hf-overrides", "--config-format", "--response-role",
                      "--root-path", "--num-scheduler-steps", "--long-prefill-token-threshold")
IGNORED_FLAGS = ("--trust-remote-code", "--disable-log-requests", "--disable-log-stats", "--enable-log-requests",
                 "--disable-custom-all-reduce", "--enable-chunked-prefill", "--no-enable-chunked-prefill",
                 "--disable-frontend-multiprocessing", "--enable-prompt-tokens-details", "--disable-fastapi-docs",
                 "--enable-server-load-tracking", "--disable-uvicorn-access-log", "--async-scheduling",
                 "--enable-force-include-usage", "--return-tokens-as-token-ids")


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
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="only 1 is supported for now")
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1, help="only 1 is supported")
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1, help="only 1 is supported")
    p.add_argument("--structured-outputs-config", default=None,
                   help='structured outputs, JSON: {"backend": "auto" | "xgrammar", "disable_any_whitespace": bool}')
    p.add_argument("--guided-decoding-backend", default=None, help="older spelling of the structured outputs backend")
    for flag in IGNORED_WITH_VALUE:
        p.add_argument(flag, default=None, help=argparse.SUPPRESS)
    for flag in IGNORED_FLAGS:
        p.add_argument(flag, action="store_true", default=None, help=argparse.SUPPRESS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_tag", nargs="?", default=None, help="model directory (like `vllm serve MODEL`)")
    add_engine_arguments(p)
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default all interfaces)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use in 'model' (default: the model path)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY") or os.environ.get("CATENGINE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (env VLLM_API_KEY / CATENGINE_API_KEY)")
    p.add_argument("--enable-auto-tool-choice", action="store_true", help="let the model decide to call tools")
    p.add_argument("--tool-call-parser", default=None, help="qwen3_coder or hermes")
    p.add_argument("--reasoning-parser", default=None, help="qwen3: split <think> into reasoning_content")
    p.add_argument("--allowed-origins", type=_json_list, default=["*"], help='CORS origins, JSON list (["*"])')
    p.add_argument("--allowed-methods", type=_json_list, default=["*"], help="CORS methods, JSON list")
    p.add_argument("--allowed-headers", type=_json_list, default=["*"], help="CORS headers, JSON list")
    p.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def _json_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON list of strings, e.g. '[\"*\"]'")
    return value


def engine_kwargs(args: argparse.Namespace) -> dict:
    """EngineConfig fields from the parsed flags; ConfigError for what cannot be honoured."""
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
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
                structured_outputs_backend=structured_outputs_backend(args),
                structured_outputs_disable_any_whitespace=_structured_config(args).get("disable_any_whitespace", False))


def _structured_config(args: argparse.Namespace) -> dict:
    text = getattr(args, "structured_outputs_config", None)
    if not text:
        return {}
    try:
        cfg = json.loads(text)
    except ValueError:
        cfg = None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("disable_any_whitespace", False), bool):
        raise ConfigError(f"--structured-outputs-config {text!r} is not a JSON object like "
                          "'{\"backend\": \"xgrammar\", \"disable_any_whitespace\": true}'")
    return cfg


def structured_outputs_backend(args: argparse.Namespace) -> str:
    """The backend named by --structured-outputs-config or --guided-decoding-backend ("auto" when neither)."""
    from ..structured import check_backend
    names = []
    cfg = _structured_config(args)
    if cfg:
        ignored = sorted(set(cfg) - {"backend", "disable_any_whitespace"})
        if ignored:
            log.warning("--structured-outputs-config: %s are vLLM-internal; catengine accepts and ignores them", ignored)
        if "backend" in cfg:
            names.append(cfg["backend"])
    if getattr(args, "guided_decoding_backend", None):
        names.append(args.guided_decoding_backend)
    for name in names:
        check_backend(name)
    return names[0] if names else "auto"


def log_ignored(args: argparse.Namespace) -> None:
    for flag in IGNORED_WITH_VALUE + IGNORED_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            log.warning("%s %s is a vLLM-internal setting; catengine accepts and ignores it", flag,
                     "" if value is True else value)


def server_config(args: argparse.Namespace, model_path: str):
    from ..server.reasoning import get_reasoning_parser
    from ..server.serving import ServerConfig
    from ..server.tool_parsers import get_tool_parser
    if args.tool_call_parser:
        get_tool_parser(args.tool_call_parser)
    if args.reasoning_parser:
        get_reasoning_parser(args.reasoning_parser)
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ConfigError("--enable-auto-tool-choice needs --tool-call-parser (qwen3_coder for Qwen3.5/3.6, "
                          "hermes for older Qwen)")
    names = tuple(args.served_model_name or [model_path])
    return ServerConfig(served_model_names=names, api_key=args.api_key or None,
                        enable_auto_tool_choice=args.enable_auto_tool_choice, tool_call_parser=args.tool_call_parser,
                        reasoning_parser=args.reasoning_parser, cors_origins=tuple(args.allowed_origins),
                        cors_methods=tuple(args.allowed_methods), cors_headers=tuple(args.allowed_headers),
                        cors_credentials=args.allow_credentials)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        kwargs = engine_kwargs(args)
        log_ignored(args)
        model_label = kwargs["model"] or "demo"
        config = server_config(args, model_label)
        from ..async_engine import AsyncEngine
        engine = AsyncEngine(**kwargs)
    except (CatEngineError, OSError) as e:
        print(f"catengine serve: {e}", file=sys.stderr)
        return 2
    return serve(engine, config, args.host, args.port, args.log_level)


def serve(engine, config, host: str, port: int, log_level: str = "info") -> int:
    import uvicorn

    from ..server.app import build_app
    from ..server.serving import ServerContext
    ctx = ServerContext(engine, config)
    app = build_app(ctx)
    stats = ctx.engine_stats()
    cfg = engine.config
    shown = f"[{host}]" if ":" in host else host
    print(f"catengine serving {', '.join(config.served_model_names)} ({engine.model_path}) "
          f"at http://{shown}:{port}/v1\n"
          f"  device {cfg.device}, dtype {cfg.dtype}, KV cache {stats.get('kv_capacity_tokens', '?')} tokens "
          f"({cfg.kv_cache_dtype}, block {cfg.block_size}), max_model_len {ctx.max_model_len}, "
          f"max_num_seqs {cfg.max_num_seqs}, max_num_batched_tokens {cfg.max_num_batched_tokens}, "
          f"prefix caching {'on' if cfg.enable_prefix_caching else 'off'}\n"
          f"  tools: {config.tool_call_parser or 'off'}{' (auto)' if config.enable_auto_tool_choice else ''}, "
          f"reasoning: {config.reasoning_parser or 'off'}, api key: {'required' if config.api_key else 'none'}",
          flush=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, timeout_keep_alive=30)
    finally:
        ctx.close()
        engine.shutdown()
    return 0
