"""EngineConfig: every setting of an Engine, frozen, validated with messages that say what to change.

``Engine(**kwargs)`` takes exactly these fields; ``catengine serve`` has one flag per field under vLLM's
name where vLLM has one (catengine/cli/serve.py; a test checks that every field is reachable), and
``metadata["help"]`` documents each field. ``None`` means "pick for me": the engine resolves it
from the model and the device (see :meth:`EngineConfig.resolve`) and exposes the resolved copy as
``engine.config``.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

import torch

from .errors import ConfigError
from .kernels.attention import DEFAULT_BLOCK_SIZE
from .kernels.common.arch import bf16_supported, device_cc, forced_arch
from .models.kv_cache_dtype import KV_CACHE_DTYPES

DTYPES = {"float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float32": torch.float32, "float": torch.float32, "fp32": torch.float32}
CPU_KV_CACHE_BYTES = 256 << 20   # default KV + state budget on CPU
DEFAULT_MAX_NUM_SEQS = {"cuda": 256, "cpu": 64}
DEFAULT_MAX_BATCHED_TOKENS = {"cuda": 8192, "cpu": 2048}
DISTRIBUTED_BACKENDS = ("mp", "external_launcher")
SSM_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")
LM_HEAD_QUANT = (None, "int8")
MTP_METHODS = ("mtp", "qwen3_next_mtp", "qwen3_5_mtp")   # vLLM's names for the checkpoint's own MTP head
MAX_SPECULATIVE_TOKENS = 8
# no drafting above this many running sequences: a verify step over k+1 rows per sequence turns the
# memory-bound decode GEMV into a GEMM; by batch 32 a decode step is no longer weight-bound on the H200, so
# drafts there mostly cost (vLLM leaves it unset). The rule (bench/NOTES.md, "MTP draft graphs"): the largest
# batch at which bench/bench_mtp.py's last table shows the real MTP head faster than no MTP on the 27B at
# k = 3; 32 stands until that run is on full-depth weights with a trained head
DEFAULT_SPEC_DISABLE_BATCH = 32


def _help(text: str, default=None, **kw):
    return field(default=default, metadata={"help": text}, **kw)


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = _help("model directory (Hugging Face layout); None: the embedded demo model")
    tokenizer: str | None = _help("tokenizer directory; None: the model directory")
    chat_template: str | None = _help("chat template (a .jinja path or the template text) overriding the model's")
    dtype: str = _help("weights/activations dtype: auto (float32 on CPU, float16 on CUDA), float16, bfloat16, "
                       "float32", "auto")
    device: str = _help("auto (cuda when available), cpu, cuda or cuda:N", "auto")
    max_model_len: int | None = _help("longest sequence (prompt + output) in tokens; None: the model's maximum, "
                                      "lowered to what the KV cache holds")
    max_num_seqs: int | None = _help("most sequences running at once; None: 256 on CUDA, 64 on CPU")
    max_num_batched_tokens: int | None = _help("token budget of one step (prompt chunks + decodes); None: 8192 on "
                                               "CUDA, 2048 on CPU")
    kv_cache_dtype: str = _help("KV cache storage: auto (the model dtype) or fp8_e5m2", "auto")
    mamba_ssm_cache_dtype: str = _help("GDN recurrent state storage: auto (the model dtype, vLLM's default: "
                                       "float32 on CPU, float16 on CUDA), float32, float16 or bfloat16; the "
                                       "kernels compute in fp32 and round only the stored state (a float16 "
                                       "state cost 2.5e-4 mean |delta log p| on the demo model, bench/NOTES.md, "
                                       "for half the state traffic)", "auto")
    quantize_lm_head: str | None = _help("int8: the lm_head as W8A16 (int8 weights, one fp16/bf16 scale per "
                                         "vocabulary row, quantised at load; half the bytes of the largest "
                                         "16-bit matrix of an AWQ checkpoint); None: the checkpoint's weights")
    block_size: int = _help("tokens per KV block (also the prefix-cache and state-snapshot granularity)",
                        DEFAULT_BLOCK_SIZE)
    enable_prefix_caching: bool = _help("reuse the KV blocks and GDN states of shared prompt prefixes", True)
    gpu_memory_utilization: float = _help("fraction of the GPU's memory the engine may use in total", 0.9)
    kv_cache_memory_bytes: int | None = _help("exact bytes for KV blocks + state slots (skips the GPU profile); "
                                              "None: profiled on CUDA, 256 MiB on CPU")
    kv_cache_auto_trim_ratio: float = _help("cap the KV cache at ratio * max_model_len * max_num_seqs tokens so "
                                            "memory is not reserved for sequences that cannot run; 0 disables",
                                            1.05)
    seed: int = _help("seed of the per-request seeds drawn for requests without one", 0)
    num_state_snapshots: int | None = _help("GDN state snapshot slots for hybrid prefix caching; None: about 10% "
                                            "of the cache budget, at most max(8 * max_num_seqs, 64)")
    num_kv_blocks: int | None = _help("exact number of KV blocks (testing/debugging); None: from the memory plan")
    enforce_eager: bool = _help("never use CUDA graphs", False)
    structured_outputs_backend: str = _help("grammar backend of structured outputs: auto or xgrammar", "auto")
    structured_outputs_disable_any_whitespace: bool = _help("JSON structured outputs without free whitespace "
                                                            "(vLLM's disable_any_whitespace, server-wide)", False)
    tensor_parallel_size: int = _help("ranks (one process and one GPU each) that split every layer's heads and "
                                      "widths: 1, 2, 4 or 8; on CPU the ranks talk over gloo", 1)
    enable_expert_parallel: bool = _help("MoE models under tensor parallelism: each rank holds whole routed "
                                         "experts (num_experts / tensor_parallel_size of them) instead of a slice "
                                         "of every expert; the shared expert stays split", False)
    enable_one_shot_all_reduce: bool = _help("TP on CUDA: sum small messages (decode steps, up to 1 MiB of fp32) "
                                             "with one kernel on torch symmetric memory instead of NCCL; off until "
                                             "measured; falls back to NCCL (logged) when its set-up fails or times "
                                             "out", False)
    distributed_executor_backend: str = _help("how the ranks > 0 start: mp (spawned by the engine) or "
                                              "external_launcher (started by torchrun or a cluster launcher with "
                                              "MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, running "
                                              "'python -m catengine.distributed.worker'; the engine is RANK 0)",
                                              "mp")
    cuda_graph_sizes: tuple[int, ...] | None = _help("decode batch sizes to capture CUDA graphs for (those above "
                                                     "max_num_seqs are dropped); None: 1, 2, 4, 8, 16, 24, ... up to "
                                                     "min(max_num_seqs, 256)")
    speculative_config: dict | None = _help("speculative decoding, vLLM's shape: {\"method\": \"mtp\", "
                                            "\"num_speculative_tokens\": k (1..8), \"disable_by_batch_size\": N, "
                                            "\"draft_vocab_size\": N, \"draft_vocab_file\": path}; drafts with the "
                                            "checkpoint's MTP head (draft_vocab_*: its lm_head over N frequent "
                                            "tokens only, see catengine/spec/vocab.py); None: off")

    # ------------------------------------------------------------------ validation
    def validate(self) -> "EngineConfig":
        """Raise ConfigError naming the first invalid field and a valid value; returns self."""
        for name in ("model", "tokenizer", "chat_template"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, bytes)) and not hasattr(value, "__fspath__"):
                raise ConfigError(f"{name} must be a path string or None, got {value!r}")
        if not isinstance(self.dtype, str) or (self.dtype != "auto" and self.dtype.lower() not in DTYPES):
            raise ConfigError(f"dtype {self.dtype!r} is not supported; use auto, float16, bfloat16 or float32")
        if not isinstance(self.device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device {self.device!r} is not supported; use auto, cpu, cuda or cuda:N")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            hint = (" (fp8 e4m3 needs sm_89+ and is not offered; fp8_e5m2 works on every GPU)"
                    if isinstance(self.kv_cache_dtype, str) and self.kv_cache_dtype.startswith("fp8") else "")
            raise ConfigError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported{hint}; use "
                              f"{' or '.join(KV_CACHE_DTYPES)}")
        if self.mamba_ssm_cache_dtype not in SSM_CACHE_DTYPES:
            raise ConfigError(f"mamba_ssm_cache_dtype {self.mamba_ssm_cache_dtype!r} is not supported; use "
                              f"{', '.join(SSM_CACHE_DTYPES)}")
        if self.quantize_lm_head not in LM_HEAD_QUANT:
            raise ConfigError(f"quantize_lm_head {self.quantize_lm_head!r} is not supported; use None or 'int8'")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes",
                     "num_kv_blocks"):
            _positive_int(self, name, optional=True)
        _positive_int(self, "block_size")
        if self.block_size & (self.block_size - 1) or self.block_size > 1024:
            raise ConfigError(f"block_size must be a power of two up to 1024 (16 is usual), got {self.block_size}")
        if self.num_state_snapshots is not None:
            _int(self, "num_state_snapshots")
            if self.num_state_snapshots < 0:
                raise ConfigError(f"num_state_snapshots must be >= 0 or None, got {self.num_state_snapshots}")
        for name in ("enable_prefix_caching", "enforce_eager", "structured_outputs_disable_any_whitespace",
                     "enable_expert_parallel", "enable_one_shot_all_reduce"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < u <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], e.g. 0.9; got {u!r}")
        r = self.kv_cache_auto_trim_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r < 0:
            raise ConfigError(f"kv_cache_auto_trim_ratio must be a number >= 0 (0 disables trimming), got {r!r}")
        _int(self, "seed")
        _int(self, "tensor_parallel_size")
        if self.tensor_parallel_size not in (1, 2, 4, 8):
            raise ConfigError(f"tensor_parallel_size must be 1, 2, 4 or 8, got {self.tensor_parallel_size}")
        if self.distributed_executor_backend not in DISTRIBUTED_BACKENDS:
            raise ConfigError(f"distributed_executor_backend {self.distributed_executor_backend!r} is not supported; "
                              f"use {' or '.join(DISTRIBUTED_BACKENDS)}")
        from .structured.backend import check_backend
        check_backend(self.structured_outputs_backend)
        sizes = self.cuda_graph_sizes
        if sizes is not None and (not isinstance(sizes, (tuple, list)) or not sizes or not all(
                isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes)):
            raise ConfigError(f"cuda_graph_sizes must be a non-empty list of positive batch sizes (e.g. [1, 2, 4, 8]) "
                              f"or None, got {sizes!r}")
        check_speculative_config(self.speculative_config)
        if (self.speculative_config or {}).get("draft_vocab_size") and self.tensor_parallel_size > 1:
            raise ConfigError("speculative_config draft_vocab_size is not supported with tensor_parallel_size > 1 "
                              "(the lm_head is split by vocabulary there); drop draft_vocab_size or run one rank")
        if (self.max_num_seqs is not None and self.max_num_batched_tokens is not None
                and self.max_num_batched_tokens < self.max_num_seqs):
            raise ConfigError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                              f"({self.max_num_seqs}) so every running sequence can decode each step; raise it or "
                              f"lower max_num_seqs")
        return self

    # ------------------------------------------------------------------ resolution
    def resolve(self, *, device: torch.device, max_position_embeddings: int) -> "EngineConfig":
        """A copy with device, dtype and the batch limits made concrete for this device and model
        (max_model_len stays None when unset: the memory plan picks it)."""
        kind = device.type if device.type in DEFAULT_MAX_NUM_SEQS else "cuda"
        if self.max_model_len is not None and self.max_model_len > max_position_embeddings:
            raise ConfigError(f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                              f"({max_position_embeddings}); use at most {max_position_embeddings}")
        max_num_seqs = self.max_num_seqs or DEFAULT_MAX_NUM_SEQS[kind]
        budget = self.max_num_batched_tokens or max(DEFAULT_MAX_BATCHED_TOKENS[kind], max_num_seqs)
        if budget < max_num_seqs:
            raise ConfigError(f"max_num_batched_tokens ({budget}) must be >= max_num_seqs ({max_num_seqs}); "
                              f"raise it or lower max_num_seqs")
        dtype_name = self.dtype if self.dtype != "auto" else ("float32" if device.type == "cpu" else "float16")
        dtype_name = _canonical_dtype(dtype_name)
        ssm = dtype_name if self.mamba_ssm_cache_dtype == "auto" else self.mamba_ssm_cache_dtype
        if ssm == "bfloat16" and device.type == "cuda" and not bf16_supported(device):
            raise ConfigError("mamba_ssm_cache_dtype bfloat16 needs an sm_80+ GPU; use float16 or float32")
        return dataclasses.replace(self, device=str(device), dtype=dtype_name, mamba_ssm_cache_dtype=ssm,
                                   max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)

    @property
    def num_speculative_tokens(self) -> int:
        """Draft tokens per speculating sequence and step (0: no speculation)."""
        return int((self.speculative_config or {}).get("num_speculative_tokens") or 0)

    @property
    def speculative_disable_by_batch_size(self) -> int:
        """Running sequences above which a step drafts nothing (vLLM's disable_by_batch_size)."""
        value = (self.speculative_config or {}).get("disable_by_batch_size")
        return DEFAULT_SPEC_DISABLE_BATCH if value is None else int(value)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            raise ConfigError("dtype is still 'auto'; call resolve() first")
        return DTYPES[self.dtype.lower()]

    @property
    def ssm_torch_dtype(self) -> torch.dtype:
        """The GDN recurrent state slots' dtype (after resolve(): "auto" is then the model dtype)."""
        if self.mamba_ssm_cache_dtype == "auto":
            raise ConfigError("mamba_ssm_cache_dtype is still 'auto'; call resolve() first")
        return DTYPES[self.mamba_ssm_cache_dtype]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} was asked for but CUDA is not available; use device='cpu'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
    return device


