"""lm_head at the sampling rows: the W8A16 kernel (--quantize-lm-head int8) against fp16 F.linear (cuBLAS) on
the 16-bit weight, and the copy-bandwidth limit of each one's bytes, measured in this process.

    PYTHONPATH=. python3 bench/bench_lm_head.py [--sweep]

Shapes: Qwen3.5-27B (V 248,320, H 5,120) and Qwen3.6-35B-A3B (H 2,048), batch 1 / 8 / 32. Each call is timed
in one CUDA graph of several calls on rotated weight copies where they fit (so the 50 MB L2 cannot hold a
weight between calls; at these sizes it cannot anyway). Bandwidth fraction = (weight + activation + logits
bytes) / time / copy bandwidth; the int8 ideal is the fp16 time x (int8 bytes / fp16 bytes). ``--sweep``
first times launch candidates at the 27B shape (one line each as it goes) and prints the fastest per M.
"""
from __future__ import annotations

import argparse
import itertools
import time

import torch
import torch.nn.functional as F

from common import copy_bandwidth_gbs, device_header, graph_ms, print_table

from catengine.kernels.w8a16 import gemv
from catengine.kernels.w8a16.naive import quantize_per_channel, w8a16_linear

V = 248_320
SHAPES = {"27B": 5_120, "35B-A3B": 2_048}
BATCHES = (1, 8, 32)


def sweep(deadline_s: float = 38) -> None:
    end = time.time() + deadline_s
    h = SHAPES["27B"]
    w = torch.randn(V, h, device="cuda", dtype=torch.float16) * 0.02
    q, s = quantize_per_channel(w, torch.float16)
    del w
    bw = copy_bandwidth_gbs() * 1e9
    for m, bms in ((1, (16,)), (8, (16,)), (32, (16, 32)), (64, (16, 32, 64))):
        x = torch.randn(m, h, device="cuda", dtype=torch.float16)
        ref = w8a16_linear(x, q, s)
        best = None
        for bm, bn, bk, warps, stages in itertools.product(bms, (64, 128, 256), (128, 256), (4, 8), (3,)):
            if time.time() > end:
                print("sweep: deadline reached", flush=True)
                return
            c = gemv.W8A16Config(bm, bn, bk, warps, stages)
            try:
                err = ((gemv.w8a16_linear_with(x, q, s, c) - ref).norm() / ref.norm()).item()
                t = graph_ms([lambda c=c: gemv.w8a16_linear_with(x, q, s, c)] * 4)
            except Exception as e:      # out of shared memory / registers: skip the candidate
                print(f"sweep M={m} {c}: {type(e).__name__}", flush=True)
                continue
            frac = (V * h + 2 * V + 4 * m * V) / (t * 1e-3) / bw
            print(f"sweep M={m} {c}: {t * 1e3:.0f} us, {frac:.3f} of copy bw, err {err:.1e}", flush=True)
            if err < 1e-4 and (best is None or t < best[0]):
                best = (t, c)
        print(f"sweep best M={m}: {best[1]} {best[0] * 1e3:.0f} us", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    print(device_header(), flush=True)
    if args.sweep:
        sweep()
    bw = copy_bandwidth_gbs() * 1e9
    rows = []
    for name, h in SHAPES.items():
        w = torch.randn(V, h, device="cuda", dtype=torch.float16) * 0.02
        q, s = quantize_per_channel(w, torch.float16)
        for m in BATCHES:
            x = torch.randn(m, h, device="cuda", dtype=torch.float16)
            ref = w8a16_linear(x, q, s)
            err = ((gemv.w8a16_linear(x, q, s) - ref).norm() / ref.norm()).item()
            t8 = graph_ms([lambda: gemv.w8a16_linear(x, q, s)] * 4)
            t16 = graph_ms([lambda: F.linear(x, w).float()] * 4)
            b8 = V * h + 2 * V + 2 * m * h + 4 * m * V
            b16 = 2 * V * h + 2 * m * h + 2 * m * V + 8 * m * V    # + the .float() copy the fp16 path makes
            rows.append([f"{name} M={m}", t8 * 1e3, t16 * 1e3, t16 / t8, b8 / (t8 * 1e-3) / bw,
                         b16 / (t16 * 1e-3) / bw, b8 / bw * 1e6, err])
        del w, q, s
        torch.cuda.empty_cache()
    print_table("lm_head: W8A16 (ours) vs fp16 F.linear (cuBLAS), fp32 logits",
                ["shape", "int8 us", "fp16 us", "fp16 / int8", "int8 of copy bw", "fp16 of copy bw",
                 "int8 bytes at copy bw us", "rel err vs twin"], rows)


if __name__ == "__main__":
    main()
