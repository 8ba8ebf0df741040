"""The skinny dense linear (kernels/skinny) against cuBLAS (F.linear) and the copy-bandwidth time of its bytes, at the
fp16 projections AWQ checkpoints keep, measured in this process.

    PYTHONPATH=. python3 bench/bench_skinny.py [--sweep] [--deadline SECONDS]

Shapes: the 27B's GDN in_proj_ba (5120 -> 96, and 5120 -> 48 at TP 2), the 35B-A3B's router + shared-expert gate
(2048 -> 257) and in_proj_ba (2048 -> 64), at 1-64 rows. Every time is per call from one CUDA graph of at least 48
calls, each on its own copy of the weight (with its own counters, as each layer has), as many copies as pass 160 MB,
so that the L2 cannot serve a weight twice, and launch gaps stay out (common.graph_ms). "bytes us" is weight + x + y at the copy bandwidth measured here; "of copy"
is that over our time. ``--sweep`` first times splits / bn / bk / warps / stages around the sm_90 table at 32, 1 and
64 rows (until the deadline) and prints the fastest per shape and M.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import time

import torch
import torch.nn.functional as F

from common import copy_bandwidth_gbs, device_header, graph_ms, print_table, rotated

from catengine.kernels.common.splitk import whole_split
from catengine.kernels.skinny import skinny

SHAPES = [("27B in_proj_ba", 5120, 96), ("35B router+gate", 2048, 257), ("35B in_proj_ba", 2048, 64),
          ("27B in_proj_ba TP2", 5120, 48)]
MS = [1, 4, 8, 16, 32, 64]
COPIES = 48
ROTATE_BYTES = 160 << 20    # > 3x the H200's L2: 48 copies of the 35B's 256 KB in_proj_ba would all stay in it
DTYPE = torch.float16


def weights(k: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight [n, k], zeroed counters) pairs, COPIES of them or as many as ROTATE_BYTES takes; the counters have
    room for any split of the sweep."""
    g = torch.Generator(device="cuda").manual_seed(k + n)
    room = -(-n // 16)      # one row tile up to 64 rows; column tiles of 16 at the narrowest
    copies = max(COPIES, -(-ROTATE_BYTES // (2 * n * k)))
    return [((torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(DTYPE),
             torch.zeros(room, dtype=torch.int32, device="cuda")) for _ in range(copies)]


def rel_err(y, x, w) -> float:
    ref = x.double() @ w.double().t()
    return ((y.double() - ref).norm() / ref.norm()).item()


def sweep(deadline: float) -> None:
    base = skinny.TABLES["sm90"]
    # the tile's shape around the table's row, then its warps and stages one at a time (each is a compile)
    tables = [dataclasses.replace(base, bn=bn, bk=bk) for bn, bk in itertools.product((16, 32, 64), (64, 128, 256))]
    tables += [dataclasses.replace(base, warps=w) for w in (2, 8)] + [dataclasses.replace(base, stages=s)
                                                                      for s in (2, 4)]
    sms = skinny.device_key(torch.device("cuda"))[1]
    for name, k, n in SHAPES:
        ws = weights(k, n)
        w0, c0 = ws[0]
        for m in (32, 1, 64):
            x = torch.randn(m, k, device="cuda", dtype=DTYPE)
            rows, best = [], None
            for t in tables:
                n_kb = -(-k // t.bk)
                picked = skinny.skinny_split(m, n, k, t, sms)
                splits = sorted({s for s in (1, 2, 4, 8, picked, skinny.MAX_SPLIT)
                                 if s == whole_split(s, n_kb, skinny.MAX_SPLIT)})
                for split in splits:
                    if time.time() > deadline:
                        print(f"sweep: deadline reached at {name} M={m}", flush=True)
                        return
                    desc = (f"bn {t.bn} bk {t.bk} w {t.warps} st {t.stages} split {split}"
                            f"{' (picked)' * (split == picked)}")
                    try:
                        err = rel_err(skinny.skinny_linear_with(x, w0, None, c0, t, split), x, w0)
                        us = 1e3 * graph_ms(rotated(ws, lambda wc, t=t, s=split:
                                                    skinny.skinny_linear_with(x, wc[0], None, wc[1], t, s)))
                    except Exception as e:      # a tile past the shared memory or registers: skip it
                        rows.append([desc, f"failed: {type(e).__name__}"])
                        torch.cuda.synchronize()
                        continue
                    rows.append([desc, us, err])
                    if err < 1e-3 and (best is None or us < best[0]):
                        best = (us, desc)
            rows.sort(key=lambda r: r[1] if isinstance(r[1], float) else float("inf"))
            print_table(f"sweep {name} M={m} (fastest 12 of {len(rows)})", ["config", "us", "rel err"], rows[:12])
            print(f"sweep best {name} M={m}: {best[1]} {best[0]:.2f} us" if best else "sweep: nothing ran", flush=True)
        del ws
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--deadline", type=float, default=240, help="seconds the sweep may take")
    args = ap.parse_args()
    print(device_header(), flush=True)
    if args.sweep:
        sweep(time.time() + args.deadline)
    bw = copy_bandwidth_gbs() * 1e9
    key, sms = skinny.device_key(torch.device("cuda"))
    table = skinny.TABLES[key]
    rows = []
    for name, k, n in SHAPES:
        ws = weights(k, n)
        for m in MS:
            x = torch.randn(m, k, device="cuda", dtype=DTYPE)
            w0, c0 = ws[0]
            ran = skinny.skinny_applies(x, w0)
            err = rel_err(skinny.skinny_linear(x, w0, None, c0), x, w0)
            ours = 1e3 * graph_ms(rotated(ws, lambda wc: skinny.skinny_linear(x, wc[0], None, wc[1])))
            cublas = 1e3 * graph_ms(rotated(ws, lambda wc: F.linear(x, wc[0])))
            ideal = 2 * (n * k + m * k + m * n) / bw * 1e6
            split = skinny.skinny_split(m, n, k, table, sms) if ran else "-"
            rows.append([f"{name} M={m}", "skinny" if ran else "cuBLAS (outside the table)", split, ours, cublas,
                         cublas / ours, ideal, ideal / ours, err])
        del ws
        torch.cuda.empty_cache()
    print_table(f"skinny linear vs cuBLAS, {DTYPE}, a graph of rotated weight copies (us a call)",
                ["shape", "path", "split", "ours us", "cuBLAS us", "cuBLAS / ours", "bytes us", "of copy",
                 "rel err vs fp64"], rows)


if __name__ == "__main__":
    main()
