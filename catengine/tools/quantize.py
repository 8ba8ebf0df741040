"""A round-to-nearest 4-bit checkpoint (AutoAWQ GEMM or compressed-tensors pack-quantized) from an fp16/bf16/fp32
one, readable by other engines' loaders (vLLM's). ``catengine quantize`` (:mod:`catengine.cli.quantize`) calls it.

Streams tensor by tensor: the largest thing in memory is one output shard. Names stay as on disk (text-only
or multimodal layout); fused MoE experts are written per expert, as published AWQ MoE checkpoints are.
Left unquantized: the modules the design notes (../shared/design/QWEN35.md) list (GDN in_proj_a/b, the router,
shared_expert_gate, conv1d, norms, A_log, dt_bias, embeddings, lm_head, mtp.*, vision) and any linear whose
dimensions do not pack (input dim not divisible by the group size, or a dimension not a multiple of 8).
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import CatEngineError, ConfigError
from ..kernels.w4a16.packing import QuantizedWeight, pack_int4_along_k
from ..models.loader import INDEX_FILE, list_tensors
from ..models.quant_formats import canonical_to_awq, canonical_to_ct, matches_skip

FORMATS = ("awq", "compressed-tensors")
_KEEP_DENSE = re.compile(r"(^|\.)(in_proj_a|in_proj_b|shared_expert_gate|conv1d|embed_tokens|lm_head)$"
                         r"|\.mlp\.gate$|(^|\.)mtp\.|(^|\.)(visual|vision_tower|multi_modal_projector)\.")
_FUSED = re.compile(r"^(.+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_EXPERT = re.compile(r"^(.+\.mlp\.experts)\.\d+\.(gate_proj|up_proj|down_proj)$")
_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
# category entries of the skip list, used when every module they name is left unquantized
_AWQ_SKIP = ("in_proj_a", "in_proj_b", "shared_expert_gate", "mlp.gate", "conv1d", "embed_tokens", "lm_head",
             "mtp", "visual")
_CT_SKIP = (r"re:(.*\.)?in_proj_a$", r"re:(.*\.)?in_proj_b$", r"re:(.*\.)?shared_expert_gate$",
            r"re:(.*\.)?mlp\.gate$", r"re:(.*\.)?conv1d$", r"re:(.*\.)?embed_tokens$", r"re:(.*\.)?lm_head$",
            r"re:(.*\.)?mtp\..*", r"re:(.*\.)?visual\..*")
_MODEL_PREFIX = re.compile(r"^(model\.language_model\.|language_model\.model\.|model\.)")


def rtn_quantize(weight: torch.Tensor, group_size: int, symmetric: bool, scale_dtype: torch.dtype,
                 via_dtype: torch.dtype | None = None) -> QuantizedWeight:
    """Round-to-nearest 4-bit quantization of a torch ``Linear.weight`` ``[out, in]`` -> canonical (``[in, out]``).

    Per group of ``group_size`` input channels: asymmetric spans [min(w, 0), max(w, 0)] in 15 steps with an
    integer zero point; symmetric uses max|w| / 7.5 with zero 8 (codes 0..15 = -8..7). Scales are rounded *up*
    to ``scale_dtype`` (through ``via_dtype`` first, so fp16 AWQ scales of a bf16 model are bf16-exact) before
    the codes are computed, so the group still spans its range and every value is within half a step of
    ``(q - z) * s`` with the stored ``s``.
    """
    out_f, in_f = weight.shape
    if in_f % group_size:
        raise ValueError(f"group size {group_size} does not divide the input dimension {in_f}")
    w = weight.to(torch.float32).reshape(out_f, in_f // group_size, group_size)
    if symmetric:
        scale = w.abs().amax(-1) / 7.5
    else:
        scale = (w.amax(-1).clamp(min=0) - w.amin(-1).clamp(max=0)) / 15
    tiny = max(torch.finfo(d).tiny for d in (scale_dtype, via_dtype or scale_dtype))
    scale = scale.clamp(min=tiny)
    if via_dtype is not None:
        scale = _round_up(scale, via_dtype).to(torch.float32)
    stored = _round_up(scale, scale_dtype)
    s = stored.to(torch.float32)
    if symmetric:
        zero = torch.full_like(s, 8.0)
    else:
        zero = (-w.amin(-1).clamp(max=0) / s).round().clamp(0, 15)
    q = ((w / s.unsqueeze(-1)).round() + zero.unsqueeze(-1)).clamp(0, 15).to(torch.uint8)
    q = q.reshape(out_f, in_f).t()
    return QuantizedWeight(pack_int4_along_k(q), stored.t().contiguous(), zero.t().contiguous().to(scale_dtype),
                           group_size)


def _round_up(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Positive float32 ``x`` -> the smallest ``dtype`` value >= x (positive floats order like their bits)."""
    y = x.to(dtype)
    low = y.to(torch.float32) < x
    if dtype != torch.float32 and bool(low.any()):
        bits = {2: torch.int16, 4: torch.int32}[y.element_size()]
        y = torch.where(low, (y.view(bits) + 1).view(dtype), y)
    return y


