"""What `catengine bench` (:mod:`catengine.tools.bench`) and its transformers sections
(:mod:`catengine.tools.correctness`) share: the presets, their random checkpoints, the vLLM figures they are read
against, and the timing helpers. Both import it; neither imports the other at module level, so there is no cycle.
"""
from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import torch

from ..errors import ConfigError

# vLLM 0.25.0 on the H200 (fp16, CUDA graphs): batch-1 decode and transformers 5.17 from issue 8 ("What the peer
# reaches on this H200"); 8K prefill and 32 concurrent from issue 21's later side-by-side run (same protocol, the
# figures its targets are set against)
PEERS = {
    "qwen3.5-27b": {"decode_b1_short": 97.3, "decode_b1_long": 100.0, "prefill_8192": 12202.0,
                    "concurrent_32": 1758.0, "transformers_fp16_b1": 8.4},
    "qwen3.6-35b-a3b": {"decode_b1_short": 218.6, "decode_b1_long": 231.3, "prefill_8192": 44489.0,
                        "concurrent_32": 3777.0},
}
_TINY = dict(vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
             head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
             linear_value_head_dim=32, max_position_embeddings=4096)
# (text_config overrides or a preset name, AWQ group size)
BENCH_PRESETS: dict[str, tuple[str | dict, int]] = {
    "qwen3.5-27b": ("qwen3.5-27b", 128),
    "qwen3.6-35b-a3b": ("qwen3.6-35b-a3b", 128),
    "qwen3.5-122b-a10b": ("qwen3.5-122b-a10b", 128),
    "tiny-dense": (dict(base="qwen3.5-27b", intermediate_size=256, **_TINY), 32),
    "tiny-moe": (dict(base="qwen3.6-35b-a3b", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                      shared_expert_intermediate_size=64, **_TINY), 32),
}
ALIASES = {"qwen3.6-27b": "qwen3.5-27b", "qwen3.5-35b-a3b": "qwen3.6-35b-a3b"}


# ----------------------------------------------------------------------------- pure helpers
def incremental_tps(lat_n: list[float], lat_1: list[float], n: int) -> float:
    """``(n - 1) / (median(lat_n) - median(lat_1))``: decode tokens per second with prefill and the first token
    cancelled. NaN when the difference is not positive (noise larger than the decode time: raise n or reps)."""
    if n < 2:
        raise ValueError(f"incremental TPS needs n >= 2 generated tokens, got {n}")
    if not lat_n or not lat_1:
        raise ValueError("incremental TPS needs at least one latency for each length")
    diff = statistics.median(lat_n) - statistics.median(lat_1)
    return (n - 1) / diff if diff > 0 else float("nan")


def print_table(title: str, header: list[str], rows: list[list], file=None) -> str:
    """Print (and return) a Markdown table, numbers formatted compactly."""
    def fmt(v):
        if isinstance(v, float):
            if not math.isfinite(v):
                return "n/a"
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return "-" if v is None else str(v)
    lines = [f"### {title}", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    if any(isinstance(v, float) and not math.isfinite(v) for row in rows for v in row):
        # incremental_tps gives NaN when timing noise exceeds the decode time (short --quick runs, CPU)
        lines.append("(n/a: lost in timing noise; more --reps or longer runs give a number)")
    text = "\n".join(lines)
    print(text, file=file, flush=True)
    return text


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work: a wall-time measurement then covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_prompts(rng: random.Random, count: int, length: int, vocab: int) -> list[list[int]]:
    hi = min(vocab, 150_000)  # below the special tokens of the real vocabulary
    return [[rng.randrange(hi) for _ in range(length)] for _ in range(count)]


# ----------------------------------------------------------------------------- checkpoints
def resolve_preset(name: str) -> str:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in BENCH_PRESETS:
        raise ConfigError(f"unknown --model-preset {name!r}; use one of {sorted(BENCH_PRESETS)}")
    return key


def checkpoint(workdir: Path, preset: str, quant: str | None, device: str, spec=None, tag: str = "") -> Path:
    """The random checkpoint of ``preset`` under ``workdir``, written unless a complete copy is there."""
    import shutil

    from .random_checkpoint import write_random_checkpoint
    cfg, group = BENCH_PRESETS[preset] if spec is None else (spec, 128)
    dst = Path(workdir) / f"{preset}{tag}-{quant or 'fp16'}-g{group}-{torch.device(device).type}"
    if (dst / "config.json").exists():
        return dst
    if dst.exists():  # an interrupted write (config.json comes last)
        shutil.rmtree(dst)
    print(f"writing {dst} ...", flush=True)
    return write_random_checkpoint(dst, cfg, quant=quant, group_size=group, device=device, progress=False)
