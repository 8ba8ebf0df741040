"""vLLM's flags beyond catengine's own settings: what each one does here.

Users paste vLLM command lines after ``catengine serve``; every flag of those lines is accepted by the
``serve`` parser (never argparse's bare usage) and gets one of three treatments:

- **real**: catengine has the feature and the flag behaves as in vLLM (``--cuda-graph-sizes``,
  ``--generation-config``, ``--response-role``, ``--ssl-certfile``, ``--mamba-ssm-cache-dtype``, ...);
  ``--quantize-lm-head int8`` is catengine's own (vLLM has no such flag);
- **logged and ignored**: the flag only tunes vLLM's internals (attention backend, swap space, partial
  prefills, ...), so it changes nothing a client sees here; one warning line per flag at start;
- **refused** with a ConfigError naming the flag and why, where catengine lacks the feature and ignoring it
  would change what the user gets (vLLM's other speculative methods, below).

``--enable-expert-parallel`` is real: ``EngineConfig.enable_expert_parallel`` (whole experts per rank).

Speculative decoding is real: ``--speculative-config`` (vLLM's JSON, method ``mtp`` or vLLM's aliases
``qwen3_next_mtp`` / ``qwen3_5_mtp``), ``--num-speculative-tokens`` and ``--speculative-disable-by-batch-size``
become ``EngineConfig.speculative_config``; vLLM's other methods (ngram, eagle, a draft model) are refused.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError

log = logging.getLogger("catengine.server")

# vLLM flags that tune vLLM internals: accepted (with or without a value) and logged as ignored.
IGNORED_WITH_VALUE = ("--attention-backend", "--swap-space", "--load-format",
                      "--download-dir", "--revision", "--tokenizer-mode", "--max-seq-len-to-capture",
                      "--compilation-config", "--max-log-len", "--uvicorn-log-level", "--quantization",
                      "--max-logprobs", "--cpu-offload-gb", "--scheduling-policy", "--tokenizer-pool-size",
                      "--code-revision", "--limit-mm-per-prompt", "--mm-processor-kwargs", "--hf-overrides",
                      "--config-format", "--root-path", "--num-scheduler-steps", "--long-prefill-token-threshold",
                      "--max-num-partial-prefills", "--max-long-partial-prefills")
IGNORED_FLAGS = ("--trust-remote-code", "--enable-log-requests", "--disable-custom-all-reduce",
                 "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--disable-frontend-multiprocessing",
                 "--disable-fastapi-docs", "--enable-server-load-tracking", "--disable-uvicorn-access-log",
                 "--async-scheduling", "--enable-force-include-usage")

# vLLM's speculative methods; catengine drafts with MTP only (the checkpoints' own head)
MTP_METHODS = ("mtp", "qwen3_next_mtp", "qwen3_5_mtp")
SPECULATIVE_METHODS = ("mtp", "qwen3_next_mtp", "qwen3_5_mtp", "deepseek_mtp", "ngram", "eagle", "eagle3",
                       "medusa", "mlp_speculator", "draft_model", "suffix")
MAX_SPECULATIVE_TOKENS = 8


def _json_object(flag: str):
    def parse(text: str) -> dict:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} takes a JSON object, e.g. '{{\"temperature\": 0.7}}'; "
                                             f"got {text!r}")
        return value
    return parse


def _field_default(name: str):
    """An EngineConfig field's default, so the flag has the engine's (EngineConfig owns the setting)."""
    from ..config import EngineConfig
    return EngineConfig.__dataclass_fields__[name].default


def add_engine_compat_arguments(p: argparse.ArgumentParser) -> None:
    """vLLM flags that act on the engine (serve and generate)."""
    p.add_argument("--cuda-graph-sizes", type=int, nargs="+", default=None, metavar="N",
                   help="decode CUDA graph batch sizes; one value N: 1, 2, 4, 8, 16, ... up to N")
    p.add_argument("--max-cudagraph-capture-size", type=int, default=None, metavar="N",
                   help="largest decode batch captured in a CUDA graph")
    p.add_argument("--generation-config", default="auto",
                   help="sampling defaults: 'auto' (the model's generation_config.json), 'vllm' (none) or a folder "
                        "holding a generation_config.json")
    p.add_argument("--override-generation-config", type=_json_object("--override-generation-config"), default=None,
                   help='JSON merged over the generation config, e.g. \'{"temperature": 0.6}\'')
    p.add_argument("--speculative-config", type=_json_object("--speculative-config"), default=None,
                   help='speculative decoding with the checkpoint\'s MTP head, vLLM\'s JSON: '
                        '\'{"method": "mtp", "num_speculative_tokens": 3}\'')
    p.add_argument("--num-speculative-tokens", type=int, default=None,
                   help="draft tokens per step (MTP); the same as num_speculative_tokens in --speculative-config")
    p.add_argument("--speculative-disable-by-batch-size", type=int, default=None, metavar="N",
                   help="no drafting in a step with more than N running sequences (default 32)")
    p.add_argument("--mamba-ssm-cache-dtype", "--mamba-cache-dtype", dest="mamba_ssm_cache_dtype",
                   default=_field_default("mamba_ssm_cache_dtype"),
                   help="GDN recurrent state dtype: auto (default: the model dtype), float32, float16 or "
                        "bfloat16; the kernels compute in fp32 and round only the stored state (cost measured "
                        "in bench/NOTES.md: float16 2.5e-4, bfloat16 2.3e-3 mean |delta log p| per token)")
    p.add_argument("--quantize-lm-head", default=_field_default("quantize_lm_head"), metavar="int8",
                   help="int8: the lm_head as W8A16 (per-row int8, quantised at load); default: as stored")
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help="MoE under --tensor-parallel-size: each GPU holds whole experts (num_experts / N) instead of "
                        "a slice of every expert")
    p.add_argument("--enable-one-shot-all-reduce", action="store_true",
                   help="catengine's own: small tensor-parallel sums on torch symmetric memory (one kernel) instead "
                        "of NCCL; off by default (not measured yet), falls back to NCCL if its set-up fails")
    p.add_argument("--language-model-only", action="store_true",
                   help="accepted: catengine serves only the language model")
    p.add_argument("--structured-outputs-config", default=None,
                   help='structured outputs, JSON: {"backend": "auto" | "xgrammar", "disable_any_whitespace": bool}')
    p.add_argument("--guided-decoding-backend", default=None, help="older spelling of the structured outputs backend")


def add_ignored_arguments(p: argparse.ArgumentParser) -> None:
    """The logged-and-ignored flags; called last, so a flag that gained a real meaning elsewhere in the parser
    keeps it (argparse would refuse the second definition)."""
    taken, ours = set(p._option_string_actions), []
    for flag in IGNORED_WITH_VALUE + IGNORED_FLAGS:
        if flag in taken:
            continue
        if flag in IGNORED_FLAGS:
            p.add_argument(flag, action="store_true", default=None, help=argparse.SUPPRESS)
        else:
            p.add_argument(flag, default=None, help=argparse.SUPPRESS)
        ours.append(flag)
    p.set_defaults(ignored_flags=tuple(ours))


def add_server_compat_arguments(p: argparse.ArgumentParser) -> None:
    """vLLM flags that act on the OpenAI server (serve only)."""
    p.add_argument("--default-chat-template-kwargs", type=_json_object("--default-chat-template-kwargs"),
                   default=None, help='chat_template_kwargs for requests that do not set them, e.g. '
                                      '\'{"enable_thinking": false}\'')
    p.add_argument("--enable-reasoning", action="store_true",
                   help="split thinking into reasoning_content (the qwen3 parser unless --reasoning-parser)")
    p.add_argument("--response-role", default="assistant", help="role of the generated message (default assistant)")
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="usage.prompt_tokens_details.cached_tokens: prompt tokens served from the prefix cache")
    p.add_argument("--return-tokens-as-token-ids", action="store_true",
                   help="logprobs name tokens 'token_id:N' instead of their text")
    p.add_argument("--ssl-keyfile", default=None, help="TLS private key file (serve https)")
    p.add_argument("--ssl-certfile", default=None, help="TLS certificate file (serve https)")
    p.add_argument("--ssl-ca-certs", default=None, help="CA certificates to verify clients with")
    p.add_argument("--disable-log-requests", action="store_true", help="no INFO line per finished request")
    p.add_argument("--disable-log-stats", action="store_true", help="no periodic throughput line")


def engine_compat_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig fields from these flags; ConfigError for the flags catengine refuses."""
    structured = structured_outputs_config(args)
    return {"speculative_config": speculative_config(args),
            "enable_expert_parallel": bool(getattr(args, "enable_expert_parallel", False)),
            "enable_one_shot_all_reduce": bool(getattr(args, "enable_one_shot_all_reduce", False)),
            "mamba_ssm_cache_dtype": str(args.mamba_ssm_cache_dtype).lower(), "quantize_lm_head": args.quantize_lm_head,
            "cuda_graph_sizes": cuda_graph_sizes(args),
            "structured_outputs_backend": structured["backend"],
            "structured_outputs_disable_any_whitespace": structured["disable_any_whitespace"]}


