"""Gated DeltaNet kernels on the Qwen3.5-27B shape (Hk 16, Hv 48, dk = dv = 128, conv_dim 10240), bf16.

- Prefill (chunked rule): ours against flash-linear-attention's ``chunk_gated_delta_rule`` on the same
  inputs (GVA, varlen cu_seqlens, initial and final states, q/k l2norm in kernel) and against the
  FLOP count of the chunked algorithm, as a fraction of the measured bf16 matmul rate.
- Decode (recurrent rule, one token per sequence): state bytes read + written over time, as a
  fraction of the measured device-to-device copy bandwidth. Timed as CUDA-graph replays (as the
  engine runs decode) over rotating state slots, so neither launch overhead nor L2 hits count.
- Conv1d: bytes moved (input, output, states, weights once) over time, against copy bandwidth.
``--sweep S`` then times other launch tables end to end until S seconds after the start, each
checked against the table's output (to choose the per-architecture table; never at serve time),
and ``--profile`` prints per-kernel times of ours and fla at 1 x 64K.

Usage: python bench/bench_gdn.py [--only prefill|decode|conv|sweep|sweep-prefill] [--sweep S] [--no-fla]
``--only prefill --sweep S``: the prefill table (with fla) then the prefill candidates only;
``--only sweep-prefill --sweep S``: the prefill candidates alone (no fla, no table first).
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
from catengine.kernels import conv1d as cv  # noqa: E402
from catengine.kernels import gated_delta_rule as gdr  # noqa: E402
from catengine.kernels import gdn_recurrent as rec  # noqa: E402

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
        # the kernels timed alone (the table may overlap them on three streams for this case)
        alone = dataclasses.replace(gdr._device_table(q.device), overlap_max_programs=0)
        _, steps = gdr.chunk_steps(q, k, v, g, beta, ssm, qsl, slots, has, scale, table=alone)
        parts = {n: bench_ms(f) for n, f in steps}
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
                     parts["wy"], parts["h"], parts["o"], diff])
        print(f"  {name}: ours {ours:.3f} ms, fla {fla_ms:.3f} ms, parts {parts}, rel diff vs fla {diff:.1e}",
              flush=True)
        torch.cuda.empty_cache()
    print_table("Prefill: chunked gated delta rule (bf16, fp32 states in slots)",
                ["case", "tokens", "ours ms", "fla ms", "fla/ours", "TFLOP/s", "% matmul peak",
                 "wy ms", "h ms", "o ms", "rel diff vs fla"], rows)
    return {r[0]: r[3] for r in rows}



def rotations(nbytes: int) -> int:
    """Enough disjoint slot sets that one graph replay streams >= 256 MiB (the H200's L2 is 50 MiB)."""
    return max(2, -(-(256 << 20) // max(nbytes, 1)))


def decode_ms(b, table=None):
    state_bytes = 2 * b * HV * DK * DV * 4
    rot = rotations(state_bytes)
    q, k, v, g, beta, _, qsl, _, has = gdn_inputs([1] * b, seed=b)
    ssm = torch.randn(rot * b, HV, DK, DV, device="cuda") * 0.1
    sets = [torch.randperm(b, device="cuda").to(torch.int32) + r * b for r in range(rot)]
    return graph_ms([lambda s=s: rec._recurrent(q, k, v, g, beta, ssm, qsl, s, has, 0.088, True, None, table)
                     for s in sets]), state_bytes


def bench_decode():
    copy = copy_bandwidth_gbs()
    rows = []
    for b in (1, 8, 64, 256):
        ms, state_bytes = decode_ms(b)
        io_bytes = b * (2 * HK * DK + 2 * HV * DV) * 2 + b * HV * 8
        gbs = (state_bytes + io_bytes) / (ms * 1e-3) / 1e9
        rows.append([b, ms * 1e3, state_bytes / 2**20, gbs, 100 * gbs / copy])
    print_table(f"Decode: recurrent gated delta rule, CUDA graph (copy bandwidth {copy:.0f} GB/s)",
                ["batch", "us", "state MiB r+w", "GB/s", "% of copy"], rows)


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
    return graph_ms([lambda s=s: cv._conv_update(x, w, st, s, "silu", table) for s in sets]), nbytes


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


# prefill candidates for --sweep: GDNTable fields over this device's row, as (label, fields); the
# first is the row itself. Each runs on all three cases before the next, most promising first, so a
# sweep cut short by its time limit still has complete rows.
PREFILL_CANDIDATES = [
    ("table", {}),
    ("o loop BK64 BV64 w4 heads-first", dict(o_bk=64, o_bv=64, o_warps=4, o_heads_first=True)),
    ("wy split BD64 w4 heads-first", dict(wy_split=True, wu_bd=64, wu_warps=4, wy_heads_first=True)),
    ("wy split + o BK64 BV64 w4", dict(wy_split=True, wu_bd=64, wy_heads_first=True, o_bk=64, o_bv=64,
                                        o_warps=4, o_heads_first=True)),
    ("o loop BK64 BV128 w8 heads-first", dict(o_bk=64, o_bv=128, o_warps=8, o_heads_first=True)),
    ("wy split + o BK64 BV128 w8", dict(wy_split=True, wu_bd=64, wy_heads_first=True, o_bk=64, o_bv=128,
                                         o_warps=8, o_heads_first=True)),
    ("o loop BK64 BV128 w8 chunk-first", dict(o_bk=64, o_bv=128, o_warps=8)),
    ("o loop BK128 BV64 w4 heads-first", dict(o_bk=128, o_bv=64, o_warps=4, o_heads_first=True)),
    ("wy split BD64 w4 chunk-first", dict(wy_split=True, wu_bd=64, wu_warps=4)),
    ("wy fused heads-first", dict(wy_heads_first=True)),
    ("wy split BD128 w8 heads-first", dict(wy_split=True, wu_bd=128, wu_warps=8, wy_heads_first=True)),
    ("o loop BK64 BV64 w4 s3 heads-first", dict(o_bk=64, o_bv=64, o_warps=4, o_stages=3, o_heads_first=True)),
    ("wy split + o BK64 BV64 w4 + h BV64", dict(wy_split=True, wu_bd=64, wy_heads_first=True, o_bk=64, o_bv=64,
                                                 o_warps=4, o_heads_first=True, h_bv=64)),
    ("wy split + o BK64 BV64 w4, no windows", dict(wy_split=True, wu_bd=64, wy_heads_first=True, o_bk=64,
                                                    o_bv=64, o_warps=4, o_heads_first=True,
                                                    overlap_max_programs=0)),
    ("no windows", dict(overlap_max_programs=0)),
    ("h BV64", dict(h_bv=64)),
]


class _Sweep:
    """Rows of the sweep tables; a candidate that fails (shared memory, ...) is reported, not fatal."""

    def __init__(self, t_end: float):
        self.t_end, self.rows, self.last_err = t_end, [], float("nan")

    def timed(self, label, variant, fn, graph=False, check=None):
        if time.time() > self.t_end:
            print(f"  {label} {variant}: skipped (sweep time is up)", flush=True)
            return float("inf")
        try:
            ms = fn() if graph else bench_ms(fn, warmup_ms=5, rep_ms=30)
            err = check() if check is not None else float("nan")
        except Exception as e:
            print(f"  {label} {variant}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)
            return float("inf")
        self.rows.append([label, variant, ms, err])
        self.last_err = err
        print(f"  {label} {variant}: {ms:.4f} ms (rel diff vs table {err:.1e})", flush=True)
        return ms


def sweep_prefill(sw: _Sweep, fla_ms: dict | None = None):
    """Every prefill candidate on each case, its output checked against the table's on the same
    inputs; then per case the fastest checked candidate and the fields that select it."""
    base = gdr._device_table(torch.device("cuda"))
    times, cases = {}, {}
    for name in PREFILL:
        args = gdn_inputs(PREFILL[name])
        cases[name] = (args, args[5].clone())

    def run(name, tab):
        args, ssm0 = cases[name]
        args[5].copy_(ssm0)
        o, steps = gdr.chunk_steps(*args, DK ** -0.5, table=tab)
        for _, launch in steps:
            launch()
        return o
    want = {}
    for name in PREFILL:
        want[name] = (run(name, base).clone(), cases[name][0][5].clone())

    def check(name, tab):
        """The larger of the output's and the final states' relative difference from the table's."""
        o = run(name, tab)
        return max(rel(o, want[name][0]), rel(cases[name][0][5], want[name][1]))
    for label, fields in PREFILL_CANDIDATES:
        tab = dataclasses.replace(base, **fields)
        for name in PREFILL:
            ms = sw.timed(f"prefill {name}", label, lambda: run(name, tab), check=lambda: check(name, tab))
            # a candidate counts only with its output within the bf16 bound of the tests (2e-2)
            if ms < float("inf") and sw.last_err < 2e-2:
                times[(name, label)] = ms
    cases.clear()  # frees the inputs (the closures above hold the dicts)
    want.clear()
    torch.cuda.empty_cache()
    rows = []
    for name in PREFILL:
        got = {lab: ms for (n, lab), ms in times.items() if n == name}
        if not got:
            continue
        best = min(got, key=got.get)
        fla = (fla_ms or {}).get(name, float("nan"))
        rows.append([name, best, got[best], got.get("table", float("nan")), fla, fla / got[best]])
    print_table("Fastest checked prefill candidate per case (fla: this run's bench_prefill, if it ran)",
                ["case", "candidate", "ms", "table ms", "fla ms", "fla/ours"], rows)
    complete = [lab for lab, _ in PREFILL_CANDIDATES if all((n, lab) in times for n in PREFILL)]
    if complete:
        ref_ms = {n: times.get((n, "table"), 1.0) for n in PREFILL}
        score = {lab: sum(times[(n, lab)] / ref_ms[n] for n in PREFILL) / len(PREFILL) for lab in complete}
        best = min(score, key=score.get)
        print(f"best over all three cases (mean time relative to the table): {best} ({score[best]:.3f}); "
              f"select it with dataclasses.replace(row, **{dict(PREFILL_CANDIDATES)[best]})", flush=True)


def sweep(t_end: float, fla_ms: dict | None = None, only_prefill: bool = False):
    """Other launch tables around this device's table, until the wall clock reaches t_end (never at
    serve time). Every candidate's output is compared with the table's on the same inputs, so a
    table picked from these rows has been checked on this GPU. Order: what decides the most first."""
    base = gdr._device_table(torch.device("cuda"))
    cbase = cv._device_table(torch.device("cuda"))
    sw = _Sweep(t_end)
    timed = sw.timed
    sweep_prefill(sw, fla_ms)
    if only_prefill:
        print_table("Sweep (prefill launch tables, whole op; rel diff: output and state against the table's)",
                    ["op / case", "variant", "ms", "rel diff"], sw.rows)
        return

    def decode_check(b, tab):
        """Output and new states of one decode step against the table's (state rel diff; o's the same)."""
        q, k, v, g, beta, ssm, qsl, slots, has = gdn_inputs([1] * b, seed=7)
        s1 = ssm.clone()
        o1 = rec._recurrent(q, k, v, g, beta, s1, qsl, slots, has, 0.088, True, None, base)
        o2 = rec._recurrent(q, k, v, g, beta, ssm, qsl, slots, has, 0.088, True, None, tab)
        return max(rel(o2, o1), rel(ssm, s1))

    for b in (8, 64, 256):
        for bv, nw in ((64, 4), (32, 4), (32, 2), (16, 2), (16, 1), (64, 8)):
            tab = dataclasses.replace(base, rec_bv=bv, rec_warps=nw)
            timed(f"decode batch {b}", f"BV={bv} warps={nw}", lambda: decode_ms(b, tab)[0], graph=True,
                  check=lambda: decode_check(b, tab))
    x, w, st, qsl, slots, has = conv_inputs(PREFILL["8 x 4K ragged"])
    st0 = st.clone()

    def conv(tab):
        st.copy_(st0)
        return cv._conv(x, w, st, qsl, slots, has, "silu", tab)
    want = conv(dataclasses.replace(cbase, rows=None, fwd=cv.ConvLaunch(16, 256, 8, 2))).clone()
    for kind, c in (("tile", (16, 256, 8, 2)), ("tile", (8, 256, 4, 2)), ("tile", (8, 512, 8, 2)),
                    ("tile", (4, 512, 4, 2)), ("rows", (64, 512, 2, 1)), ("rows", (128, 1024, 4, 1))):
        launch = cv.ConvLaunch(*c)
        tab = dataclasses.replace(cbase, rows=launch if kind == "rows" else None,
                                  fwd=launch if kind == "tile" else cbase.fwd)
        timed("conv 8 x 4K", f"{kind} {c}", lambda: conv(tab), check=lambda: rel(conv(tab), want))
    for b in (8, 256):
        for bc, nw in ((512, 4), (1024, 8), (256, 2), (1024, 4)):
            tab = dataclasses.replace(cbase, update=cv.ConvLaunch(1, bc, nw, 1))
            timed(f"conv decode {b}", f"BC={bc} warps={nw}", lambda: conv_decode_ms(b, tab)[0], graph=True)
    print_table("Sweep (other launch parameters, whole op; rel diff: output against the table's)",
                ["op / case", "variant", "ms", "rel diff"], sw.rows)


def profile_64k():
    """Per-kernel CUDA time of one call of ours and of fla at 1 x 64K (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    fla_chunk, why = load_fla()
    q, k, v, g, beta, ssm, qsl, slots, has = gdn_inputs(PREFILL["1 x 64K"])
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
        print_table(f"Kernels of one {name} call at 1 x 64K (profiler; overlapped kernels both count)",
                    ["kernel", "calls", "ms"], rows[:10])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", type=float, default=0.0,
                    help="time other launch tables until this many seconds after the start")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--only", choices=["prefill", "decode", "conv", "sweep", "sweep-prefill"], default=None)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    print(device_header(), flush=True)
    if args.only in (None, "decode"):
        bench_decode()
    if args.only in (None, "conv"):
        bench_conv()
    fla_ms = bench_prefill(not args.no_fla) if args.only in (None, "prefill") else None
    if args.profile:
        profile_64k()
    if args.sweep > 0 or args.only in ("sweep", "sweep-prefill"):
        sweep(t0 + (args.sweep or 60.0), fla_ms, only_prefill=args.only in ("prefill", "sweep-prefill"))


if __name__ == "__main__":
    main()
