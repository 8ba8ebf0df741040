"""How fast a kernel that only *reads* the W4A16 GEMV's packed weights runs: the ceiling the GEMV's
bandwidth fraction should be read against (bench/NOTES.md, issue 5).

Each kernel XORs the int32 weights into registers (no dequantisation, no activations) over the 27B
shapes' [K/8, N] layout (and blocks of the MoE decode's size), as fractions of the measured copy
bandwidth:
- ``tiles``: the GEMV's grid (column tiles x split-K ranges of R-row tiles, split toward `waves` x SMs
  programs); ``repacked``: the same, with each R x BN tile stored contiguously (a layout the GEMV could be
  converted to at load time);
- ``PDL``: the GEMV layout, each call a programmatic dependent launch of the one before (its loads run
  while the previous call finishes; only the store waits), as the GEMV's ``pdl`` launch does;
- ``persistent``: a fixed number of programs striding over all tiles, 1 or 3 pipeline stages.
Timed as CUDA-graph replays of at least 8 calls over rotating copies (as bench_gemm.py), so L2 hits do
not count.

Usage: python bench/read_ceiling.py
"""
from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench.common import copy_bandwidth_gbs, device_header, graph_ms, print_table, rotated  # noqa: E402

# the 27B dense shapes of bench_gemm.py, and the bytes one MoE decode kernel reads for one token of
# 35B-A3B (8 experts' gate_up [2048 -> 2 x 512] or down [512 -> 2048], here as one contiguous block)
SHAPES = [("qkv 5120->14336", 5120, 14336), ("o_proj 6144->5120", 6144, 5120),
          ("gate_up 5120->34816", 5120, 34816), ("down 17408->5120", 17408, 5120),
          ("MoE 8 experts gate_up", 2048, 8 * 1024), ("MoE 8 experts down", 512, 8 * 2048)]


@triton.jit
def read_tiles_kernel(q, out, N, KR, n_split, BN: tl.constexpr, R: tl.constexpr, REPACKED: tl.constexpr,
                      PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    i_n, i_s = tl.program_id(0), tl.program_id(1)
    n_kb = KR // R
    per = tl.cdiv(n_kb, n_split)
    acc = tl.zeros([R, BN], tl.int32)
    o_r = tl.arange(0, R)
    o_c = tl.arange(0, BN)
    for kb in range(per * i_s, tl.minimum(per * i_s + per, n_kb)):
        if REPACKED:
            p = q + (kb.to(tl.int64) * (N // BN) + i_n) * (R * BN) + o_r[:, None] * BN + o_c[None, :]
        else:
            p = q + (kb * R + o_r).to(tl.int64)[:, None] * N + i_n * BN + o_c[None, :]
        acc ^= tl.load(p, cache_modifier=".cg")
    if PDL:
        tl.extra.cuda.gdc_wait()
    # stored so that the loads are not dead code
    tl.store(out + (i_s * tl.num_programs(0) + i_n) * BN + o_c, tl.sum(acc, 0))


@triton.jit
def read_persistent_kernel(q, out, N, n_items, BN: tl.constexpr, R: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    n_t = N // BN
    acc = tl.zeros([R, BN], tl.int32)
    o_r = tl.arange(0, R)
    o_c = tl.arange(0, BN)
    for it in tl.range(pid, n_items, tl.num_programs(0), num_stages=STAGES):
        kb, i_n = it // n_t, it % n_t
        acc ^= tl.load(q + (kb * R + o_r).to(tl.int64)[:, None] * N + i_n * BN + o_c[None, :], cache_modifier=".cg")
    tl.store(out + pid * BN + o_c, tl.sum(acc, 0))


def _copies(kr: int, n: int):
    reps = max(2, (256 << 20) // (kr * n * 4))
    return [torch.randint(0, 2**31, (kr * n,), dtype=torch.int32, device="cuda") for _ in range(reps)]


def tiles_gbs(k, n, bn, r, waves, repacked, sms, warps=4, pdl=False):
    kr = k // 8
    qs = _copies(kr, n)
    split = max(1, min(kr // r, -(-waves * sms // (n // bn))))
    out = torch.empty(split * n, dtype=torch.int32, device="cuda")
    ms = graph_ms(rotated(qs, lambda q: read_tiles_kernel[(n // bn, split)](
        q, out, n, kr, split, BN=bn, R=r, REPACKED=repacked, PDL=pdl, num_warps=warps,
        **({"launch_pdl": True} if pdl else {}))))
    return kr * n * 4 / (ms * 1e-3) / 1e9


def persistent_gbs(k, n, bn, r, programs, stages, warps=4):
    kr = k // 8
    qs = _copies(kr, n)
    out = torch.empty(programs * bn, dtype=torch.int32, device="cuda")
    items = (kr // r) * (n // bn)
    ms = graph_ms(rotated(qs, lambda q: read_persistent_kernel[(programs,)](q, out, n, items, BN=bn, R=r,
                                                                            STAGES=stages, num_warps=warps)))
    return kr * n * 4 / (ms * 1e-3) / 1e9


def main():
    print(device_header(), flush=True)
    bw = copy_bandwidth_gbs()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, k, n in SHAPES:
        for bn, r in ((64, 64), (64, 16), (256, 16)) if k >= 4096 else ((64, 16),):
            for waves in (4, 16):
                rows.append([name, f"{bn} x {r} rows, split toward {waves} waves",
                             tiles_gbs(k, n, bn, r, waves, False, sms) / bw,
                             tiles_gbs(k, n, bn, r, waves, True, sms) / bw,
                             tiles_gbs(k, n, bn, r, waves, False, sms, pdl=True) / bw])
            for per_sm in (4, 8, 16):
                rows.append([name, f"{bn} x {r} rows, persistent {per_sm} per SM, 1 / 3 stages",
                             persistent_gbs(k, n, bn, r, per_sm * sms, 1) / bw,
                             persistent_gbs(k, n, bn, r, per_sm * sms, 3) / bw, ""])
            print(f"{name} {bn} x {r} done", flush=True)
    print_table(f"Read-only ceiling of the GEMV's weight bytes (fraction of copy bandwidth {bw:.0f} GB/s)",
                ["shape", "grid", "GEMV layout (or 1 stage)", "repacked tiles (or 3 stages)",
                 "GEMV layout, each call a PDL of the one before"], rows)


if __name__ == "__main__":
    main()
