"""Programmatic dependent launch (sm_90): the W4A16 GEMMs' ``pdl`` tile flag and the triggers of the ops before them.

    PYTHONPATH=. python3 bench/bench_pdl.py [--kernels] [--engine] [--presets qwen3.5-27b,qwen3.6-35b-a3b]
                                            [--batches 1,8,32] [--layers 8] [--budget-s 300]

- ``--kernels``: chains of the four 27B linears through the launch table (CUDA graphs of >= 8 calls of one linear,
  weight copies rotated), the mma / wgmma tiles with ``pdl`` off and on; us and fraction of copy bandwidth.
- ``--engine``: the decode step of random AWQ checkpoints with few layers (profile_decode.py's engine), one engine per
  model and batch, its decode CUDA graphs recaptured for each variant: ``off`` (no PDL GEMM, no triggers), ``gemm``
  (PDL GEMMs), ``all`` (PDL GEMMs, and the norms, silu_mul and the split-K reduce trigger them: the table's state);
  CUDA-graph wall per step, best of two rounds of 40 steps. The GEMV at M <= 2 is a PDL launch in every variant.
The peer is the same kernels without PDL (this is a launch choice, not a kernel); nothing here changes results (the
GPU tests check that bit for bit).
"""
from __future__ import annotations

import argparse
import time

import torch

from common import copy_bandwidth_gbs, device_header, print_table, rotated

from catengine.kernels.common import arch, splitk
from catengine.kernels.norm import norm_rope
from catengine.kernels.w4a16 import launch

VARIANTS = ("off", "gemm", "all")


def use_variant(name: str, base: launch.ArchTable) -> None:
    """Set the sm_90 table's GEMM tiles and the row ops' triggers for one variant (module state of this process:
    a benchmark's switch, the way bench_gemm.py's sweeps patch the table)."""
    pdl = name in ("gemm", "all")
    launch.TABLES["sm90"] = launch.with_gemm_pdl(base, pdl)
    trigger = arch.pdl_supported if name == "all" else (lambda device: False)
    norm_rope.pdl_supported = trigger
    splitk.pdl_supported = trigger


def bench_kernels(base, deadline: float) -> None:
    from bench_gemm import DENSE, copies_for, random_qweight
    from w4a16_common import graph_ms, qbytes
    from catengine.kernels.w4a16 import gemm as w4a16
    bw = copy_bandwidth_gbs()
    ws = {(k, n): [random_qweight(k, n, torch.float16, i) for i in range(copies_for(qbytes(k, n)))]
          for _, k, n in DENSE}
    rows = []
    for m in (4, 8, 16, 24, 32, 64):
        xs = {k: torch.randn(m, k, device="cuda", dtype=torch.float16) for _, k, _ in DENSE}
        for v in ("off", "gemm"):
            if time.time() > deadline:
                rows.append([m, v, "deadline"])
                continue
            use_variant(v, base)
            parts = [graph_ms(rotated(ws[(k, n)], lambda w, x=xs[k]: w4a16.fused_w4a16_linear(x, w)), reps=7)
                     for _, k, n in DENSE]
            rows.append([m, v, sum(parts) * 1e3] + [p * 1e3 for p in parts] +
                        [(qbytes(k, n) + 2 * m * (k + n)) / p / 1e6 / bw for (_, k, n), p in zip(DENSE, parts)])
    print_table(f"PDL, the 27B linears through the table, chains (us; BW = of copy bandwidth {bw:.0f} GB/s)",
                ["M", "variant", "sum"] + [name for name, _, _ in DENSE] + [f"{name} BW" for name, _, _ in DENSE],
                rows)


def bench_engine(base, presets, batches, layers: int, deadline: float) -> None:
    from profile_decode import checkpoint, decoding_engine, wall_per_step
    rows = []
    for preset in presets:
        path = checkpoint(preset, layers)
        for batch in batches:
            if time.time() > deadline:
                rows.append([preset, batch, "deadline"])
                continue
            use_variant("off", base)
            engine = decoding_engine(path, batch, eager=False)
            walls = {v: [] for v in VARIANTS}
            for _ in range(2):
                for v in VARIANTS:
                    use_variant(v, base)
                    engine.runner.graphs.capture_all()
                    walls[v].append(wall_per_step(engine, 40))
            engine.close()
            torch.cuda.empty_cache()
            best = {v: min(t) for v, t in walls.items()}
            rows.append([preset, batch] + [best[v] for v in VARIANTS] + [best["gemm"] / best["off"],
                                                                         best["all"] / best["off"]])
    print_table(f"PDL in the engine, {layers} layers: CUDA-graph wall us per decode step (best of 2 x 40 steps)",
                ["preset", "batch", "off", "PDL GEMMs", "PDL GEMMs + triggers", "gemm / off", "all / off"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--engine", action="store_true")
    ap.add_argument("--presets", default="qwen3.5-27b,qwen3.6-35b-a3b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=300.0)
    args = ap.parse_args()
    print(device_header(), flush=True)
    base = launch.TABLES["sm90"]
    deadline = time.time() + args.budget_s
    try:
        if args.kernels or not args.engine:
            bench_kernels(base, deadline)
        if args.engine or not args.kernels:
            bench_engine(base, args.presets.split(","), [int(b) for b in args.batches.split(",")], args.layers,
                         deadline)
    finally:
        use_variant("all", base)
        launch.TABLES["sm90"] = base


if __name__ == "__main__":
    main()
