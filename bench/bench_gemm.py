"""W4A16 linear and fused-MoE kernels against cuBLAS fp16 on Qwen3.5-27B and Qwen3.6-35B-A3B shapes.

    PYTHONPATH=. python3 bench/bench_gemm.py [--sweep] [--deadline EPOCH_SECONDS]

Dense table: for M in 1..8192, time per call, achieved bandwidth (packed weights + scales + zeros +
activations in and out, over time) as a fraction of the copy bandwidth measured in this process,
TFLOP/s, and cuBLAS fp16 (torch.nn.functional.linear on the dequantised weight) for the same shape.
MoE table (from bench_moe.py, which also sweeps the MoE decode path): one and four decode tokens (bytes of
the chosen experts) and 64 tokens against a torch loop over the chosen experts with fp16 weights.

The dense table times ``w4a16_linear``, the op the model calls (kernels/w4a16/dequant.py), and names the path it
took at each M: the GEMV, the fused GEMM, or dequantise + cuBLAS from ``DEQUANT_MIN_M`` rows.
Every timing replays a CUDA graph of back-to-back calls, as a decode step runs layer after layer:
launch gaps stay out (both sides), calls rotate over enough weight copies (or, for MoE decode,
routings) that the L2 cache (50 MB) cannot serve a weight twice, and a graph holds at least
``common.GRAPH_CALLS`` calls, so that the graph's own start is not charged to one or two calls (and a
programmatic dependent launch overlaps the call before it, as inside a decode step). Each row also
checks the output against the fp32 twin (rel err). ``--sweep`` first times alternative launch
configurations (how the tables were chosen), until the deadline, and the tables after it use the fastest.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F

from common import copy_bandwidth_gbs, device_header, print_table, rotated
from w4a16_common import GROUP, graph_ms, patched, pick_fastest, qbytes

from catengine.kernels.moe import fused as moe
from catengine.kernels.w4a16 import dequant as w4a16_dequant
from catengine.kernels.w4a16 import gemm as w4a16
from catengine.kernels.w4a16 import launch
from catengine.kernels.w4a16.packing import QuantizedWeight, dequantize, pack_int4_along_k

DENSE = [("qkv 5120->14336", 5120, 14336), ("o_proj 6144->5120", 6144, 5120),
         ("gate_up 5120->34816", 5120, 34816), ("down 17408->5120", 17408, 5120)]
MS = [1, 2, 4, 8, 16, 64, 256, 2048, 8192]
ROTATE_BYTES = 160 << 20      # > 3x the H200's L2


def random_qweight(k, n, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randint(0, 16, (k, n), device="cuda", generator=g)
    s = (torch.rand(k // GROUP, n, device="cuda", generator=g) + 0.5) * 1e-3
    z = torch.randint(0, 16, (k // GROUP, n), device="cuda", generator=g)
    return QuantizedWeight(pack_int4_along_k(q), s.to(dtype), z.to(dtype), GROUP)


def dense_path(m: int) -> str:
    """Which kernel w4a16_dequant.w4a16_linear runs for m rows on this GPU."""
    key, _ = w4a16.device_key("cuda")
    if m <= w4a16.TABLES[key].gemv_max_m:
        return "GEMV"
    return "GEMM" if m < w4a16_dequant.DEQUANT_MIN_M[key] else "dequant + cuBLAS"


def copies_for(nbytes):
    return max(1, min(16, -(-ROTATE_BYTES // nbytes)))


def bench_dense(dtype=torch.float16):
    bw = copy_bandwidth_gbs()
    rows = []
    for name, k, n in DENSE:
        # one kind of weight in memory at a time: the packed copies, then the dense fp16 copies, then fp32
        ws = [random_qweight(k, n, dtype, i) for i in range(copies_for(qbytes(k, n)))]
        xs = {m: torch.randn(m, k, device="cuda", dtype=dtype) for m in MS}
        ours = {m: graph_ms(rotated(ws, lambda w, x=xs[m]: w4a16_dequant.w4a16_linear(x, w))) for m in MS}
        wd = [dequantize(ws[0], dtype).t().contiguous() for _ in range(copies_for(2 * k * n))]
        peer = {m: graph_ms(rotated(wd, lambda w, x=xs[m]: F.linear(x, w))) for m in MS}
        del wd
        wf = dequantize(ws[0], torch.float32)
        for m in MS:
            ref = xs[m].float() @ wf
            err = ((w4a16_dequant.w4a16_linear(xs[m], ws[0]).float() - ref).norm() / ref.norm()).item()
            del ref
            t, tc = ours[m], peer[m]
            nbytes = qbytes(k, n) + 2 * m * (k + n)
            flops = 2 * m * n * k
            rows.append([name, m, dense_path(m), t * 1e3, nbytes / t / 1e6 / bw, flops / t / 1e9, tc * 1e3,
                         2 * (m * k + k * n + m * n) / tc / 1e6 / bw, flops / tc / 1e9, tc / t, f"{err:.1e}"])
        del ws, wf, xs
        torch.cuda.empty_cache()
    print_table(f"W4A16 linear vs cuBLAS fp16 ({dtype}, group {GROUP}, asymmetric)",
                ["shape", "M", "path", "ours us", "ours BW/copy", "ours TFLOP/s", "cuBLAS us", "cuBLAS BW/copy",
                 "cuBLAS TFLOP/s", "speedup", "rel err"], rows)


# ---------------------------------------------------------------- sweep (how the sm_90 tables were chosen)
def sweep(deadline: float, dtype=torch.float16):
    """Try launch configurations for each M bucket on o_proj, gate_up (and down at M = 1); keep the
    fastest by summed time. Returns the chosen (w4a16, fused_moe) tables."""
    key, _ = w4a16.device_key("cuda")
    gv, gm, rep = launch.GemvConfig, launch.GemmConfig, dataclasses.replace
    shapes = [DENSE[1], DENSE[2], DENSE[3]]
    ws = {(k, n): [random_qweight(k, n, dtype, i) for i in range(copies_for(qbytes(k, n)))] for _, k, n in shapes}

    def timer(m, use):
        def run():
            parts = []
            for _, k, n in shapes[:use]:
                x = torch.randn(m, k, device="cuda", dtype=dtype)
                parts.append(graph_ms([lambda w=w: w4a16.fused_w4a16_linear(x, w) for w in ws[(k, n)]], reps=5))
            return sum(parts), parts
        return run

    tab = w4a16.TABLES[key]
    gemv = [gv(64, 512, 4, 1, 4), gv(64, 512, 4, 1, 8), gv(32, 512, 4, 1, 8), gv(128, 256, 4, 1, 8),
            gv(64, 256, 4, 1, 16), gv(64, 1024, 8, 1, 4), gv(128, 512, 8, 1, 8), gv(64, 128, 2, 1, 16),
            gv(64, 512, 4, 3, 8), gv(32, 256, 4, 1, 16), gv(128, 512, 4, 1, 4), gv(64, 512, 8, 1, 8)]
    tab = pick_fastest("M=1", w4a16, key, [(str(c), rep(tab, gemv=c)) for c in gemv], timer(1, 3), deadline)
    buckets = [(16, 16, [gm(16, 128, 128, 4, 3, 4), gm(16, 128, 128, 8, 3, 4), gm(16, 64, 128, 4, 2, 8),
                         gm(16, 128, 64, 4, 4, 8), gm(16, 64, 64, 4, 4, 8), gm(16, 256, 128, 8, 4, 2),
                         gm(16, 64, 128, 4, 3, 8), gm(16, 128, 128, 4, 4, 8)]),
               (32, 32, [gm(32, 64, 128, 4, 3, 8), gm(32, 64, 128, 4, 3, 4), gm(32, 128, 128, 4, 3, 4),
                         gm(32, 64, 128, 4, 4, 8), gm(64, 64, 128, 4, 3, 4)]),
               (64, 64, [gm(64, 64, 128, 4, 3, 4), gm(64, 64, 64, 4, 4, 4), gm(64, 128, 64, 8, 4, 2),
                         gm(64, 128, 64, 4, 4, 2)]),
               (256, 256, [gm(128, 128, 64, 8, 3), gm(256, 128, 64, 8, 4), gm(128, 64, 64, 4, 4, 2)]),
               (1 << 30, 8192, [gm(256, 128, 64, 8, 4), gm(256, 128, 64, 8, 3), gm(256, 128, 32, 8, 5),
                                gm(256, 128, 64, 8, 4, group_m=16), gm(128, 128, 64, 8, 4),
                                gm(256, 128, 64, 8, 5)])]
    for max_m, m, cands in buckets:
        others = [(mm, c) for mm, c in tab.gemm if mm != max_m]
        options = [(str(c), rep(tab, gemm=tuple(sorted(others + [(max_m, c)], key=lambda e: e[0]))))
                   for c in cands]
        tab = pick_fastest(f"M={m}", w4a16, key, options, timer(m, 2), deadline)
    from bench_moe import sweep_moe
    return tab, sweep_moe(deadline, dtype)


# Dense GEMV candidates (--gemv-m1): (label, GemvConfig). half2=False is the fp32 weight math that
# bf16 runs, on the same tiles, for comparison.
_GV = launch.GemvConfig
GEMV_CANDIDATES = [
    # registers per thread (ptxas, Triton 3.6, sm_90) since each thread's rows lie in one scale block:
    # 64x512 w4 64, 64x256 w4 with prefetch 72, 128x512 w4 102, 64x1024 w8 64 (before: 128 for 64x512 w4)
    ("64x512 w4 wv16 noprefetch fused reduce", _GV(64, 512, 4, 1, 16, prefetch=False, fused_reduce=True)),
    ("64x512 w4 wv8 noprefetch fused reduce", _GV(64, 512, 4, 1, 8, prefetch=False, fused_reduce=True)),
    ("64x512 w4 wv32 noprefetch fused reduce", _GV(64, 512, 4, 1, 32, prefetch=False, fused_reduce=True)),
    ("64x256 w4 wv16 prefetch fused reduce", _GV(64, 256, 4, 1, 16, prefetch=True, fused_reduce=True)),
    ("64x256 w4 wv32 prefetch fused reduce", _GV(64, 256, 4, 1, 32, prefetch=True, fused_reduce=True)),
    ("64x256 w4 wv8 prefetch fused reduce", _GV(64, 256, 4, 1, 8, prefetch=True, fused_reduce=True)),
    ("64x512 w8 wv16 noprefetch fused reduce", _GV(64, 512, 8, 1, 16, prefetch=False, fused_reduce=True)),
    ("64x1024 w8 wv16 noprefetch fused reduce", _GV(64, 1024, 8, 1, 16, prefetch=False, fused_reduce=True)),
    ("128x512 w4 wv16 noprefetch fused reduce", _GV(128, 512, 4, 1, 16, prefetch=False, fused_reduce=True)),
    ("32x512 w4 wv16 noprefetch fused reduce", _GV(32, 512, 4, 1, 16, prefetch=False, fused_reduce=True)),
    ("64x512 w4 s3 wv8 fused reduce", _GV(64, 512, 4, 3, 8, prefetch=False, fused_reduce=True)),
    # programmatic dependent launch: each call fetches its first tile while the previous one runs out
    ("64x512 w4 wv16 fused reduce PDL", _GV(64, 512, 4, 1, 16, prefetch=False, fused_reduce=True, pdl=True)),
    ("64x512 w4 wv8 fused reduce PDL", _GV(64, 512, 4, 1, 8, prefetch=False, fused_reduce=True, pdl=True)),
    ("64x512 w4 wv32 fused reduce PDL", _GV(64, 512, 4, 1, 32, prefetch=False, fused_reduce=True, pdl=True)),
    ("64x256 w4 wv16 prefetch fused reduce PDL", _GV(64, 256, 4, 1, 16, prefetch=True, fused_reduce=True, pdl=True)),
    ("64x1024 w8 wv16 fused reduce PDL", _GV(64, 1024, 8, 1, 16, prefetch=False, fused_reduce=True, pdl=True)),
    ("fp32 math 64x512 w4 wv16 fused reduce", _GV(64, 512, 4, 1, 16, prefetch=False, half2=False, fused_reduce=True)),
]


def sweep_gemv_dense(dtype=torch.float16, small_m=(2, 4)):
    """Each GEMV_CANDIDATES entry at M = 1 on the four dense shapes (time, BW/copy, cuBLAS ratio, error),
    then M in small_m: the table's GEMM against the GEMV with 1, 2 and 4 rows per program."""
    key, _ = w4a16.device_key("cuda")
    bw = copy_bandwidth_gbs()
    tab = w4a16.TABLES[key]
    rows, totals = [], {}
    for name, k, n in DENSE:
        ws = [random_qweight(k, n, dtype, i) for i in range(copies_for(qbytes(k, n)))]
        wd = [dequantize(ws[0], dtype).t().contiguous() for _ in range(copies_for(2 * k * n))]
        wf = dequantize(ws[0], torch.float32)
        for m in (1,) + tuple(small_m):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            ref = x.float() @ wf
            tc = graph_ms(rotated(wd, lambda w: F.linear(x, w)), reps=5)
            if m == 1:
                cands = GEMV_CANDIDATES
            else:
                best = min(totals, key=totals.get)
                c1 = dict(GEMV_CANDIDATES)[best]
                cands = [("GEMM (table)", None)] + [(f"{best} rows{r}", dataclasses.replace(c1, m_rows=r))
                                                    for r in (1, 2, 4) if r <= m]
            for label, c in cands:
                # the GEMM row: M above gemv_max_m
                t_ = (dataclasses.replace(tab, gemv_max_m=1) if c is None
                      else dataclasses.replace(tab, gemv=c, gemv_max_m=4))
                with patched(w4a16, key, t_):
                    try:
                        err = ((w4a16.fused_w4a16_linear(x, ws[0]).float() - ref).norm() / ref.norm()).item()
                        t = graph_ms(rotated(ws, lambda w: w4a16.fused_w4a16_linear(x, w)), reps=5)
                    except Exception as e:
                        rows.append([name, m, label, f"failed: {type(e).__name__}: {str(e)[:60]}"])
                        torch.cuda.synchronize()
                        continue
                if m == 1:
                    totals[label] = totals.get(label, 0.0) + t
                rows.append([name, m, label, t * 1e3, (qbytes(k, n) + 2 * m * (k + n)) / t / 1e6 / bw, tc * 1e3,
                             tc / t, f"{err:.1e}"])
            print(f"{name} M={m} done", flush=True)
        del ws, wd, wf
        torch.cuda.empty_cache()
    print_table(f"GEMV candidates ({dtype})", ["shape", "M", "config", "ours us", "ours BW/copy", "cuBLAS us",
                "speedup", "rel err"], rows)
    print_table("M=1 sum over the four shapes", ["config", "us"],
                sorted([[lab, t * 1e3] for lab, t in totals.items()], key=lambda r: r[1]))
    return dict(GEMV_CANDIDATES)[min(totals, key=totals.get)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds to stop sweeping")
    ap.add_argument("--bf16", action="store_true", help="also print the dense table in bf16")
    ap.add_argument("--gemv-m1", action="store_true",
                    help="only time GEMV_CANDIDATES at M = 1 (and the GEMV against the GEMM at M = 2, 4), then stop")
    ap.add_argument("--dense-only", action="store_true", help="skip the MoE table (bench_moe.py prints it alone)")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="comma-separated M values of the dense table")
    ap.add_argument("--gemv-pick", action="store_true",
                    help="time GEMV_CANDIDATES, then run the tables with the fastest at M = 1")
    args = ap.parse_args()
    MS[:] = [int(v) for v in args.ms.split(",")]
    print(device_header(), flush=True)
    if args.gemv_m1:
        sweep_gemv_dense()
        return
    key, _ = w4a16.device_key("cuda")
    if args.gemv_pick:
        best = sweep_gemv_dense(small_m=())
        w4a16.TABLES[key] = dataclasses.replace(w4a16.TABLES[key], gemv=best)
        print(f"GEMV used below: {best!r}", flush=True)
    if args.sweep:
        dense_tab, moe_tab = sweep(args.deadline)
        w4a16.TABLES[key], moe.TABLES[key] = dense_tab, moe_tab
        print(f"tables used below:\nw4a16 {key}: {dense_tab!r}\nfused_moe {key}: {moe_tab!r}", flush=True)
    bench_dense(torch.float16)
    if not args.dense_only:
        from bench_moe import bench_moe
        bench_moe(torch.float16)
    if args.bf16:
        bench_dense(torch.bfloat16)


if __name__ == "__main__":
    main()
