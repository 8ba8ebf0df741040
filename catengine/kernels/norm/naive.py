"""Torch twins of the norm family: RMSNorm, gated RMSNorm, SiLU-and-mul, QK norm + RoPE (and the
RoPE cos/sin table): the oracle in tests and the engine's CPU path.

Each function has exactly the signature of the Triton implementation that replaces it on CUDA
(``catengine.kernels.ops`` picks one or the other); shapes use the letters of the package docstring
(:mod:`catengine.kernels`). Unless said otherwise, outputs have the dtype of the main input and math is
done in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps: float, residual=None):
    """Qwen's (1 + w) RMSNorm over the last dim.

    x: [T, H]; weight: [H] (stored as w, the kernel adds 1); residual: optional [T, H].
    Without residual returns ``y``. With residual it first forms ``s = x + residual`` in fp32, rounded
    to residual.dtype (the residual stream's dtype: fp32 for fp16 models, whose 65,504 range the
    stream outgrows), and returns ``(rmsnorm(s), s)``. x may be fp32 while weight is fp16 (the MoE
    output, handed over unrounded). ``y`` has weight.dtype (the model dtype).
    """
    s = x if residual is None else (x.float() + residual.float()).to(residual.dtype)
    xf = s.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    y = y.to(weight.dtype)
    return y if residual is None else (y, s)


def gated_rms_norm(x, z, weight, eps: float):
    """GDN output norm: ``weight * rmsnorm(x) * silu(z)`` (plain w, not 1 + w), per head.

    x, z: [T, Hv, dv]; weight: [dv]. Returns [T, Hv, dv] in x.dtype.
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = y.to(x.dtype).float() * weight.float() * F.silu(z.float())
    return y.to(x.dtype)


def silu_mul(x):
    """x: [T, 2I] holding [gate | up] -> silu(gate) * up: [T, I]."""
    gate, up = x.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(x.dtype)


def rope_cos_sin_cache(max_positions: int, rotary_dim: int, theta: float, device=None):
    """[max_positions, rotary_dim] fp32: columns [0, rotary_dim/2) are cos, the rest sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float() / rotary_dim))
    pos = torch.arange(max_positions, dtype=torch.float32, device=device)
    freqs = pos[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _neox_rope(x, cos, sin):
    """x: [T, heads, d]; cos/sin: [T, rot/2]. Rotates the first rot dims (rotate-half layout)."""
    rot = cos.shape[-1] * 2
    x_rot, x_pass = x[..., :rot].float(), x[..., rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
    return torch.cat([out, x_pass], dim=-1)


def qk_norm_rope(q, k, q_weight, k_weight, positions, cos_sin_cache, eps: float):
    """Per-head (1 + w) RMSNorm of q and k, then partial NeoX RoPE on the first rotary dims.

    q: [T, nh, d]; k: [T, nkv, d]; q_weight, k_weight: [d]; positions: [T] int64;
    cos_sin_cache: [max_pos, rot] from :func:`rope_cos_sin_cache`. Returns new (q, k).
    """
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache[positions]
    cos, sin = cs[:, :half], cs[:, half:]
    qn = rms_norm(q, q_weight, eps)
    kn = rms_norm(k, k_weight, eps)
    return _neox_rope(qn, cos, sin), _neox_rope(kn, cos, sin)
