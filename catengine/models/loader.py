"""Stream a safetensors checkpoint as normalized text-model tensors.

``iter_checkpoint`` yields ``(name, value)`` pairs one tensor at a time (a 60 GB checkpoint never sits
in memory twice), with names in the text-only layout whatever the layout on disk:

- ``model.language_model.X`` (published multimodal checkpoints) -> ``model.X``; vision tensors are
  skipped; ``mtp.*`` passes through.
- A quantized linear (AutoAWQ GEMM or compressed-tensors pack-quantized, see ``quant_formats.py``) comes
  out as ONE item ``<module>.weight`` holding a canonical :class:`QuantizedWeight`.
- MoE experts come out fused whatever their layout on disk: ``<layer>.mlp.experts.gate_up_proj`` (dense
  ``[E, 2I, H]`` gate rows first, or QuantizedWeight ``[E, H/8, 2I]`` gate columns first) and
  ``<layer>.mlp.experts.down_proj`` (dense ``[E, H, I]`` or QuantizedWeight ``[E, I/8, H]``). Per-expert
  tensors are copied into the stacked result as they arrive, so only one layer's experts are buffered.

The whole plan (names, quantized modules, expert sets) is checked from the safetensors headers before any
tensor data is read, so an incomplete checkpoint fails at once with the offending tensor names.
"""
from __future__ import annotations

import itertools
import json
import logging
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import safe_open

from ..errors import ModelLoadError
from ..kernels.w4a16.packing import QuantizedWeight
from .model_config import ModelConfig
from .load_progress import Progress as _Progress
from .shard_read import Shard, Slicer, read_slice
from .quant_formats import QUANT_PARTS, awq_to_canonical, ct_to_canonical, matches_skip, module_format

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
VISION_PREFIXES = ("model.visual.", "visual.", "model.vision_tower.", "vision_tower.",
                   "model.multi_modal_projector.", "multi_modal_projector.")
_PREFIX_MAP = (("model.language_model.", "model."), ("language_model.model.", "model."),
               ("language_model.lm_head.", "lm_head."))
_EXPERT_RE = re.compile(r"^(.+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)$")
_FUSED_RE = re.compile(r"^(.+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def normalize_name(name: str) -> str | None:
    """On-disk tensor name -> text-only name; None for vision tensors (not used for text serving)."""
    if name.startswith(VISION_PREFIXES):
        return None
    for old, new in _PREFIX_MAP:
        if name.startswith(old):
            return new + name[len(old):]
    return name


@dataclass(frozen=True)
class TensorInfo:
    name: str           # as stored
    file: Path
    dtype: str          # safetensors dtype string ("BF16", "I32", ...)
    shape: tuple[int, ...]
    offset: int         # data offset inside the file: reading in this order is sequential
    nbytes: int


def read_header(file: Path) -> dict[str, TensorInfo]:
    """The tensor table of one safetensors file, read from its JSON header only. ModelLoadError when
    the file is not safetensors or is shorter than its header says (an interrupted download)."""
    size = Path(file).stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < n <= size - 8:
            raise ModelLoadError(f"{file} is not a safetensors file (no valid header; {size} bytes); re-download it")
        try:
            header = json.loads(f.read(n))
            header.pop("__metadata__", None)
            table = {k: TensorInfo(k, file, v["dtype"], tuple(v["shape"]), v["data_offsets"][0],
                                   v["data_offsets"][1] - v["data_offsets"][0]) for k, v in header.items()}
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise ModelLoadError(f"{file} has a corrupt safetensors header ({type(e).__name__}: {e}); "
                                 "re-download it") from None
    end = max((t.offset + t.nbytes for t in table.values()), default=0)
    if 8 + n + end > size:
        raise ModelLoadError(f"{file} is truncated: its header needs {8 + n + end} bytes but the file has {size}; "
                             "re-download it")
    return table


def _open_safetensors(file: Path):
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as e:  # noqa: BLE001 (safetensors raises its own SafetensorError for any bad file)
        raise ModelLoadError(f"{file} cannot be read as safetensors ({e}); re-download it") from None


def list_tensors(path: str | Path) -> list[TensorInfo]:
    """Every tensor of a checkpoint directory (sharded with an index, or ``*.safetensors`` files), in read
    order. ModelLoadError naming the tensors when a shard file or an indexed tensor is missing."""
    path = Path(path)
    if path.is_file():
        return sorted(read_header(path).values(), key=lambda t: t.offset)
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text()).get("weight_map") or {}
        except (ValueError, AttributeError) as e:
            raise ModelLoadError(f"{index} is not a JSON index ({e}); re-download the checkpoint") from None
        files = sorted(set(weight_map.values()))
        absent = [f for f in files if not (path / f).is_file()]
        if absent:
            lost = [k for k, v in weight_map.items() if v in absent]
            raise ModelLoadError(f"{path}: shard files {absent} listed in {INDEX_FILE} do not exist; they hold "
                                 f"{len(lost)} tensors, e.g. {_sample(lost)}. Re-download the checkpoint")
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{path} holds no *.safetensors files; pass a Hugging Face model directory "
                                 "with safetensors weights")
        weight_map = None
    out, missing = [], []
    for f in files:
        header = read_header(path / f)
        if weight_map is None:
            out.extend(sorted(header.values(), key=lambda t: t.offset))
            continue
        wanted = [k for k, v in weight_map.items() if v == f]
        missing += [f"{k} (in {f})" for k in wanted if k not in header]
        out.extend(sorted((header[k] for k in wanted if k in header), key=lambda t: t.offset))
    if missing:
        raise ModelLoadError(f"{path}: {len(missing)} tensors listed in {INDEX_FILE} are absent from their shard: "
                             f"{_sample(missing)}. The shard is truncated or from another checkpoint")
    return out


