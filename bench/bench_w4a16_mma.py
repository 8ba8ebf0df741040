"""W4A16 at decode-sized M (2..64) on sm_80/90: the mma.sync kernel (kernels/w4a16/gemm_mma.py) and, on sm_90, the
wgmma kernel (gemm_wgmma.py) against the path they replaced (the GEMV at M <= 2, the tl.dot GEMM above), cuBLAS
fp16 on the dequantised weight, and the copy bandwidth (the hardware limit of a weight-bound GEMM), on the
Qwen3.5-27B shapes.

    PYTHONPATH=. python3 bench/bench_w4a16_mma.py [--ms 2,4,8,16,32,48,64] [--sweep] [--wgmma-sweep]
        [--deadline EPOCH_SECONDS]

Every timing replays a CUDA graph of back-to-back calls over enough weight copies that L2 cannot serve a weight
twice (bench_gemm.py's protocol). "BW/copy" = (packed weight + scales + zeros + x + y bytes) / time / the copy
bandwidth measured in this run: issue 21's targets are >= 0.7 at M <= 16 and >= 0.6 at 32-64. ``--sweep`` times
tile candidates (token blocks MB, warps W, split waves) per M on o_proj, gate_up and down first and prints them;
``--wgmma-sweep`` does the same for the wgmma tiles (m64 blocks R, tokens BT, resident programs an SM).
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch
import torch.nn.functional as F

from bench_gemm import DENSE, copies_for, random_qweight
from common import copy_bandwidth_gbs, device_header, print_table, rotated
from w4a16_common import GROUP, graph_ms, patched, qbytes

from catengine.kernels.w4a16 import gemm as w4a16
from catengine.kernels.w4a16.gemm_mma import MmaTile, w4a16_gemm_mma
from catengine.kernels.w4a16.gemm_wgmma import WgmmaTile, w4a16_gemm_wgmma
from catengine.kernels.w4a16.packing import dequantize

MS = [2, 3, 4, 8, 12, 16, 24, 32, 48, 64]
# MB 4 is left out: its x and accumulators spill (7 ms per call at M = 48-64 in the first sweep)
CANDIDATES = [MmaTile(mb, w, wv) for mb in (1, 2) for w in (1, 2, 4) for wv in (1, 2, 4, 8)]
# (R, BT, slots): each with the split that fills one wave of its resident programs (gemm_wgmma.tile_split)
WGMMA_CANDIDATES = [WgmmaTile(*t) for t in ((2, 16, 3), (1, 16, 5), (2, 32, 3), (1, 32, 4), (1, 64, 3), (2, 64, 2),
                                            (4, 64, 1))]


def sweep(ms, deadline, candidates=CANDIDATES, fn=w4a16_gemm_mma, name="gemm_mma"):
    """Per M: every candidate tile on o_proj + gate_up + down (summed us); returns {M: best tile}."""
    shapes = DENSE[1:]
    ws = {(k, n): [random_qweight(k, n, torch.float16, i) for i in range(copies_for(qbytes(k, n)))]
          for _, k, n in shapes}
    best, rows = {}, []
    for m in ms:
        xs = {k: torch.randn(m, k, device="cuda", dtype=torch.float16) for _, k, _ in shapes}
        for t in candidates:
            if isinstance(t, MmaTile) and t.MB > 1 and 16 * (t.MB // 2) >= m:      # more token blocks than rows
                continue
            if isinstance(t, WgmmaTile) and (t.BT >= 2 * m or 4 * t.BT <= m):    # tiles far from the rows
                continue
            if time.time() > deadline:
                rows.append([m, str(t), "skipped (deadline)"])
                continue
            try:
                parts = [graph_ms(rotated(ws[(k, n)], lambda w, x=xs[k], t=t: fn(x, w, None, t)), reps=7)
                         for _, k, n in shapes]
            except Exception as e:      # a build ptxas cannot finish (gemm_wgmma.UNBUILDABLE_UNSPLIT)
                rows.append([m, str(t), f"build failed: {type(e).__name__}"])
                continue
            total = sum(parts)
            rows.append([m, str(t), total * 1e3] + [p * 1e3 for p in parts])
            if total < best.get(m, (float("inf"), None))[0]:
                best[m] = (total, t)
    print_table(f"sweep: {name} tiles (us; o_proj + gate_up + down)", ["M", "tile", "sum", "o_proj", "gate_up",
                                                                       "down"], rows)
    return {m: t for m, (_, t) in best.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--wgmma-sweep", action="store_true")
    ap.add_argument("--deadline", type=float, default=float("inf"))
    a = ap.parse_args()
    ms = [int(v) for v in a.ms.split(",")]
    print(device_header())
    bw = copy_bandwidth_gbs()
    key, sms = w4a16.device_key("cuda")
    table = w4a16.TABLES[key]
    picked = sweep(ms, a.deadline) if a.sweep else {}
    picked_wg = (sweep(ms, a.deadline, WGMMA_CANDIDATES, w4a16_gemm_wgmma, "gemm_wgmma")
                 if a.wgmma_sweep and torch.cuda.get_device_capability()[0] == 9 else {})
    old = dataclasses.replace(table, mma=(), wgmma=(), wgmma_split=())
    rows = []
    for name, k, n in DENSE:
        ws = [random_qweight(k, n, torch.float16, i) for i in range(copies_for(qbytes(k, n)))]
        wd = [dequantize(ws[0], torch.float16).t().contiguous() for _ in range(copies_for(2 * k * n))]
        wf = dequantize(ws[0], torch.float32)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            ours = graph_ms(rotated(ws, lambda w: w4a16.fused_w4a16_linear(x, w)))
            tile = picked.get(m)
            swept = graph_ms(rotated(ws, lambda w: w4a16_gemm_mma(x, w, None, tile))) if tile else None
            tile_wg = picked_wg.get(m)
            swept_wg = graph_ms(rotated(ws, lambda w: w4a16_gemm_wgmma(x, w, None, tile_wg))) if tile_wg else None
            with patched(w4a16, key, old):
                before = graph_ms(rotated(ws, lambda w: w4a16.fused_w4a16_linear(x, w)))
            peer = graph_ms(rotated(wd, lambda w: F.linear(x, w)))
            ref = x.float() @ wf
            err = ((w4a16.fused_w4a16_linear(x, ws[0]).float() - ref).norm() / ref.norm()).item()
            nbytes = qbytes(k, n) + 2 * m * (k + n)
            path = ("GEMV" if m <= table.gemv_max_m
                    else "wgmma (split)" if w4a16.split_wgmma_tile(table, m, x, ws[0], sms)
                    else "mma" if w4a16.mma_tile(table, m, x, ws[0])
                    else "wgmma" if w4a16.wgmma_tile(table, m, x, ws[0]) else "tl.dot")
            rows.append([name, m, path, ours * 1e3, nbytes / ours / 1e6 / bw, before * 1e3, before / ours,
                         peer * 1e3, peer / ours, swept * 1e3 if swept else "-", str(tile) if tile else "-",
                         swept_wg * 1e3 if swept_wg else "-", str(tile_wg) if tile_wg else "-",
                         nbytes / bw / 1e3, f"{err:.1e}"])
        del ws, wd, wf
        torch.cuda.empty_cache()
    print_table(f"W4A16 decode-sized M (fp16, group {GROUP}; copy bandwidth {bw:.0f} GB/s)",
                ["shape", "M", "path", "ours us", "BW/copy", "before us", "before/ours", "cuBLAS fp16 us",
                 "cuBLAS/ours", "swept best us", "swept tile", "wgmma swept us", "wgmma tile", "copy-bound us",
                 "rel err"], rows)


if __name__ == "__main__":
    main()
