"""Gated DeltaNet kernels on the Qwen3.5-27B shape (Hk 16, Hv 48, dk = dv = 128, conv_dim 10240), bf16.

- Prefill (chunked rule): ours against flash-linear-attention's ``chunk_gated_delta_rule`` on the same
  inputs (GVA, varlen cu_seqlens, initial and final states, q/k l2norm in kernel) and against the
  FLOP count of the chunked algorithm, as a fraction of the measured bf16 matmul rate; the table's
  prefill form and the other one (GDNTable.prefill: "split" or "scan") side by side.
  ``--only sweep-prefill [--sweep S]`` times the prefill candidates alone (both forms, each checked
  against the table's output) for S seconds (default 120).
- Decode (recurrent rule, one token per sequence): state bytes read + written over time, as a
  fraction of the measured device-to-device copy bandwidth. Timed as CUDA-graph replays (as the
  engine runs decode) over rotating state slots, so neither launch overhead nor L2 hits count.
- Conv1d: bytes moved (input, output, states, weights once) over time, against copy bandwidth.
``--sweep`` also times other launch tables end to end (to choose the per-architecture table; never
at serve time), and ``--profile CASE`` prints per-kernel times of ours and fla on one prefill case.

Usage: python bench/bench_gdn.py [--only prefill|decode|conv|sweep|sweep-prefill|sweep-decode] [--sweep S] [--no-fla]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench.common import (bench_ms, copy_bandwidth_gbs, device_header, graph_ms, matmul_tflops,  # noqa: E402
                          print_table)
from catengine.kernels.gdn import chunk as gdr  # noqa: E402
from catengine.kernels.gdn import conv1d as cv  # noqa: E402
from catengine.kernels.gdn import recurrent as rec  # noqa: E402
from catengine.kernels.gdn import table as gdn_table  # noqa: E402

HK, HV, DK, DV, KC = 16, 48, 128, 128, 4
C = 2 * HK * DK + HV * DV
BF16 = torch.bfloat16
PREFILL = {"1 x 8K": [8192], "1 x 64K": [65536],
           "8 x 4K ragged": [4096 + d for d in (-1500, 700, -300, 1200, 0, -900, 333, 467)]}


def qsl_of(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


def gdn_inputs(lens, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t, b = sum(lens), len(lens)

    def rnd(*shape, dtype=BF16):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)
    q, k, v = rnd(t, HK, DK), rnd(t, HK, DK), rnd(t, HV, DV)
    a_log = torch.rand(HV, device="cuda", generator=gen) * 3 - 1.5
    g, beta = rec.gdn_gating(a_log, rnd(t, HV), torch.rand(HV, device="cuda", generator=gen), rnd(t, HV))
    ssm = rnd(b, HV, DK, DV, dtype=torch.float32) * 0.1
    slots = torch.randperm(b, device="cuda", generator=gen).to(torch.int32)
    has = torch.ones(b, dtype=torch.bool, device="cuda")
    return q, k, v, g, beta, ssm, qsl_of(lens), slots, has


def chunk_flops(lens):
    """Matmul FLOPs of the chunked form per (chunk, value head): K K^T, w and u, w S and k^T v_new, q S,
    q k^T and A v_new (the 64x64 triangular inverse, ~0.1 MFLOP, is left out)."""
    bt = gdr.BT
    per_chunk = 2 * bt * bt * DK * 3 + 2 * bt * bt * DV * 2 + 2 * bt * DK * DV * 3
    return per_chunk * HV * sum(-(-n // bt) for n in lens)


def other_form(table) -> str:
    """The prefill form (GDNTable.prefill) the table does not use, timed beside it."""
    return "scan" if table.prefill == "split" else "split"


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def load_fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        return fla_chunk, ""
    except Exception as e:  # reported in the table, then FLOPs only
        return None, f"{type(e).__name__}: {e}"[:200]


def bench_prefill(use_fla: bool):
    fla_chunk, why = load_fla() if use_fla else (None, "skipped (--no-fla)")
    if fla_chunk is None:
        print(f"flash-linear-attention unavailable: {why}", flush=True)
    peak = matmul_tflops(BF16)
    rows = []
    for name, lens in PREFILL.items():
        q, k, v, g, beta, ssm, qsl, slots, has = gdn_inputs(lens)
        scale = DK ** -0.5
        h0 = ssm[slots.long()].clone()
        o = gdr.chunk_gated_delta_rule(q, k, v, g, beta, ssm, qsl, slots, has, scale)
        ours = bench_ms(lambda: gdr.chunk_gated_delta_rule(q, k, v, g, beta, ssm, qsl, slots, has, scale))
        # the kernels timed alone (the table may overlap them on streams for this case), and the
        # other prefill form (split / scan) whole
        table = gdn_table.device_table(q.device)
        alone = dataclasses.replace(table, overlap_max_programs=0, scan_overlap_max_programs=0)
        _, steps = gdr.chunk_steps(q, k, v, g, beta, ssm, qsl, slots, has, scale, table=alone)
        parts = " / ".join(f"{n} {bench_ms(f):.3f}" for n, f in steps if n != "offsets")
        other = dataclasses.replace(table, prefill=other_form(table))
        other_ms = bench_ms(lambda: [f() for _, f in gdr.chunk_steps(q, k, v, g, beta, ssm, qsl, slots, has, scale,
                                                                       table=other)[1]])
        fla_ms, diff = float("nan"), float("nan")
        if fla_chunk is not None:
            cu, cu_cpu = qsl.long(), qsl.long().cpu()

            def run_fla():
                return fla_chunk(q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=h0,
                                 output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                 cu_seqlens_cpu=cu_cpu)
            o_fla, _ = run_fla()
            diff = rel(o, o_fla[0])
            fla_ms = bench_ms(run_fla)
        tflops = chunk_flops(lens) / (ours * 1e-3) / 1e12
        rows.append([name, sum(lens), ours, fla_ms, fla_ms / ours, tflops, 100 * tflops / peak,
                     other_ms, fla_ms / other_ms, parts, diff])
        print(f"  {name}: ours ({table.prefill}) {ours:.3f} ms, {other.prefill} {other_ms:.3f} ms, "
              f"fla {fla_ms:.3f} ms", flush=True)
        torch.cuda.empty_cache()
    print_table(f"Prefill: chunked gated delta rule (bf16, fp32 states in slots; table: {table.prefill})",
                ["case", "tokens", "ours ms", "fla ms", "fla/ours", "TFLOP/s", "% matmul peak",
                 f"{other.prefill} ms", f"fla/{other.prefill}", "kernels alone ms", "rel diff vs fla"], rows)



def rotations(nbytes: int) -> int:
    """Enough disjoint slot sets that one graph replay streams >= 256 MiB (the H200's L2 is 50 MiB)."""
    return max(2, -(-(256 << 20) // max(nbytes, 1)))


def decode_ms(b, table=None, state_dtype=torch.float32):
    state_bytes = 2 * b * HV * DK * DV * torch.finfo(state_dtype).bits // 8
    rot = rotations(state_bytes)
    q, k, v, g, beta, _, qsl, _, has = gdn_inputs([1] * b, seed=b)
    ssm = (torch.randn(rot * b, HV, DK, DV, device="cuda") * 0.1).to(state_dtype)
    sets = [torch.randperm(b, device="cuda").to(torch.int32) + r * b for r in range(rot)]
    return graph_ms([lambda s=s: rec.recurrent_gated_delta_rule_with(q, k, v, g, beta, ssm, qsl, s, has, 0.088, True,
                                                                     None, table)
                     for s in sets]), state_bytes


def bench_decode():
    """fp32 and fp16 states (fp16: the engine's default for fp16 models, ``--mamba-ssm-cache-dtype auto``)."""
    copy = copy_bandwidth_gbs()
    rows = []
    for dt in (torch.float32, torch.float16):
        for b in (1, 8, 32, 64, 256):
            ms, state_bytes = decode_ms(b, state_dtype=dt)
            io_bytes = b * (2 * HK * DK + 2 * HV * DV) * 2 + b * HV * 8
            gbs = (state_bytes + io_bytes) / (ms * 1e-3) / 1e9
            rows.append([str(dt).split(".")[1], b, ms * 1e3, state_bytes / 2**20, gbs, 100 * gbs / copy])
    print_table(f"Decode: recurrent gated delta rule, CUDA graph (copy bandwidth {copy:.0f} GB/s)",
                ["state", "batch", "us", "state MiB r+w", "GB/s", "% of copy"], rows)


def sweep_decode(budget_s: float):
    """The recurrent kernel's (BV, warps) around the table's, fp16 state (the engine's default), batch 8-64."""
    t_end = time.time() + budget_s
    base = gdn_table.device_table(torch.device("cuda"))
    copy = copy_bandwidth_gbs()
    rows = []
    for b in (8, 32, 64):
        for bv, nw in ((base.rec_bv, base.rec_warps), (64, 2), (32, 2), (32, 4), (64, 8), (128, 4), (128, 8), (16, 1),
                       (32, 1)):
            if time.time() > t_end:
                break
            tab = dataclasses.replace(base, rec_bv=bv, rec_warps=nw)
            ms, state_bytes = decode_ms(b, tab, torch.float16)
            rows.append([b, f"BV={bv} warps={nw}", ms * 1e3, 100 * state_bytes / (ms * 1e-3) / 1e9 / copy])
            print(rows[-1], flush=True)
    print_table(f"Decode sweep, fp16 state (us; state bytes r+w over copy bandwidth {copy:.0f} GB/s)",
                ["batch", "variant", "us", "% of copy"], rows)


def conv_inputs(lens, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(sum(lens), C, device="cuda", generator=gen).to(BF16)
    w = torch.randn(C, KC, device="cuda", generator=gen).to(BF16)
    st = torch.randn(len(lens), KC - 1, C, device="cuda", generator=gen).to(BF16)
    slots = torch.randperm(len(lens), device="cuda", generator=gen).to(torch.int32)
    return x, w, st, qsl_of(lens), slots, torch.ones(len(lens), dtype=torch.bool, device="cuda")


def conv_decode_ms(b, table=None):
    nbytes = 2 * b * C * 2 + C * KC * 2 + 2 * b * (KC - 1) * C * 2
    rot = rotations(nbytes)
    x, w, _, _, _, _ = conv_inputs([1] * b, seed=b)
    st = torch.randn(rot * b, KC - 1, C, device="cuda").to(BF16)
    sets = [torch.randperm(b, device="cuda").to(torch.int32) + r * b for r in range(rot)]
    return graph_ms([lambda s=s: cv.causal_conv1d_update_with(x, w, st, s, "silu", table) for s in sets]), nbytes


def bench_conv():
    copy = copy_bandwidth_gbs()
    rows = []
    for name, lens in (("prefill 1 x 8K", [8192]), ("prefill 8 x 4K ragged", PREFILL["8 x 4K ragged"]),
                       ("prefill 1 x 64K", [65536])):
        x, w, st, qsl, slots, has = conv_inputs(lens)
        ms = bench_ms(lambda: cv.causal_conv1d(x, w, st, qsl, slots, has))
        nbytes = 2 * x.numel() * 2 + w.numel() * 2 + 2 * st.numel() * 2
        gbs = nbytes / (ms * 1e-3) / 1e9
        rows.append([name, ms * 1e3, nbytes / 2**20, gbs, 100 * gbs / copy])
    for b in (8, 64, 256):
        ms, nbytes = conv_decode_ms(b)
        gbs = nbytes / (ms * 1e-3) / 1e9
        rows.append([f"decode batch {b}", ms * 1e3, nbytes / 2**20, gbs, 100 * gbs / copy])
    print_table(f"Causal conv1d (C = {C}, Kc = {KC}, bf16; decode as CUDA graph; copy {copy:.0f} GB/s)",
                ["case", "us", "MiB moved", "GB/s", "% of copy"], rows)


# prefill candidates for the sweep: GDNTable fields over this device's row, as (label, fields); the
# first is the row itself, the second the other form, so that one run compares split and scan
PREFILL_CANDIDATES = [
    ("table", {}),
    ("other form", "other"),
    ("split, no windows", dict(prefill="split", overlap_max_programs=0)),
    ("split, windows from 32 chunks", dict(prefill="split", overlap_min_chunks=32)),
    ("split, h BV 32", dict(prefill="split", h_bv=32)),
    ("split, h stages 2", dict(prefill="split", h_stages=2)),
    ("split, o warps 8", dict(prefill="split", o_warps=8)),
    ("split, h stages 2, o warps 8", dict(prefill="split", h_stages=2, o_warps=8)),
    ("split, o BV 64", dict(prefill="split", o_bv=64)),
    ("split, h stages 4", dict(prefill="split", h_stages=4)),
    ("split, wy warps 8", dict(prefill="split", wy_warps=8)),
    ("scan, no windows", dict(prefill="scan", scan_overlap_max_programs=0)),
    ("scan, windows to 4096 programs", dict(prefill="scan", scan_overlap_max_programs=4096)),
    ("scan, warps 4", dict(prefill="scan", scan_warps=4)),
    ("scan, stages 3", dict(prefill="scan", scan_stages=3)),
    ("scan, BV 32 warps 4", dict(prefill="scan", scan_bv=32, scan_warps=4)),
]


def sweep_prefill(t_end: float, timed=None):
    """Every prefill candidate on each case (whole op), its output and final states checked against
    the table's on the same inputs (a candidate is only a choice within the tests' bf16 bound, 2e-2).
    ``timed(label, variant, fn)`` as in sweep(); without it (--only sweep-prefill) the rows go to a
    table of their own."""
    rows = []
    if timed is None:
        def timed(label, variant, fn):
            rows.append([label, variant, bench_ms(fn, warmup_ms=10, rep_ms=50)])
            print(f"  {label} {variant}: {rows[-1][2]:.4f} ms", flush=True)
    base = gdn_table.device_table(torch.device("cuda"))
    other = other_form(base)
    for name in ("1 x 64K", "8 x 4K ragged", "1 x 8K"):
        args = gdn_inputs(PREFILL[name])
        ssm0 = args[5].clone()

        def run(tab):
            args[5].copy_(ssm0)
            o, steps = gdr.chunk_steps(*args, DK ** -0.5, table=tab)
            for _, launch in steps:
                launch()
            return o
        want_o, want_s = run(base).clone(), args[5].clone()
        for label, fields in PREFILL_CANDIDATES:
            if time.time() > t_end:
                break
            tab = dataclasses.replace(base, **(dict(prefill=other) if fields == "other" else fields))
            label = f"{label} ({tab.prefill})" if fields in ({}, "other") else label
            try:
                err = max(rel(run(tab), want_o), rel(args[5], want_s))
            except Exception as e:  # a candidate that cannot build or launch is reported, not fatal
                print(f"  prefill {name} {label}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            timed(f"prefill {name}", f"{label} [diff {err:.1e}{'' if err < 2e-2 else ' WRONG'}]",
                  lambda tab=tab: [launch() for _, launch in gdr.chunk_steps(*args, DK ** -0.5, table=tab)[1]])
        del args
        torch.cuda.empty_cache()
    if rows:
        print_table("Prefill sweep (whole op; diff: output and states against the table's)",
                    ["case", "variant", "ms"], rows)


def sweep(budget_s: float):
    """Other launch tables, end to end, around this device's table (coordinate sweep)."""
    t_end = time.time() + budget_s
    base = gdn_table.device_table(torch.device("cuda"))
    cbase = cv.device_table(torch.device("cuda"))
    rows = []

    def timed(label, variant, fn, graph=False):
        if time.time() > t_end:
            return
        ms = fn() if graph else bench_ms(fn, warmup_ms=10, rep_ms=50)
        rows.append([label, variant, ms])
        print(f"  {label} {variant}: {ms:.4f} ms", flush=True)

    # ptxas (Triton 3.6, sm_90) registers per thread: 64/4 214, 32/4 122, 64/8 124, 32/8 64; 16-wide blocks
    # (80 registers) were 1.4x slower at batch 64 and 256 on the H200
    for b in (8, 64, 256):
        for bv, nw in ((64, 4), (32, 4), (64, 8), (32, 8), (128, 8), (32, 2), (64, 2)):
            tab = dataclasses.replace(base, rec_bv=bv, rec_warps=nw)
            timed(f"decode batch {b}", f"BV={bv} warps={nw}", lambda: decode_ms(b, tab)[0], graph=True)
    x, w, st, qsl, slots, has = conv_inputs(PREFILL["8 x 4K ragged"])
    for bt, bc, nw in ((16, 512, 4), (8, 512, 4), (32, 512, 4), (16, 256, 4), (16, 256, 2), (16, 512, 2), (8, 256, 2),
                       (16, 1024, 4), (16, 1024, 8)):
        tab = dataclasses.replace(cbase, fwd=cv.ConvLaunch(bt, bc, nw, cbase.fwd.num_stages))
        cv.causal_conv1d_with(x, w, st, qsl, slots, has, "silu", tab)
        timed("conv 8 x 4K", f"BT={bt} BC={bc} warps={nw}",
              lambda: cv.causal_conv1d_with(x, w, st, qsl, slots, has, "silu", tab))
    for bc, nw in ((512, 4), (1024, 8), (256, 2), (256, 4)):
        tab = dataclasses.replace(cbase, update=cv.ConvLaunch(1, bc, nw, 1))
        timed("conv decode 256", f"BC={bc} warps={nw}", lambda: conv_decode_ms(256, tab)[0], graph=True)
    sweep_prefill(t_end, timed)
    print_table("Sweep (whole op, other launch parameters)", ["op / case", "variant", "ms"], rows)


def profile_prefill(case: str):
    """Per-kernel CUDA time of one call of ours and of fla on one prefill case (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    fla_chunk, why = load_fla()
    q, k, v, g, beta, ssm, qsl, slots, has = gdn_inputs(PREFILL[case])
    h0 = ssm[slots.long()].clone()
    cu, cu_cpu = qsl.long(), qsl.long().cpu()
    runs = {"ours": lambda: gdr.chunk_gated_delta_rule(q, k, v, g, beta, ssm, qsl, slots, has, DK ** -0.5)}
    if fla_chunk is not None:
        runs["fla"] = lambda: fla_chunk(q[None], k[None], v[None], g[None], beta[None], scale=DK ** -0.5,
                                        initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                        cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
    for name, fn in runs.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        rows = [[e.key[:60], e.count, e.device_time_total / 1e3] for e in prof.key_averages()
                if e.device_time_total > 0]
        rows.sort(key=lambda r: -r[2])
        print_table(f"Kernels of one {name} call at {case} (profiler; overlapped kernels both count)",
                    ["kernel", "calls", "ms"], rows[:10])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", type=float, default=0.0, help="seconds to spend timing other launch tables")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--only", choices=["prefill", "decode", "conv", "sweep", "sweep-prefill", "sweep-decode"],
                    default=None)
    ap.add_argument("--profile", choices=list(PREFILL), default=None,
                    help="per-kernel times of ours and fla on this prefill case")
    args = ap.parse_args()
    print(device_header(), flush=True)
    if args.only in (None, "decode"):
        bench_decode()
    if args.only in (None, "conv"):
        bench_conv()
    if args.only in (None, "prefill"):
        bench_prefill(not args.no_fla)
    if args.profile:
        profile_prefill(args.profile)
    if args.only == "sweep-prefill":
        sweep_prefill(time.time() + (args.sweep or 120.0))
    elif args.only == "sweep-decode":
        sweep_decode(args.sweep or 60.0)
    elif args.sweep > 0 or args.only == "sweep":
        sweep(args.sweep or 60.0)


if __name__ == "__main__":
    main()