def _sample(names: list[str], n: int = 20) -> str:
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


# ----------------------------------------------------------------------------- plan
@dataclass
class _Plan:
    tensors: list[TensorInfo]
    route: dict[str, tuple[str, str]]            # stored name -> (kind, key); kind: dense | part
    quant: dict[str, dict[str, str]]             # normalized module -> {part: stored name}
    formats: dict[str, str]                      # normalized module -> awq | compressed-tensors
    experts: dict[str, "_ExpertSet"] = field(default_factory=dict)   # "<layer>.mlp.experts" -> set
    unit_of: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # unit -> (set, e, proj)


@dataclass
class _ExpertSet:
    num_experts: int            # in the stack: all, or this rank's (expert parallelism)
    pending: int
    first: int = 0              # the stack's first expert
    gate_up: torch.Tensor | QuantizedWeight | None = None
    down: torch.Tensor | QuantizedWeight | None = None


def _plan(path: Path, config: ModelConfig) -> _Plan:
    tensors = [t for t in list_tensors(path) if normalize_name(t.name) is not None]
    route: dict[str, tuple[str, str]] = {}
    quant: dict[str, dict[str, str]] = {}
    dense: set[str] = set()
    for t in tensors:
        name = normalize_name(t.name)
        module, _, part = name.rpartition(".")
        if part in QUANT_PARTS and module:
            quant.setdefault(module, {})[part] = t.name
            route[t.name] = ("part", module)
        else:
            if name in dense:
                raise ModelLoadError(f"{path}: two stored tensors normalize to {name} (both layouts in one "
                                     "checkpoint?); remove the duplicate")
            dense.add(name)
            route[t.name] = ("dense", name)
    fp8 = [t.name for t in tensors if t.dtype.startswith("F8")]
    clash = [f"{m}.weight" for m in quant if f"{m}.weight" in dense]
    if fp8 or clash:
        raise ModelLoadError(
            f"{path}: weights stored as FP8 or as a dense weight plus scales ({_sample(fp8 or clash)}) use a "
            "quantization scheme catengine does not run; use an unquantized, AWQ (4-bit GEMM) or "
            "compressed-tensors pack-quantized W4A16 checkpoint")
    formats = {m: module_format(m, parts) for m, parts in quant.items()}
    plan = _Plan(tensors, route, quant, formats)
    _plan_experts(plan, dense, config)
    _diagnose(plan, config)
    return plan


def _plan_experts(plan: _Plan, dense: set[str], config: ModelConfig) -> None:
    units: dict[str, dict[tuple[int, str], bool]] = {}   # set -> {(e, proj): quantized}
    for unit, quantized in [(n[: -len(".weight")], False) for n in dense if n.endswith(".weight")] + \
                           [(m, True) for m in plan.quant]:
        m = _EXPERT_RE.match(unit)
        if m:
            units.setdefault(m[1], {})[(int(m[2]), m[3])] = quantized
            plan.unit_of[unit] = (m[1], int(m[2]), m[3])
    fused = {m[1] for n in dense if (m := _FUSED_RE.match(n))}
    both = sorted(set(units) & fused)
    if both:
        raise ModelLoadError(f"experts of {both} are stored both fused and per expert; keep one layout")
    for key, found in units.items():
        n = config.num_experts or 1 + max(e for e, _ in found)
        need = {(e, p) for e in range(n) for p in ("gate_proj", "up_proj", "down_proj")}
        missing = sorted(need - set(found))
        extra = sorted(set(found) - need)
        if missing or extra:
            raise ModelLoadError(
                f"{key}: per-expert tensors do not cover experts 0..{n - 1} (num_experts={n}); missing "
                f"{_sample([f'{key}.{e}.{p}' for e, p in missing]) or 'none'}; beyond num_experts "
                f"{_sample([f'{key}.{e}.{p}' for e, p in extra]) or 'none'}")
        for target, projs in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
            kinds = {q for (e, p), q in found.items() if p in projs}
            if len(kinds) > 1:
                dense_units = sorted(f"{key}.{e}.{p}" for (e, p), q in found.items() if p in projs and not q)
                raise ModelLoadError(
                    f"{key}.{target}: some experts are quantized and some are dense ({_sample(dense_units)}); "
                    "catengine stacks experts into one tensor and needs one format per stacked tensor")
        plan.experts[key] = _ExpertSet(n, 3 * n)