def make_current(device: torch.device) -> None:
    """Make an explicit ``cuda:N`` the current device before the weights load: Triton launches and the
    CUDA allocator's queries act on the current device, not on the tensors' one."""
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


def check_dtype_supported(dtype: torch.dtype, device: torch.device) -> None:
    # by the launch-table row, not torch.cuda.is_bf16_supported(): that one also says yes on a V100 (torch
    # emulates bf16 tensors there), and the row follows CATENGINE_ARCH=70 as a V100 would. forced_arch() first:
    # a bad CATENGINE_ARCH is a ConfigError at engine start, whatever the dtype
    forced = forced_arch()
    if dtype == torch.float32 and device.type == "cuda":
        # the Triton launch tables are sized for 16-bit activations: with fp32 inputs the GDN serial state
        # kernel (h_bv 64, 3 stages) asks 279,552 B of shared memory on the H200 (227 KB is the limit) and
        # dies at the first prefill; refusing here beats a crash minutes later
        raise ConfigError("dtype float32 is not supported on CUDA: the kernels' launch tables are sized for 16-bit "
                          "activations (float32 overflows the GDN kernel's shared memory); use dtype='float16' "
                          "(or 'bfloat16' on sm_80+), or device='cpu' for float32")
    if dtype == torch.bfloat16 and not bf16_supported(device):
        where = (f"CATENGINE_ARCH={forced} makes every device sm_{forced}" if forced is not None
                 else f"this GPU is sm_{device_cc(device)}")
        raise ConfigError(f"bfloat16 needs an sm_80+ GPU; {where}: use dtype='float16'")


