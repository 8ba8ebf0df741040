"""The demo model in torch modules whose parameter names are the published Qwen3.5 checkpoint's (``model.*`` in
the text-only layout, ``mtp.*`` for the MTP head), so ``state_dict()`` is the checkpoint: transformers'
``Qwen3_5ForCausalLM`` and catengine load what :func:`save_checkpoint` writes (tests/tools/test_train_demo.py
checks both against these modules).

Architecture (as transformers' Qwen3.5): pre-norm decoder layers with (1+w) RMSNorm; Gated DeltaNet layers
(causal depthwise conv + SiLU on q/k/v, L2-normalized q/k, gated RMSNorm on the output) and gated full attention
(q_proj emits query and a sigmoid output gate per head, q/k RMSNorm, partial RoPE on the first rotary_dim dims)
in the order of ``layer_types``; SiLU MLP; tied embeddings. The MTP head: h_mtp = norm(layer(fc(cat[
norm_e(embed(x_{t+1})), norm_h(h_t)]))), with the main model's final-norm hidden h_t, predicting x_{t+2}.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .gdn import chunk_gated_delta_rule


@dataclass(frozen=True)
class DemoConfig:
    vocab_size: int = 8192
    hidden_size: int = 384
    intermediate_size: int = 1024
    layer_types: tuple[str, ...] = ("linear_attention",) * 3 + ("full_attention",) + \
        ("linear_attention",) * 3 + ("full_attention",)
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 64          # the smallest head size catengine's Triton attention has launch configs for
    linear_num_key_heads: int = 4
    linear_num_value_heads: int = 8
    linear_key_head_dim: int = 64
    linear_value_head_dim: int = 64
    linear_conv_kernel_dim: int = 4
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    mtp: bool = True

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def hf_config(self, eos_token_id: int, pad_token_id: int) -> dict:
        """config.json in the text-only published layout (what the random-weight demo model writes)."""
        half = self.rotary_dim // 2
        sec = [half - 2 * (half // 3), half // 3, half // 3]
        return {
            "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": len(self.layer_types),
            "layer_types": list(self.layer_types), "full_attention_interval": 4,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "attn_output_gate": True,
            "linear_num_key_heads": self.linear_num_key_heads, "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim, "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim, "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps, "max_position_embeddings": self.max_position_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor,
                                "mrope_section": sec, "mrope_interleaved": True},
            "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
            "tie_word_embeddings": True, "use_cache": True,
            "mtp_num_hidden_layers": 1 if self.mtp else 0, "mtp_use_dedicated_embeddings": False,
            "bos_token_id": None, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id,
            "dtype": "bfloat16", "transformers_version": "5.17.0",
        }


class RMSNorm(nn.Module):
    """x / rms(x) * (1 + w), in float32 (Qwen3.5's zero-centred norm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """The GDN output norm: x / rms(x) * w * silu(z) (w starts at 1, not zero-centred)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x, z):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * y * F.silu(z.float())).type_as(x)


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float):
    inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, device=positions.device, dtype=torch.float32) / rotary_dim)
    f = positions.float()[:, None] * inv
    f = torch.cat([f, f], dim=-1)
    return f.cos(), f.sin()


def apply_rope(x, cos, sin):
    """x [B, H, T, D]: rotate_half RoPE on the first cos.shape[-1] dims, the rest passes through."""
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return torch.cat([xr * cos.to(x.dtype) + rot * sin.to(x.dtype), xp], dim=-1)


class Attention(nn.Module):
    def __init__(self, c: DemoConfig):
        super().__init__()
        self.nh, self.nkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        h = c.hidden_size
        self.q_proj = nn.Linear(h, 2 * self.nh * self.d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.nh * self.d, h, bias=False)
        self.q_norm, self.k_norm = RMSNorm(self.d, c.rms_norm_eps), RMSNorm(self.d, c.rms_norm_eps)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, gate = self.q_proj(x).view(B, T, self.nh, 2 * self.d).chunk(2, dim=-1)
        q = apply_rope(self.q_norm(q).transpose(1, 2), cos, sin)
        k = apply_rope(self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.d)).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.d) * torch.sigmoid(gate.reshape(B, T, -1))
        return self.o_proj(o)