def _diagnose(plan: _Plan, config: ModelConfig) -> None:
    q = config.quant
    if plan.quant and q is None:
        log.warning("checkpoint holds %d quantized modules but config.json has no quantization_config; "
                    "loading what the tensors say", len(plan.quant))
    if q is None:
        return
    other = sorted({f for f in plan.formats.values() if f != q.method})
    if other:
        log.warning("config.json says %s but tensors are %s; loading what the tensors say", q.method, other)
    skipped_but_quantized = [m for m in plan.quant if matches_skip(m, q.skip, q.method)]
    if skipped_but_quantized:
        log.warning("modules quantized although the skip list names them: %s", _sample(skipped_but_quantized))


# ----------------------------------------------------------------------------- streaming
def iter_checkpoint(path: str | Path, config: ModelConfig, *, device="cpu", dtype: torch.dtype | None = None,
                    progress: bool | str = True, shard: Callable[[str], Shard | None] | None = None,
                    reads: list | None = None, experts: tuple[int, int] | None = None,
                    ) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
    """Yield normalized ``(name, tensor | QuantizedWeight)`` pairs from the checkpoint at ``path``.

    ``dtype`` casts every floating tensor (and quantization scales/zeros) when given. ``progress``: True shows
    a progress line on stderr for checkpoints over 1 GB, "always" for any size, False never. ``shard``
    (tensor parallelism, :meth:`TPLayout.shard`): only that slice of each tensor is read from the file
    (safetensors slices), packed 4-bit tensors cut along their packed dims. ``reads``: a list that gets
    ``(stored name, dim, ranges, bytes)`` for every read (tests check each slice is read once). ``experts``
    (lo, hi), expert parallelism: per-expert tensors of experts outside lo..hi-1 are not read, and the
    stacks hold experts lo..hi-1 only (``shard`` cuts fused stacks to the same range).
    """
    path = Path(path)
    plan = _plan(path, config)
    if experts is not None:
        for s in plan.experts.values():
            s.first, s.num_experts, s.pending = experts[0], experts[1] - experts[0], 3 * (experts[1] - experts[0])
    device = torch.device(device)
    parts: dict[str, dict[str, torch.Tensor]] = {}
    slicer = Slicer(plan, shard) if shard is not None else None
    with _Progress(plan.tensors, progress) as bar:
        for file, infos in itertools.groupby(plan.tensors, key=lambda t: t.file):
            with _open_safetensors(file) as f:
                for info in infos:
                    if experts is not None and not _local_expert(plan, info, experts):
                        bar.advance(info)
                        continue
                    cut = slicer.cut(info) if slicer is not None else None
                    tensor = (read_slice(f, info, cut) if cut is not None else f.get_tensor(info.name)).to(device)
                    if slicer is not None:
                        tensor = slicer.fix(info, tensor)
                    if reads is not None:
                        reads.append((info.name, *(cut or (None, None)), tensor.numel() * tensor.element_size()))
                    bar.advance(info)
                    kind, key = plan.route[info.name]
                    if kind == "dense":
                        if dtype is not None and tensor.is_floating_point():
                            tensor = tensor.to(dtype)
                        unit = key[: -len(".weight")] if key.endswith(".weight") else None
                        yield from _emit(plan, unit, key, tensor, device)
                        continue
                    got = parts.setdefault(key, {})
                    got[info.name.rpartition(".")[2]] = tensor
                    if len(got) == len(plan.quant[key]):
                        del parts[key]
                        qw = _to_canonical(plan.formats[key], key, got, dtype)
                        yield from _emit(plan, key, f"{key}.weight", qw, device)
    left = sorted(k for k, s in plan.experts.items() if s.pending) + sorted(parts)
    if left:  # the plan guarantees completeness; this only guards against a changed file mid-load
        raise ModelLoadError(f"checkpoint ended before these modules were complete: {_sample(left)}")


