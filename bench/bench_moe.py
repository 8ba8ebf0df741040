"""Fused MoE W4A16 (Qwen3.6-35B-A3B experts: E 256, top-8, H 2048, I 512) against a torch per-expert fp16 loop.

    PYTHONPATH=. python3 bench/bench_moe.py [--sweep]       (bench_gemm.py prints the same table after its own)

Decode (1 and 4 tokens): bandwidth on the bytes of the chosen experts as a fraction of the copy bandwidth
measured in this process; 64 tokens: speed against the torch loop. Timing and weights as bench_gemm.py
(CUDA graphs of back-to-back calls, routings rotated so the L2 cannot serve an expert twice). ``--sweep``
first times MOE_DECODE_CANDIDATES (and prints a per-kernel profile), then uses the fastest below; ``--row-max``
times the decode kernels against the mma path at 4-16 tokens (where the table's row_max should hand over).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch
import torch.nn.functional as F

from common import copy_bandwidth_gbs, device_header, print_table, rotated
from w4a16_common import GROUP, graph_ms, patched, pick_fastest, qbytes

from catengine.kernels.moe import fused as moe
from catengine.kernels.moe import naive as reference
from catengine.kernels.moe import route
from catengine.kernels.w4a16 import gemm as w4a16
from catengine.kernels.w4a16 import launch
from catengine.kernels.w4a16.gemm_mma import MmaTile
from catengine.kernels.w4a16.packing import QuantizedWeight, dequantize, pack_int4_along_k

E, TOPK, HID, INTER = 256, 8, 2048, 512


def moe_weights(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)

    def stack(k, n):
        q = torch.randint(0, 16, (E, k, n), device="cuda", generator=g)
        s = (torch.rand(E, k // GROUP, n, device="cuda", generator=g) + 0.5) * 1e-3
        z = torch.randint(0, 16, (E, k // GROUP, n), device="cuda", generator=g)
        return QuantizedWeight(pack_int4_along_k(q), s.to(dtype), z.to(dtype), GROUP)
    return stack(HID, 2 * INTER), stack(INTER, HID)


def seeded_routes(t: int, seed: int) -> list:
    """max(1, 16 // t) routings of t tokens from seeds seed, seed + 1, ...: the same for every table compared."""
    gens = [torch.Generator(device="cuda").manual_seed(seed + i) for i in range(max(1, 16 // t))]
    return [route.moe_route(torch.randn(t, E, device="cuda", generator=g), TOPK, True) for g in gens]


def torch_expert_loop(x, w13d, w2d, tw, ids):
    """The peer: per chosen expert, fp16 matmuls on its tokens (dispatch indices computed ahead)."""
    plan = []
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        plan.append((e, tok, tw[tok, slot, None].to(x.dtype)))

    def run():
        out = torch.zeros_like(x)
        for e, tok, w in plan:
            h = F.linear(x[tok], w13d[e])
            h = F.silu(h[:, :INTER]) * h[:, INTER:]
            out.index_add_(0, tok, F.linear(h, w2d[e]) * w)
        return out
    return run


def bench_moe(dtype=torch.float16):
    bw = copy_bandwidth_gbs()
    w13, w2 = moe_weights(dtype)
    w13d = dequantize(w13, dtype).transpose(1, 2).contiguous()    # [E, 2I, H] torch layout
    w2d = dequantize(w2, dtype).transpose(1, 2).contiguous()
    expert_bytes = qbytes(HID, 2 * INTER) + qbytes(INTER, HID)
    rows = []
    for t in (1, 4, 64):
        routes = []
        for i in range(16 // t if t < 16 else 1):
            g = torch.Generator(device="cuda").manual_seed(100 + i)
            logits = torch.randn(t, E, device="cuda", generator=g)
            routes.append(route.moe_route(logits, TOPK, True))
        x = torch.randn(t, HID, device="cuda", dtype=dtype)
        ref = reference.fused_moe(x, w13, w2, *routes[0]).float()
        err = ((moe.fused_moe(x, w13, w2, *routes[0]).float() - ref).norm() / ref.norm()).item()
        tm = graph_ms(rotated(routes, lambda r: moe.fused_moe(x, w13, w2, *r)))
        tp = graph_ms([torch_expert_loop(x, w13d, w2d, *r) for r in routes[:4]], reps=5)
        n_exp = statistics.mean(r[1].unique().numel() for r in routes)
        nbytes = n_exp * expert_bytes + 2 * t * HID * 2
        flops = 2 * t * TOPK * 3 * HID * INTER
        rows.append([f"{t} token(s), {n_exp:.0f} experts", tm * 1e3, nbytes / tm / 1e6 / bw,
                     flops / tm / 1e9, tp * 1e3, tp / tm, f"{err:.1e}"])
    logits = [torch.randn(1, E, device="cuda") for _ in range(16)]
    tr = graph_ms([lambda lg=lg: route.moe_route(lg, TOPK, True) for lg in logits])
    print_table(f"fused MoE W4A16 (E {E}, top-{TOPK}, H {HID}, I {INTER}, {dtype}) vs torch per-expert fp16 loop",
                ["case", "ours us", "BW/copy (chosen experts)", "TFLOP/s", "torch loop us", "speedup", "rel err"],
                rows)
    print(f"moe_route (1 token, 256 experts; 16 calls a graph): {tr * 1e3:.1f} us a call")


# MoE decode candidates (--sweep): (label, fields of the fused_moe table); decode=None is
# the older row kernels; PDL1/2: the down kernel / both kernels as programmatic dependent launches.
_DEC = launch.GemvConfig


def _dec(up, down, pdl=0):
    return dict(decode=(_DEC(*up), _DEC(*down)), decode_pdl=pdl)


MOE_DECODE_CANDIDATES = [
    ("row kernels (decode=None)", dict(decode=None)),
    ("up 64x512 w4 | down 64x512 w4", _dec((64, 512, 4, 1, 16), (64, 512, 4, 1, 16))),
    ("up 64x512 w4 | down 64x512 w4 PDL1", _dec((64, 512, 4, 1, 16), (64, 512, 4, 1, 16), 1)),
    ("up 64x512 w4 | down 64x512 w4 PDL2", _dec((64, 512, 4, 1, 16), (64, 512, 4, 1, 16), 2)),
    ("up 64x256 w4 | down 64x512 w4 PDL1", _dec((64, 256, 4, 1, 16), (64, 512, 4, 1, 16), 1)),
    ("up 32x512 w4 | down 64x512 w4 PDL1", _dec((32, 512, 4, 1, 16), (64, 512, 4, 1, 16), 1)),
    ("up 16x2048 w4 | down 64x512 w4 PDL1", _dec((16, 2048, 4, 1, 16), (64, 512, 4, 1, 16), 1)),
    ("up 32x256 w2 | down 32x256 w2 PDL1", _dec((32, 256, 2, 1, 16), (32, 256, 2, 1, 16), 1)),
    ("up 64x512 w4 | down 64x256 w4 PDL1", _dec((64, 512, 4, 1, 16), (64, 256, 4, 1, 16), 1)),
    ("up 64x512 w4 | down 64x512 w4 wv2 PDL1", _dec((64, 512, 4, 1, 16), (64, 512, 4, 1, 2), 1)),
]


def sweep_moe_decode(dtype=torch.float16, tokens=(1, 4)):
    """Each MOE_DECODE_CANDIDATES entry at 1 and 4 tokens (16 and 4 routings rotated, fresh per
    token count); returns the table fields of the fastest at 1 token."""
    key, _ = w4a16.device_key("cuda")
    bw = copy_bandwidth_gbs()
    w13, w2 = moe_weights(dtype)
    expert_bytes = qbytes(HID, 2 * INTER) + qbytes(INTER, HID)
    cases = []
    for t in tokens:
        routes = [route.moe_route(torch.randn(t, E, device="cuda"), TOPK, True) for _ in range(16 // t)]
        x = torch.randn(t, HID, device="cuda", dtype=dtype)
        ref = reference.fused_moe(x, w13, w2, *routes[0]).float()
        n_exp = statistics.mean(r[1].unique().numel() for r in routes)
        cases.append((t, routes, x, ref, n_exp * expert_bytes + 4 * t * HID))
    rows, totals = [], {}
    for label, fields in MOE_DECODE_CANDIDATES:
        with patched(moe, key, dataclasses.replace(moe.TABLES[key], **fields)):
            for t, routes, x, ref, nbytes in cases:
                try:
                    err = ((moe.fused_moe(x, w13, w2, *routes[0]).float() - ref).norm() / ref.norm()).item()
                    ms = graph_ms([lambda r=r: moe.fused_moe(x, w13, w2, *r) for r in routes], reps=10)
                except Exception as e:
                    rows.append([label, t, f"failed: {type(e).__name__}: {str(e)[:80]}"])
                    torch.cuda.synchronize()
                    continue
                if t == tokens[0]:
                    totals[label] = ms
                rows.append([label, t, ms * 1e3, nbytes / ms / 1e6 / bw, f"{err:.1e}"])
    print_table(f"MoE decode candidates ({dtype}; BW on the chosen experts' bytes)",
                ["config", "tokens", "us", "BW/copy", "rel err"], rows)
    return dict(MOE_DECODE_CANDIDATES)[min(totals, key=totals.get)]


def profile_moe_decode(fields_list, dtype=torch.float16, calls=32):
    """Per-kernel GPU time (torch.profiler, eager calls, 1 token) under each table fields entry: which
    pass of the decode path costs what."""
    key, _ = w4a16.device_key("cuda")
    w13, w2 = moe_weights(dtype)
    routes = [route.moe_route(torch.randn(1, E, device="cuda"), TOPK, True) for _ in range(calls)]
    x = torch.randn(1, HID, device="cuda", dtype=dtype)
    for label, fields in fields_list:
        with patched(moe, key, dataclasses.replace(moe.TABLES[key], **fields)):
            for r in routes[:2]:
                moe.fused_moe(x, w13, w2, *r)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for r in routes:
                    moe.fused_moe(x, w13, w2, *r)
                torch.cuda.synchronize()
        rows = [[ev.key[:60], ev.count // calls, ev.device_time_total / calls]
                for ev in prof.key_averages() if ev.device_time_total > 0]
        print_table(f"MoE decode kernels, 1 token, eager ({label}; us per call)", ["kernel", "launches", "us"], rows)


def sweep_moe(deadline, dtype):
    key, _ = w4a16.device_key("cuda")
    tab = dataclasses.replace(moe.TABLES[key], **sweep_moe_decode(dtype))
    w13, w2 = moe_weights(dtype)

    def timer(t, n_routes):
        routes = [route.moe_route(torch.randn(t, E, device="cuda"), TOPK, True) for _ in range(n_routes)]
        x = torch.randn(t, HID, device="cuda", dtype=dtype)

        def run():
            ms = graph_ms([lambda r=r: moe.fused_moe(x, w13, w2, *r) for r in routes], reps=5)
            return ms, [ms]
        return run

    gm = launch.GemmConfig
    grids = [gm(16, 64, 64, 4, 4), gm(16, 64, 128, 4, 3), gm(16, 128, 64, 8, 4)]
    return pick_fastest("MoE 64 tokens, BM=16 GEMM", moe, key,
                 [(str(c), dataclasses.replace(tab, gemm=((16, c),) + tab.gemm[1:])) for c in grids], timer(64, 2),
                 deadline)



def bench_align(dtype=torch.float16):
    """Routing alignment (the prefill path's sort / pad): the torch glue (moe.naive.align_tokens, ~15
    launches) against the one-program Triton kernel, alone and inside fused_moe, 2-256 tokens of top-8."""
    w13, w2 = moe_weights(dtype)
    rows = []
    for t in (2, 8, 32, 64, 256):
        routes = [route.moe_route(torch.randn(t, E, device="cuda"), TOPK, True) for _ in range(4)]
        same = all(torch.equal(a, b) for r in routes for a, b in zip(route.align_tokens(r[1], E, 16),
                                                                    reference.align_tokens(r[1], E, 16)))
        t_glue = graph_ms(rotated(routes, lambda r: reference.align_tokens(r[1], E, 16)))
        t_kern = graph_ms(rotated(routes, lambda r: route.align_tokens(r[1], E, 16)))
        x = torch.randn(t, HID, device="cuda", dtype=dtype)
        t_new = graph_ms(rotated(routes, lambda r: moe.fused_moe(x, w13, w2, *r)))
        moe.align_tokens = reference.align_tokens
        try:
            t_old = graph_ms(rotated(routes, lambda r: moe.fused_moe(x, w13, w2, *r)))
        finally:
            moe.align_tokens = route.align_tokens
        rows.append([t, t_glue * 1e3, t_kern * 1e3, t_glue / t_kern, t_old * 1e3, t_new * 1e3, same])
    print_table("MoE alignment: torch glue (before) vs Triton kernel (after), us per call in a CUDA graph",
                ["tokens", "glue us", "kernel us", "glue / kernel", "fused_moe before us", "fused_moe after us",
                 "identical"], rows)


def bench_mma(dtype=torch.float16, tokens=(2, 4, 5, 8, 16, 32, 64, 128, 256)):
    """Issue 21's MoE table: fused_moe for 2-256 tokens as the table routes it (decode kernels up to row_max rows,
    fused_mma.py's mma.sync path up to its bound), against the tl.dot sorted path it replaced at the same tokens
    (the table's mma entry removed) and the torch per-expert loop; BW/copy on the bytes of the experts touched
    (each read once) plus x, at the copy bandwidth of this run. Target >= 0.6."""
    from catengine.kernels.moe import fused_mma  # noqa: F401  (the path under test)
    key, _ = w4a16.device_key("cuda")
    table = moe.TABLES[key]
    old = dataclasses.replace(table, mma=())
    bw = copy_bandwidth_gbs()
    w13, w2 = moe_weights(dtype)
    w13d = dequantize(w13, dtype).transpose(1, 2).contiguous()
    w2d = dequantize(w2, dtype).transpose(1, 2).contiguous()
    expert_bytes = qbytes(HID, 2 * INTER) + qbytes(INTER, HID)
    rows = []
    for t in tokens:
        routes = seeded_routes(t, 200)
        x = torch.randn(t, HID, device="cuda", dtype=dtype)
        ref = reference.fused_moe(x, w13, w2, *routes[0]).float()
        err = ((moe.fused_moe(x, w13, w2, *routes[0]).float() - ref).norm() / ref.norm()).item()
        ours = graph_ms(rotated(routes, lambda r: moe.fused_moe(x, w13, w2, *r)))
        with patched(moe, key, old):
            before = graph_ms(rotated(routes, lambda r: moe.fused_moe(x, w13, w2, *r)))
        tp = graph_ms([torch_expert_loop(x, w13d, w2d, *r) for r in routes[:2]], reps=3)
        n_exp = statistics.mean(r[1].unique().numel() for r in routes)
        nbytes = n_exp * expert_bytes + 2 * t * HID * 2
        rows_tk = t * TOPK
        path = ("decode" if rows_tk <= table.row_max else
                "mma" if table.mma and rows_tk <= table.mma[-1][0] else "tl.dot")
        rows.append([t, f"{n_exp:.0f}", path, ours * 1e3, nbytes / ours / 1e6 / bw, before * 1e3, before / ours,
                     tp * 1e3, tp / ours, nbytes / bw / 1e3, f"{err:.1e}"])
    sweep, sweep_tokens = [], (5, 8, 16, 32, 64, 128)
    for tile in (MmaTile(1, 1), MmaTile(1, 2), MmaTile(1, 4), MmaTile(2, 1), MmaTile(2, 2), MmaTile(2, 4)):
        with patched(moe, key, dataclasses.replace(table, mma=((table.mma[-1][0], tile),))):
            times = []
            for t in sweep_tokens:
                # the same routings for every tile (seeded), so the tiles' rows compare like for like
                routes = seeded_routes(t, 300)
                x = torch.randn(t, HID, device="cuda", dtype=dtype)
                times.append(graph_ms(rotated(routes, lambda r: moe.fused_moe(x, w13, w2, *r)), reps=7) * 1e3)
        sweep.append([f"MB {tile.MB} W {tile.W}" + (" (table)" if tile == table.mma[-1][1] else "")] + times)
    print_table("sweep: fused_moe on mma tiles (us)", ["tile"] + [f"{t} tokens" for t in sweep_tokens], sweep)
    print_table(f"fused MoE W4A16 at 2-256 tokens (E {E}, top-{TOPK}, H {HID}, I {INTER}; copy {bw:.0f} GB/s)",
                ["tokens", "experts", "path", "ours us", "BW/copy (touched)", "before us", "before/ours",
                 "torch loop us", "torch/ours", "copy-bound us", "rel err"], rows)


def bench_row_max(dtype=torch.float16, tokens=(4, 5, 6, 8, 12, 16), row_maxes=(32, 64, 128), rounds=3):
    """Where the decode GEMV path should hand over to the mma path: fused_moe at 4-16 tokens under each
    ``row_max`` (T * top_k at or below which the decode kernels run), the tables alternated in ``rounds`` rounds
    (medians), the same seeded routings for every table. BW/copy on the bytes of the experts touched."""
    key, _ = w4a16.device_key("cuda")
    table = moe.TABLES[key]
    bw = copy_bandwidth_gbs()
    w13, w2 = moe_weights(dtype)
    expert_bytes = qbytes(HID, 2 * INTER) + qbytes(INTER, HID)
    # the largest row_max first: the weights' split counters are sized at their first use
    tables = [(r, dataclasses.replace(table, row_max=r)) for r in sorted(row_maxes, reverse=True)]
    rows = []
    for t in tokens:
        routes = seeded_routes(t, 400)
        x = torch.randn(t, HID, device="cuda", dtype=dtype)
        ref = reference.fused_moe(x, w13, w2, *routes[0]).float()
        n_exp = statistics.mean(r[1].unique().numel() for r in routes)
        nbytes = n_exp * expert_bytes + 2 * t * HID * 2
        times = {r: [] for r, _ in tables}
        errs = {}
        for _ in range(rounds):
            for r, tab in tables:
                with patched(moe, key, tab):
                    if r not in errs:
                        out = moe.fused_moe(x, w13, w2, *routes[0]).float()
                        errs[r] = ((out - ref).norm() / ref.norm()).item()
                    times[r].append(graph_ms(rotated(routes, lambda rt: moe.fused_moe(x, w13, w2, *rt)), reps=7))
        for r, _ in tables:
            ms = statistics.median(times[r])
            path = "decode" if t * TOPK <= r else "mma" if table.mma and t * TOPK <= table.mma[-1][0] else "tl.dot"
            rows.append([t, f"{n_exp:.0f}", r, path + (" (table)" if r == table.row_max else ""), ms * 1e3,
                         nbytes / ms / 1e6 / bw, f"{errs[r]:.1e}"])
    print_table(f"fused MoE: decode GEMV vs mma by row_max (E {E}, top-{TOPK}; copy {bw:.0f} GB/s; medians of "
                f"{rounds} alternated rounds)", ["tokens", "experts", "row_max", "path", "us", "BW/copy (touched)",
                                                  "rel err"], rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mma", action="store_true", help="only the 2-256 token table (issue 21)")
    ap.add_argument("--align", action="store_true", help="only the routing-alignment table")
    ap.add_argument("--row-max", action="store_true", help="only the decode-vs-mma handover at 4-16 tokens")
    ap.add_argument("--sweep", action="store_true",
                    help="time MOE_DECODE_CANDIDATES, then print the table with the fastest decode entry")
    args = ap.parse_args()
    print(device_header(), flush=True)
    if args.align:
        bench_align()
        return
    if args.mma:
        bench_mma()
        return
    if args.row_max:
        bench_row_max()
        return
    if args.sweep:
        key, _ = w4a16.device_key("cuda")
        best = sweep_moe_decode()
        moe.TABLES[key] = dataclasses.replace(moe.TABLES[key], **best)
        print(f"MoE decode fields used below: {best!r}", flush=True)
        try:
            profile_moe_decode([("row kernels", dict(decode=None)), ("chosen", best)])
        except Exception as e:      # the profiler is a diagnosis, not the benchmark
            print(f"profile failed: {type(e).__name__}: {e}")
    bench_moe(torch.float16)


if __name__ == "__main__":
    main()
