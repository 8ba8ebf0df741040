"""Where a decode step's time goes: per-kernel GPU time under torch.profiler (eager), and the wall time of
the same step replayed from CUDA graphs, on random AWQ checkpoints with the real layer dimensions but few
layers (per-layer costs are what matters; the layer pattern keeps 3 GDN layers per attention layer).

    PYTHONPATH=. python3 bench/profile_decode.py [--preset qwen3.5-27b] [--layers 4] [--batch 1 32]

Per batch size it prints the top kernels (GPU us per step and per layer), the sum of kernel time per
step, the eager wall time per step and the graph-replayed wall time per step: graph wall minus kernel
sum is what launch gaps and the host (scheduler, batch building, sampling) still cost.
"""
from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from catengine import Engine, SamplingParams
from catengine.tools.random_checkpoint import write_random_checkpoint


def checkpoint(preset: str, layers: int, device: str = "cuda") -> Path:
    dst = Path(f"/tmp/profile-{preset}-{layers}l-awq" + ("" if device == "cuda" else f"-{device}"))
    if not (dst / "config.json").exists():
        write_random_checkpoint(dst, preset, quant="awq", device=device, num_layers=layers, progress=False)
    return dst


def decoding_engine(path: Path, batch: int, eager: bool) -> Engine:
    engine = Engine(model=str(path), device="cuda", max_model_len=4096, max_num_seqs=max(batch, 1),
                    enable_prefix_caching=False, enforce_eager=eager, kv_cache_memory_bytes=4 << 30)
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=3000, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", [rng.randrange(100_000) for _ in range(512)], params)
    while engine.stats()["num_waiting"] or any(s.num_computed < len(s.token_ids) - 1 for s in engine.scheduler.running):
        engine.step()
    for _ in range(5):
        engine.step()
    return engine


def wall_per_step(engine: Engine, steps: int = 30) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e6


def kernel_times(prof, per: int = 1, attr: str = "device_time_total") -> dict[str, float]:
    """us per kernel name (per ``per`` repetitions) from a finished torch.profiler run."""
    per_kernel: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        t = getattr(ev, attr)
        if t > 0 and ev.key not in ("", None):
            per_kernel[ev.key] += t / per
    return per_kernel


def kernel_table(engine: Engine, steps: int = 20) -> tuple[dict[str, float], float]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    per_kernel = kernel_times(prof, steps)
    return per_kernel, sum(per_kernel.values())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", action="append", default=None)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--top", type=int, default=22)
    args = p.parse_args()
    for preset in args.preset or ["qwen3.5-27b", "qwen3.6-35b-a3b"]:
        path = checkpoint(preset, args.layers)
        for batch in args.batch:
            eager = decoding_engine(path, batch, eager=True)
            eager_wall = wall_per_step(eager)
            kernels, total = kernel_table(eager)
            eager.close()
            graphed = decoding_engine(path, batch, eager=False)
            graph_wall = wall_per_step(graphed)
            graphed.close()
            torch.cuda.empty_cache()
            print(f"\n### {preset}, {args.layers} layers, decode batch {batch}: kernels {total:.0f} us/step, "
                  f"eager wall {eager_wall:.0f} us/step, CUDA-graph wall {graph_wall:.0f} us/step")
            print("| kernel | us/step | us/layer | share |\n|---|---|---|---|")
            for name, t in sorted(kernels.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"| {name[:90]} | {t:.1f} | {t / args.layers:.1f} | {t / total:.1%} |")


if __name__ == "__main__":
    main()