def structured_outputs_config(args: argparse.Namespace) -> dict[str, Any]:
    """Backend and whitespace rule of structured outputs from --structured-outputs-config (vLLM's JSON; its
    other keys tune vLLM internals and are logged as ignored) or the older --guided-decoding-backend."""
    from ..structured import check_backend
    text = getattr(args, "structured_outputs_config", None)
    cfg: Any = {}
    if text:
        try:
            cfg = json.loads(text)
        except ValueError:
            cfg = None
        if not isinstance(cfg, dict) or not isinstance(cfg.get("disable_any_whitespace", False), bool):
            raise ConfigError(f"--structured-outputs-config {text!r} is not a JSON object like "
                              "'{\"backend\": \"xgrammar\", \"disable_any_whitespace\": true}'")
        ignored = sorted(set(cfg) - {"backend", "disable_any_whitespace"})
        if ignored:
            log.warning("--structured-outputs-config: %s tune vLLM internals; catengine accepts and ignores them",
                        ignored)
    names = [n for n in (cfg.get("backend"), getattr(args, "guided_decoding_backend", None)) if n is not None]
    for name in names:
        check_backend(name)
    return {"backend": names[0] if names else "auto",
            "disable_any_whitespace": cfg.get("disable_any_whitespace", False)}


def cuda_graph_sizes(args: argparse.Namespace) -> tuple[int, ...] | None:
    """vLLM's semantics: several ``--cuda-graph-sizes`` are the sizes; one value N (or
    ``--max-cudagraph-capture-size N``) is 1, 2, 4, then every multiple of 8 up to N."""
    from ..cuda_graphs import graph_batch_sizes
    sizes, top = getattr(args, "cuda_graph_sizes", None), getattr(args, "max_cudagraph_capture_size", None)
    for flag, values in (("--cuda-graph-sizes", sizes or []),
                         ("--max-cudagraph-capture-size", [] if top is None else [top])):
        if any(v < 1 for v in values):
            raise ConfigError(f"{flag} takes positive batch sizes, got {values}")
    if sizes is not None and len(sizes) > 1:
        chosen = sorted(set(sizes))
        if top is not None:
            chosen = [s for s in chosen if s <= top]
        if not chosen:
            raise ConfigError(f"--cuda-graph-sizes {sizes} has no size <= --max-cudagraph-capture-size {top}")
        return tuple(chosen)
    if sizes is not None or top is not None:
        n = min([v for v in (sizes[0] if sizes else None, top) if v is not None])
        return tuple(graph_batch_sizes(n, limit=n))
    return None


