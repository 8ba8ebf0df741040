"""Tiny random checkpoints whose heads and widths split over 1, 2 and 4 ranks (4-bit ones with group 8,
so a TP4 slice of every quantized dim still holds whole groups)."""
from __future__ import annotations

from pathlib import Path

import torch

from catengine.tools.quantize import quantize_checkpoint
from catengine.tools.random_checkpoint import write_random_checkpoint

TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16, linear_value_head_dim=16,
            vocab_size=512, max_position_embeddings=512)
DENSE = dict(base="qwen3.5-27b", intermediate_size=128, **TINY)
MOE = dict(base="qwen3.6-35b-a3b", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=64, **TINY)
GROUP = 8


def tiny_checkpoint(root: Path, moe: bool = False, quant: str | None = None, mtp: bool = False,
                    **overrides) -> Path:
    """An fp16 random checkpoint under ``root`` (quant: "awq" or "compressed-tensors" of it)."""
    name = f"{'moe' if moe else 'dense'}{'-mtp' if mtp else ''}"
    src = root / name
    if not (src / "config.json").exists():
        write_random_checkpoint(src, {**(MOE if moe else DENSE), **overrides}, quant=None, dtype=torch.float16,
                                seed=3, mtp=mtp, progress=False)
    if quant is None:
        return src
    dst = root / f"{name}-{quant}"
    if not (dst / "config.json").exists():
        quantize_checkpoint(src, dst, quant, group_size=GROUP, progress=False)
    return dst