class GatedDeltaNet(nn.Module):
    def __init__(self, c: DemoConfig):
        super().__init__()
        self.hk, self.hv = c.linear_num_key_heads, c.linear_num_value_heads
        self.dk, self.dv = c.linear_key_head_dim, c.linear_value_head_dim
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        conv_dim = 2 * self.key_dim + self.value_dim
        h = c.hidden_size
        self.in_proj_qkv = nn.Linear(h, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(h, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(h, self.hv, bias=False)
        self.in_proj_a = nn.Linear(h, self.hv, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, c.linear_conv_kernel_dim, groups=conv_dim, bias=False,
                                padding=c.linear_conv_kernel_dim - 1)
        # Mamba-style init: decays exp(-A * dt) from ~0.2 to ~0.999 per token, slow and fast heads
        dt = torch.empty(self.hv).uniform_(math.log(1e-3), math.log(1e-1)).exp()
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.empty(self.hv).uniform_(1, 16).log())
        self.norm = GatedRMSNorm(self.dv, c.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        qkv = F.silu(self.conv1d(self.in_proj_qkv(x).transpose(1, 2))[..., :T]).transpose(1, 2)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.hv // self.hk
        q = q.reshape(B, T, self.hk, self.dk).repeat_interleave(rep, dim=2)
        k = k.reshape(B, T, self.hk, self.dk).repeat_interleave(rep, dim=2)
        v = v.reshape(B, T, self.hv, self.dv)
        beta = torch.sigmoid(self.in_proj_b(x)).float()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        # the scan accumulates over the whole sequence: keep it in float32 even under bf16 autocast
        with torch.autocast(device_type=x.device.type, enabled=False):
            qf, kf = q.float(), k.float()
            qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + 1e-6)
            kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
            o = chunk_gated_delta_rule(qf, kf, v.float(), g, beta)
        z = self.in_proj_z(x).reshape(B, T, self.hv, self.dv)
        o = self.norm(o.to(z.dtype), z)
        return self.out_proj(o.reshape(B, T, self.value_dim))


class MLP(nn.Module):
    def __init__(self, c: DemoConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: DemoConfig, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(c)
        else:
            self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin):
        h = self.input_layernorm(x)
        h = self.linear_attn(h) if self.kind == "linear_attention" else self.self_attn(h, cos, sin)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    def __init__(self, c: DemoConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, t) for t in c.layer_types)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class MTPHead(nn.Module):
    def __init__(self, c: DemoConfig):
        super().__init__()
        eps = c.rms_norm_eps
        self.pre_fc_norm_embedding, self.pre_fc_norm_hidden = RMSNorm(c.hidden_size, eps), RMSNorm(c.hidden_size, eps)
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(c, "full_attention")])
        self.norm = RMSNorm(c.hidden_size, eps)


class DemoModel(nn.Module):
    """``forward(ids)`` -> final-norm hidden ``[B, T, H]``; ``mtp_hidden(ids, hidden)`` -> the MTP head's hidden for
    predicting ``ids[:, t+2]`` at position t (length T-1); ``logits`` applies the tied embedding."""

    def __init__(self, c: DemoConfig):
        super().__init__()
        self.config = c
        self.model = TextModel(c)
        self.mtp = MTPHead(c) if c.mtp else None
        self._init_weights()

    def _init_weights(self):
        n_layers = len(self.config.layer_types)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                    std = 0.02 / math.sqrt(2 * n_layers)  # residual branches: the stream stays ~O(1) at init
                nn.init.normal_(p, std=std)

    def _rope(self, T, device):
        c = self.config
        return rope_cos_sin(torch.arange(T, device=device), c.rotary_dim, c.rope_theta)

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        cos, sin = self._rope(ids.shape[1], ids.device)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x)

    def mtp_hidden(self, ids, hidden):
        m = self.mtp
        e = m.pre_fc_norm_embedding(self.model.embed_tokens(ids[:, 1:]))
        x = m.fc(torch.cat([e, m.pre_fc_norm_hidden(hidden[:, :-1])], dim=-1))
        cos, sin = self._rope(x.shape[1], ids.device)
        return m.norm(m.layers[0](x, cos, sin))

    def logits(self, hidden):
        return F.linear(hidden, self.model.embed_tokens.weight)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def save_checkpoint(model: DemoModel, out: Path, tokenizer_files: dict[str, Path], eos_token_id: int,
                    pad_token_id: int, extra_generation: dict | None = None) -> None:
    """Write config.json, generation_config.json, model.safetensors (bf16) and the tokenizer files into ``out``."""
    from safetensors.torch import save_file
    from ..demo import GENERATION_CONFIG, TOKENIZER_CONFIG

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in sorted(model.state_dict().items())}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name, src in tokenizer_files.items():
        (out / name).write_bytes(Path(src).read_bytes())
    gen = dict(GENERATION_CONFIG, bos_token_id=pad_token_id, pad_token_id=pad_token_id,
               eos_token_id=[eos_token_id, pad_token_id], **(extra_generation or {}))
    tok_cfg = dict(TOKENIZER_CONFIG, model_max_length=model.config.max_position_embeddings)
    for name, obj in (("generation_config.json", gen), ("tokenizer_config.json", tok_cfg),
                      ("config.json", model.config.hf_config(eos_token_id, pad_token_id))):
        (out / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def config_from_hf(cfg: dict) -> DemoConfig:
    """The DemoConfig of a config.json this module wrote."""
    rope = cfg["rope_parameters"]
    return DemoConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        layer_types=tuple(cfg["layer_types"]), num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
        linear_num_key_heads=cfg["linear_num_key_heads"], linear_num_value_heads=cfg["linear_num_value_heads"],
        linear_key_head_dim=cfg["linear_key_head_dim"], linear_value_head_dim=cfg["linear_value_head_dim"],
        linear_conv_kernel_dim=cfg["linear_conv_kernel_dim"], partial_rotary_factor=rope["partial_rotary_factor"],
        rope_theta=rope["rope_theta"], rms_norm_eps=cfg["rms_norm_eps"],
        max_position_embeddings=cfg["max_position_embeddings"], mtp=bool(cfg.get("mtp_num_hidden_layers")))


def load_checkpoint(path, dtype=torch.float32) -> DemoModel:
    """A DemoModel holding an unquantized checkpoint written by :func:`save_checkpoint`."""
    from safetensors.torch import load_file

    path = Path(path)
    model = DemoModel(config_from_hf(json.loads((path / "config.json").read_text())))
    model.load_state_dict(load_file(str(path / "model.safetensors")))
    return model.to(dtype).eval()