def speculative_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """The speculative config in vLLM's shape, as EngineConfig.speculative_config takes it (None: no
    speculation); ConfigError when malformed or for a method other than the checkpoint's MTP head."""
    spec = dict(getattr(args, "speculative_config", None) or {})
    for flag, key in (("--num-speculative-tokens", "num_speculative_tokens"),
                      ("--speculative-disable-by-batch-size", "disable_by_batch_size")):
        value = getattr(args, key if key != "disable_by_batch_size" else "speculative_disable_by_batch_size", None)
        if value is None:
            continue
        if spec.get(key) not in (None, value):
            raise ConfigError(f"{flag} {value} disagrees with --speculative-config's {key} {spec[key]}; give one")
        spec[key] = value
    if not spec or set(spec) == {"disable_by_batch_size"}:
        return None
    method, k = spec.get("method"), spec.get("num_speculative_tokens")
    if method is not None and method not in SPECULATIVE_METHODS:
        raise ConfigError(f"--speculative-config method {method!r} is not a vLLM speculative method; Qwen3.5/3.6 "
                          f"use \"mtp\"")
    if method is not None and method not in MTP_METHODS:
        raise ConfigError(f"--speculative-config method {method!r} is not supported: catengine drafts with the "
                          f"checkpoint's own MTP head; use \"mtp\"")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_SPECULATIVE_TOKENS):
        raise ConfigError(f"--speculative-config num_speculative_tokens must be an integer in "
                          f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
    if k == 0:
        return None
    if k is None:
        raise ConfigError("--speculative-config needs num_speculative_tokens (1..8, e.g. 3), or give "
                          "--num-speculative-tokens")
    # vLLM's other keys (draft model, draft TP, ...) are refused by EngineConfig.validate with their names
    return {**spec, "method": "mtp"}


def generation_defaults(args: argparse.Namespace, model_defaults: dict[str, Any]) -> dict[str, Any]:
    """The sampling defaults of requests (vLLM's --generation-config / --override-generation-config):
    'auto' = the model's generation_config.json (``model_defaults``), 'vllm' = none, else a folder's
    generation_config.json; the override is merged on top (alone with 'vllm')."""
    source = getattr(args, "generation_config", "auto") or "auto"
    if source == "auto":
        base = dict(model_defaults)
    elif source == "vllm":
        base = {}
    else:
        path = Path(source).expanduser() / "generation_config.json"
        try:
            base = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"--generation-config {source}: cannot read {path} ({type(e).__name__}: {e}); give "
                              f"'auto', 'vllm' or a folder holding a generation_config.json") from None
        if not isinstance(base, dict):
            raise ConfigError(f"--generation-config {source}: {path} is not a JSON object")
    return {**base, **(getattr(args, "override_generation_config", None) or {})}


def check_ssl(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's TLS keywords; ConfigError for a missing file (found before the model loads)."""
    if args.ssl_keyfile and not args.ssl_certfile:
        raise ConfigError("--ssl-keyfile needs --ssl-certfile (the certificate of that key)")
    out = {}
    for flag, key in (("--ssl-certfile", "ssl_certfile"), ("--ssl-keyfile", "ssl_keyfile"),
                      ("--ssl-ca-certs", "ssl_ca_certs")):
        value = getattr(args, key)
        if value:
            if not os.path.isfile(value):
                raise ConfigError(f"{flag} {value}: no such file")
            out[key] = value
    return out


def log_accepted(args: argparse.Namespace) -> None:
    """One line per flag that is accepted without effect."""
    for flag in getattr(args, "ignored_flags", ()):
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None:
            log.warning("%s %s is a vLLM-internal setting; catengine accepts and ignores it", flag,
                        "" if value is True else value)
    if getattr(args, "language_model_only", False):
        log.info("--language-model-only: catengine serves only the language model (always)")
