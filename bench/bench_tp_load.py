"""Tensor-parallel sharded loading on the CPU (gloo ranks): bytes each rank reads from the checkpoint and its
peak host RSS (VmHWM), against TP1 and the 1/N ideal, measured in one run.

    PYTHONPATH=. python bench/bench_tp_load.py [--tp 2 4] [--quant awq|none]

The checkpoint is a random one (catengine.tools.random_checkpoint) with the 35B-A3B's layer shapes, 2 layers
and a 32k vocab, written by a subprocess to a temporary directory; each TP size loads in a fresh process
(rank 0 in the child, its workers spawned), so no row carries another's peak. RSS includes the interpreter
and torch: compare a row with the "no model" row.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def child(path: str, n: int) -> None:
    import dataclasses

    import torch

    from catengine.config import EngineConfig
    from catengine.distributed.worker import peak_rss_bytes
    if n == 0:
        print(json.dumps([{"read_bytes": 0, "peak_rss_bytes": peak_rss_bytes()}]))
        return
    if n == 1:
        from catengine.models import load_model
        model = load_model(path, dtype=torch.float32, progress=False)
        print(json.dumps([{"read_bytes": sum(r[-1] for r in model.load_reads), "peak_rss_bytes": peak_rss_bytes()}]))
        return
    from catengine.distributed.executor import TPExecutor
    cfg = EngineConfig(model=path, device="cpu", tensor_parallel_size=n).resolve(
        device=torch.device("cpu"), max_position_embeddings=4096)
    ex = TPExecutor(Path(path), dataclasses.replace(cfg), torch.device("cpu"))
    try:
        print(json.dumps([{k: r[k] for k in ("read_bytes", "peak_rss_bytes")} for r in ex.reports()]))
    finally:
        ex.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--quant", default="awq", choices=("awq", "none"))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m"
        subprocess.run([sys.executable, "-c", (
            "import torch; from catengine.tools.random_checkpoint import write_random_checkpoint as w; "
            f"w({str(path)!r}, dict(base='qwen3.6-35b-a3b', num_hidden_layers=2, vocab_size=32768, "
            f"max_position_embeddings=4096), quant={None if args.quant == 'none' else 'awq'!r}, "
            "dtype=torch.float16, progress=False)")], check=True)
        from catengine.models.loader import list_tensors
        total = sum(t.nbytes for t in list_tensors(path) if not t.name.startswith("mtp."))
        print(f"checkpoint: {total / 1e6:.1f} MB ({args.quant}); loaded as float32 on the CPU")
        print("| TP | rank | read MB | read / TP1 | ideal 1/N | peak RSS MB |")
        print("|---|---|---|---|---|---|")
        for n in [0, 1] + args.tp:
            out = subprocess.run([sys.executable, __file__, "--child", str(path), str(n)], check=True,
                                 capture_output=True, text=True).stdout
            for rank, r in enumerate(json.loads(out.strip().splitlines()[-1])):
                label = "no model" if n == 0 else n
                print(f"| {label} | {rank} | {r['read_bytes'] / 1e6:.1f} | {r['read_bytes'] / total:.2f} | "
                      f"{1 / max(n, 1):.2f} | {r['peak_rss_bytes'] / 1e6:.0f} |")


if __name__ == "__main__":
    main()