def _canonical_dtype(name: str) -> str:
    dtype = DTYPES[name.lower()]
    return {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype]


def _int(cfg: EngineConfig, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")


def _positive_int(cfg: EngineConfig, name: str, optional: bool = False) -> None:
    value = getattr(cfg, name)
    if value is None and optional:
        return
    _int(cfg, name)
    if value < 1:
        raise ConfigError(f"{name} must be a positive integer{' or None' if optional else ''}, got {value}")


def check_speculative_config(spec) -> None:
    """ConfigError unless ``spec`` is None or vLLM's speculative dict for MTP with 1..8 draft tokens."""
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise ConfigError(f"speculative_config must be a dict such as {{\"method\": \"mtp\", "
                          f"\"num_speculative_tokens\": 3}} or None, got {spec!r}")
    known = {"method", "num_speculative_tokens", "disable_by_batch_size", "draft_vocab_size", "draft_vocab_file"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ConfigError(f"speculative_config keys {unknown} are not supported; use {sorted(known)}")
    method = spec.get("method", "mtp")
    if method not in MTP_METHODS:
        raise ConfigError(f"speculative_config method {method!r} is not supported: catengine drafts with the "
                          f"checkpoint's MTP head; use \"mtp\" (or vLLM's aliases {', '.join(MTP_METHODS[1:])})")
    k = spec.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ConfigError(f"speculative_config num_speculative_tokens must be an integer in "
                          f"[1, {MAX_SPECULATIVE_TOKENS}] (3 is a good start), got {k!r}")
    n = spec.get("disable_by_batch_size")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError(f"speculative_config disable_by_batch_size must be a positive integer or absent, got {n!r}")
    v = spec.get("draft_vocab_size")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise ConfigError(f"speculative_config draft_vocab_size must be a positive integer (the draft lm_head's "
                          f"token count, e.g. 32768) or absent, got {v!r}")
    f = spec.get("draft_vocab_file")
    if f is not None and v is None:
        raise ConfigError("speculative_config draft_vocab_file needs draft_vocab_size (how many of its ids to keep)")
