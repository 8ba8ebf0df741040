"""ModelConfig: the text-model hyper-parameters an engine needs, read from a Hub ``config.json``."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

# Architectures whose text config sits under "text_config" in the published checkpoints.
_MULTIMODAL = {"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"}


@dataclass(frozen=True)
class QuantConfig:
    """How linear weights are stored on disk. ``method`` is "awq" or "compressed-tensors"."""
    method: str
    bits: int = 4
    group_size: int = 128
    symmetric: bool = False
    # module-name patterns left unquantized (AWQ modules_to_not_convert / CT ignore; "re:" = regex)
    skip: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    intermediate_size: int = 0          # dense MLP (0 for MoE models)
    num_experts: int = 0                # 0 = dense model
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    mtp_num_hidden_layers: int = 0
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "bfloat16"
    quant: QuantConfig | None = None
    hf_config: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def full_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def linear_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ConfigError(f"{path} has no config.json; pass a Hugging Face model directory")
        try:
            raw = json.loads(cfg_file.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"{cfg_file} is not valid JSON ({e}); fix or re-download it") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{cfg_file} holds a JSON {type(raw).__name__}, not an object; fix or re-download it")
        return cls.from_hf(raw)

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        """Accepts text-only (``Qwen3_5ForCausalLM``) and multimodal (``...ForConditionalGeneration``,
        text under ``text_config``) layouts."""
        archs = cfg.get("architectures") or []
        if not archs:
            raise ConfigError("config.json has no 'architectures' entry; cannot tell which model it is")
        arch = archs[0]
        text = dict(cfg.get("text_config") or {}) if arch in _MULTIMODAL or "text_config" in cfg else dict(cfg)
        for k in ("quantization_config", "torch_dtype", "dtype", "tie_word_embeddings", "eos_token_id"):
            if k not in text and k in cfg:
                text[k] = cfg[k]
        n_layers = _req(text, "num_hidden_layers")
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = text.get("full_attention_interval", 4)
            layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)]
        if len(layer_types) != n_layers:
            raise ConfigError(f"layer_types has {len(layer_types)} entries but num_hidden_layers is {n_layers}")
        unknown = set(layer_types) - {"linear_attention", "full_attention"}
        if unknown:
            raise ConfigError(f"unknown layer types {sorted(unknown)}; expected linear_attention/full_attention")
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        eos = text.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        hidden = _req(text, "hidden_size")
        heads = _req(text, "num_attention_heads")
        return cls(
            architecture=arch,
            vocab_size=_req(text, "vocab_size"),
            hidden_size=hidden,
            num_hidden_layers=n_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=heads,
            num_key_value_heads=text.get("num_key_value_heads", heads),
            head_dim=text.get("head_dim") or hidden // heads,
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10_000_000.0))),
            partial_rotary_factor=float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))),
            max_position_embeddings=text.get("max_position_embeddings", 262144),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
            linear_num_key_heads=text.get("linear_num_key_heads", 16),
            linear_num_value_heads=text.get("linear_num_value_heads", 32),
            linear_key_head_dim=text.get("linear_key_head_dim", 128),
            linear_value_head_dim=text.get("linear_value_head_dim", 128),
            linear_conv_kernel_dim=text.get("linear_conv_kernel_dim", 4),
            intermediate_size=text.get("intermediate_size", 0) if not text.get("num_experts") else 0,
            num_experts=text.get("num_experts", 0) or 0,
            num_experts_per_tok=text.get("num_experts_per_tok", 0) or 0,
            moe_intermediate_size=text.get("moe_intermediate_size", 0) or 0,
            shared_expert_intermediate_size=text.get("shared_expert_intermediate_size", 0) or 0,
            norm_topk_prob=bool(text.get("norm_topk_prob", True)),
            mtp_num_hidden_layers=text.get("mtp_num_hidden_layers", 0) or 0,
            eos_token_ids=eos,
            torch_dtype=str(text.get("dtype") or text.get("torch_dtype") or "bfloat16"),
            quant=_quant_config(text.get("quantization_config")),
            hf_config=cfg,
        )


def _req(d: dict, key: str):
    if key not in d:
        raise ConfigError(f"config.json lacks required field {key!r}")
    return d[key]


def _quant_config(q: dict | None) -> QuantConfig | None:
    if not q:
        return None
    method = q.get("quant_method")
    if method == "awq":
        if q.get("bits", 4) != 4 or str(q.get("version", "gemm")).lower() != "gemm":
            raise ConfigError(f"only 4-bit AWQ GEMM checkpoints are supported, got bits={q.get('bits')} "
                              f"version={q.get('version')}")
        if not q.get("zero_point", True):
            raise ConfigError("AWQ without zero points is not supported; use a zero_point=true checkpoint")
        return QuantConfig("awq", 4, int(q.get("group_size", 128)), False,
                           tuple(q.get("modules_to_not_convert") or ()))
    if method == "compressed-tensors":
        if q.get("format") not in ("pack-quantized", None):
            raise ConfigError(f"compressed-tensors format {q.get('format')!r} is not supported; "
                              "only 'pack-quantized' (W4A16) is")
        groups = q.get("config_groups") or {}
        if len(groups) != 1:
            raise ConfigError("compressed-tensors checkpoints with several config_groups are not supported")
        w = next(iter(groups.values())).get("weights") or {}
        if w.get("num_bits") != 4 or w.get("type", "int") != "int" or w.get("strategy") != "group":
            raise ConfigError("only compressed-tensors W4A16 int4 with strategy 'group' is supported, got "
                              f"{ {k: w.get(k) for k in ('num_bits', 'type', 'strategy')} }")
        return QuantConfig("compressed-tensors", 4, int(w.get("group_size", 128)), bool(w.get("symmetric", True)),
                           tuple(q.get("ignore") or ()))
    raise ConfigError(f"quantization method {method!r} is not supported; catengine loads 'awq' (4-bit GEMM) "
                      "and 'compressed-tensors' (pack-quantized W4A16) checkpoints, or unquantized fp16/bf16")