def _to_canonical(fmt: str, module: str, got: dict[str, torch.Tensor], dtype) -> QuantizedWeight:
    if fmt == "awq":
        return awq_to_canonical(got["qweight"], got["qzeros"], got["scales"], dtype=dtype, module=module)
    return ct_to_canonical(got["weight_packed"], got["weight_scale"], got["weight_shape"],
                           got.get("weight_zero_point"), got.get("weight_g_idx"), dtype=dtype, module=module)


def _local_expert(plan: _Plan, info: TensorInfo, experts: tuple[int, int]) -> bool:
    """False for a per-expert tensor of an expert outside ``experts`` (another rank's)."""
    kind, key = plan.route[info.name]
    unit = key if kind == "part" else key[: -len(".weight")]
    where = plan.unit_of.get(unit)
    return where is None or experts[0] <= where[1] < experts[1]


def _emit(plan: _Plan, unit: str | None, name: str, value, device):
    """Yield ``value`` under ``name``, or place it into its stacked expert tensor (yielded when complete)."""
    where = plan.unit_of.get(unit) if unit is not None else None
    if where is None:
        yield name, value
        return
    key, e, proj = where
    s = plan.experts[key]
    if proj == "down_proj":
        s.down = _place(s.down, value, e - s.first, s.num_experts, 0, key, proj, device)
    else:
        s.gate_up = _place(s.gate_up, value, e - s.first, s.num_experts, 0 if proj == "gate_proj" else 1, key, proj,
                           device)
    s.pending -= 1
    if s.pending == 0:
        yield f"{key}.gate_up_proj", s.gate_up
        yield f"{key}.down_proj", s.down
        s.gate_up = s.down = None


def _place(stack, value, e: int, n: int, half: int, key: str, proj: str, device):
    """Copy expert ``e``'s ``value`` into ``stack`` (allocated on first use). ``half`` picks the gate (0) or up (1)
    slice of gate_up: rows of a dense [out, in] weight, columns of a QuantizedWeight (x @ w layout)."""
    fused = proj != "down_proj"
    if isinstance(value, QuantizedWeight):
        k8, cols = value.qweight.shape
        if stack is None:
            width = cols * (2 if fused else 1)
            stack = QuantizedWeight(
                torch.empty((n, k8, width), dtype=torch.int32, device=device),
                torch.empty((n, value.scales.shape[0], width), dtype=value.scales.dtype, device=device),
                torch.empty((n, value.zeros.shape[0], width), dtype=value.zeros.dtype, device=device),
                value.group_size)
        if value.group_size != stack.group_size or value.qweight.shape[0] != stack.qweight.shape[1] or \
                cols * (2 if fused else 1) != stack.qweight.shape[2]:
            raise ModelLoadError(f"{key}.{e}.{proj}: shape {tuple(value.qweight.shape)} / group size "
                                 f"{value.group_size} differs from the other experts of this layer")
        sl = slice(half * cols, (half + 1) * cols)
        for dst, src in ((stack.qweight, value.qweight), (stack.scales, value.scales), (stack.zeros, value.zeros)):
            dst[e, :, sl] = src
        return stack
    rows, cols = value.shape
    if stack is None:
        stack = torch.empty((n, rows * (2 if fused else 1), cols), dtype=value.dtype, device=device)
    if stack.shape[1:] != (rows * (2 if fused else 1), cols):
        raise ModelLoadError(f"{key}.{e}.{proj}.weight: shape {tuple(value.shape)} differs from the other experts "
                             "of this layer")
    stack[e, half * rows:(half + 1) * rows] = value
    return stack


def checkpoint_names(path: str | Path, config: ModelConfig) -> dict[str, str]:
    """Normalized names ``iter_checkpoint`` will yield -> "dense" or "quantized", from the headers only."""
    plan = _plan(Path(path), config)
    out: dict[str, str] = {}
    for kind, key in plan.route.values():
        unit = key if kind == "part" else (key[: -len(".weight")] if key.endswith(".weight") else None)
        q = kind == "part"
        where = plan.unit_of.get(unit) if unit is not None else None
        if where is not None:
            out[f"{where[0]}.{'down_proj' if where[2] == 'down_proj' else 'gate_up_proj'}"] = \
                "quantized" if q else "dense"
        else:
            out[f"{key}.weight" if q else key] = "quantized" if q else "dense"
    return out