def is_quantizable(module: str, weight_shape: tuple[int, ...], group_size: int) -> bool:
    if len(weight_shape) != 2 or _KEEP_DENSE.search(module):
        return False
    out_f, in_f = weight_shape
    if _EXPERT.match(module):
        # other engines run a layer's experts as one fused MoE with one format, so gate/up/down must all pack:
        # gate/up [I, H] and down [H, I] both need H and I divisible by the group size
        return all(d % group_size == 0 and d % 8 == 0 for d in (out_f, in_f))
    return in_f % group_size == 0 and in_f % 8 == 0 and out_f % 8 == 0


class ShardWriter:
    """Collects output tensors and writes a shard whenever ``max_bytes`` is reached; ``finish`` names the
    shards like transformers does and writes the index."""

    def __init__(self, dst: Path, max_bytes: int):
        self.dst, self.max_bytes = dst, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: list[tuple[Path, list[str]]] = []
        self.names: set[str] = set()
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.names:
            raise CatEngineError(f"two output tensors are named {name}; the source checkpoint has duplicates")
        self.names.add(name)
        self.pending[name] = tensor.contiguous().cpu()
        n = tensor.numel() * tensor.element_size()
        self.pending_bytes += n
        self.total += n
        if self.pending_bytes >= self.max_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        tmp = self.dst / f".shard-{len(self.shards):05d}.safetensors.tmp"
        save_file(self.pending, str(tmp), metadata={"format": "pt"})
        os.chmod(tmp, _file_mode())   # safetensors writes 0600; a checkpoint is shared like any file
        self.shards.append((tmp, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> list[str]:
        self.flush()
        n = len(self.shards)
        weight_map, files = {}, []
        for i, (tmp, names) in enumerate(self.shards):
            final = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            tmp.rename(self.dst / final)
            files.append(final)
            weight_map.update({k: final for k in names})
        if n > 1:
            index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
            (self.dst / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        return files


def _file_mode() -> int:
    """What ``open()`` would give a new file: 0666 less the umask (read from the process, restored at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def skip_list(quantized: set[str], dense: set[str], method: str) -> list[str]:
    """Entries naming every dense linear-like module and no quantized one, as AWQ (substring) and
    compressed-tensors (exact / ``re:``) loaders read them. Names drop the ``model.`` / ``model.language_model.``
    prefix, which other engines rename; a layer's dense experts are named by their ``mlp.experts`` prefix, the
    name of the fused MoE layer other engines build."""
    out = []
    for p in _AWQ_SKIP if method == "awq" else _CT_SKIP:
        if any(matches_skip(m, [p], method) for m in dense) and \
                not any(matches_skip(m, [p], method) for m in quantized):
            out.append(p)
    units: list[str] = []
    for m in sorted(dense):
        if matches_skip(m, out, method):
            continue
        e = _EXPERT.match(m)
        unit = e[1] if e and not any(q.startswith(e[1] + ".") for q in quantized) else m
        if unit not in units:
            units.append(unit)
    for unit in units:
        short, tail = _MODEL_PREFIX.sub("", unit), r"(\..*)?$" if unit.endswith(".mlp.experts") else "$"
        entry = short if method == "awq" else "re:(.*\\.)?" + re.escape(short) + tail
        if any(matches_skip(q, [entry], method) for q in quantized):
            entry = unit
        out.append(entry)
    clash = sorted(q for q in quantized if matches_skip(q, out, method))
    if clash:  # a full module name that is a substring of a quantized module's name (AWQ only)
        raise CatEngineError(f"cannot write an AWQ skip list that spares {clash[:5]}; quantize with "
                             "--format compressed-tensors")
    return out


def quantization_config(method: str, group_size: int, symmetric: bool, skip: list[str]) -> dict:
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": skip}
    weights = {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": group_size,
               "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax",
               "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": "pack-quantized"}},
            "ignore": skip, "kv_cache_scheme": None, "global_compression_ratio": None, "sparsity_config": {}}


def quantize_checkpoint(src: str | Path, dst: str | Path, format: str = "awq", group_size: int = 128,
                        symmetric: bool = False, *, device="cpu", max_shard_bytes: int = 2 << 30,
                        progress: bool = True) -> Path:
    """Write the quantized checkpoint of ``src`` to ``dst`` (created; must not already hold a model)."""
    src, dst = Path(src), Path(dst)
    if format not in FORMATS:
        raise ConfigError(f"format {format!r} is not supported; use one of {FORMATS}")
    if group_size <= 0:
        raise ConfigError(f"group size must be positive, got {group_size}")
    cfg_file = src / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"{src} has no config.json; pass a Hugging Face model directory")
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config"):
        raise ConfigError(f"{src} is already quantized; quantize an fp16/bf16/fp32 checkpoint")
    if dst.resolve() == src.resolve() or (dst / "config.json").exists():
        raise ConfigError(f"{dst} already holds a model; choose a new or empty output directory")
    dst.mkdir(parents=True, exist_ok=True)

    tensors = list_tensors(src)
    writer = ShardWriter(dst, max_shard_bytes)
    quantized, dense = set(), set()
    files = list(dict.fromkeys(t.file for t in tensors))

    def put_linear(module: str, w: torch.Tensor) -> None:
        if not (w.is_floating_point() and is_quantizable(module, tuple(w.shape), group_size)):
            writer.add(f"{module}.weight", w)
            dense.add(module)
            return
        via = w.dtype if w.dtype in (torch.bfloat16, torch.float16) else None
        if format == "awq":
            parts = canonical_to_awq(rtn_quantize(w.to(device), group_size, symmetric, torch.float16, via))
        else:
            scale_dtype = w.dtype
            parts = canonical_to_ct(rtn_quantize(w.to(device), group_size, symmetric, scale_dtype), symmetric)
        for part, t in parts.items():
            writer.add(f"{module}.{part}", t)
        quantized.add(module)

    for i, (file, infos) in enumerate(itertools.groupby(tensors, key=lambda t: t.file)):
        if progress:
            print(f"catengine quantize: {file.name} ({i + 1}/{len(files)})", file=sys.stderr, flush=True)
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for info in infos:
                t = f.get_tensor(info.name)
                fused = _FUSED.match(info.name)
                if fused and t.dim() == 3:
                    base, which = fused[1], fused[2]
                    for e in range(t.shape[0]):
                        if which == "down_proj":
                            put_linear(f"{base}.{e}.down_proj", t[e])
                        else:
                            half = t.shape[1] // 2
                            put_linear(f"{base}.{e}.gate_proj", t[e, :half])
                            put_linear(f"{base}.{e}.up_proj", t[e, half:])
                elif info.name.endswith(".weight") and t.dim() >= 2:
                    put_linear(info.name[: -len(".weight")], t)
                else:
                    writer.add(info.name, t)
    writer.finish()

    cfg["quantization_config"] = quantization_config(format, group_size, symmetric,
                                               skip_list(quantized, dense, format))
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for p in src.iterdir():
        if p.is_file() and p.name not in ("config.json", INDEX_FILE) and not p.name.endswith(_WEIGHT_FILES):
            shutil.copy2(p, dst / p.name)
    if progress:
        print(f"catengine quantize: wrote {dst} ({len(quantized)} linears quantized to 4 bits, "
              f"{len(dense)} weights kept dense)", file=sys.stderr, flush=True)
    return dst
