"""Paged attention, KV store, norms/RoPE/SiLU and the sampler on the Qwen3.5-27B attention shape
(24 query heads, 4 KV heads, head_dim 256, block size 16).

    PYTHONPATH=. python3 bench/bench_attention.py [--sweep] [--jobs 12] [--quick] [--only decode,sweep]

Decode: batch 1/8/32/64 x context 1K/8K/32K/128K, fp16 and fp8-e5m2 KV: time per call and KV bytes
read over time as a fraction of the copy bandwidth measured in this process (combos above ~40 GB
of KV are skipped). Block tables are random permutations of one large pool, and each timing replays
a CUDA graph of at least 8 back-to-back calls (as a decode step replays attention among its other
kernels) that rotate over enough sequences to keep the KV out of the 50 MB L2. Prefill: one 8K
prompt, one 32K prompt and 8 ragged ~4K prompts, causal TFLOP/s against torch
``scaled_dot_product_attention`` (flash backend, causal, K/V expanded to 24 heads) on the same data.
Small ops: bytes moved over time against the copy bandwidth. ``--sweep`` first times alternative
decode, qk_norm_rope and rms_norm launches (how the sm_90 table rows were chosen; the prefill rows came from
an earlier sweep of the same kind, the sweep only compares their e5m2 widenings), with each e5m2
decode candidate's speedup over the fp16 table row on the same shape. Kernels compile in parallel worker
processes first (``--jobs``), so the timing phase only hits Triton's cache.
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_ms, copy_bandwidth_gbs, device_header, graph_ms, print_table  # noqa: E402

from catengine.kernels.attention import kv_store  # noqa: E402
from catengine.kernels.attention.paged import PREFILL, AttnLaunch, paged_attention_with, table_launch  # noqa: E402
from catengine.kernels.common.arch import arch_of  # noqa: E402
from catengine.kernels.norm import norm_rope  # noqa: E402
from catengine.kernels.norm.naive import rope_cos_sin_cache  # noqa: E402
from catengine.kernels.norm.norm_rope import RowLaunch  # noqa: E402
from catengine.kernels.sampling import sampler  # noqa: E402

NH, NKV, D, BS = 24, 4, 256, 16
TOKEN_BYTES = {torch.float16: NKV * D * 2 * 2, torch.uint8: NKV * D * 2}   # K + V per token
BATCHES, CONTEXTS = (1, 8, 32, 64), (1024, 8192, 32768, 131072)
KV_LIMIT = 40e9
ROTATE_BYTES = 200e6
MIN_CALLS = 8
PREFILL_CASES = {"1 x 8K": [8192], "1 x 32K": [32768], "8 x ~4K ragged": [3584, 4608, 3840, 4352, 4096, 3968,
                                                                           4224, 4096]}
# per KV dtype: the sm_90 table row first; num_stages 5 double-buffers the K/V tiles behind the
# page-table load (3-4 buffer only the table), the two-phase loop (no masks but on the last tile),
# and ctas_per_sm as registers / shared memory allow (cuobjdump -res-usage of Triton 3.6 sm_90 builds:
# e5m2 N128 s3 255 registers + 56 B stack, 8 B two-phase; N64 s5 212, 240 two-phase; N32 s5 prmt 157).
# e5m2: both widenings (shifts; prmt = inline PTX, 2 instead of ~7 instructions per 4 bytes) of N128 s3
# and N64 s5. Earlier sweeps dropped fp16 w8 and ctas/SM 4, and e5m2 N64 w8 ctas/SM 1.
SWEEP_DECODE = {
    torch.float16: [AttnLaunch(16, 32, 4, 5, False, 2), AttnLaunch(16, 32, 4, 5, True, 2),
                    AttnLaunch(16, 64, 4, 3, False, 2)],
    torch.uint8: [AttnLaunch(16, 128, 4, 3, False, 2), AttnLaunch(16, 128, 4, 3, False, 2, True),
                  AttnLaunch(16, 64, 4, 5, False, 2), AttnLaunch(16, 64, 4, 5, False, 2, True),
                  AttnLaunch(16, 128, 4, 3, True, 2, True), AttnLaunch(16, 64, 4, 5, True, 2, True),
                  AttnLaunch(16, 32, 4, 5, False, 3, True)],
}
SWEEP_DECODE_SHAPES = ((1, 131072), (1, 32768), (8, 8192), (8, 32768), (32, 32768), (64, 1024), (64, 8192))
SWEEP_QK = [RowLaunch(4, 32), RowLaunch(4, 16), RowLaunch(4, 8), RowLaunch(2, 4)]
# rms_norm 8192 x 5120 without and with the residual add (warps, rows per program)
SWEEP_RMS = [RowLaunch(8), RowLaunch(16), RowLaunch(4), RowLaunch(8, 2), RowLaunch(4, 2)]


# ----------------------------------------------------------------------------- data
def make_pool(kv_dtype, blocks: int):
    """K and V caches [blocks, 16, 4, 256], random values (e5m2: bytes of magnitude 2^-5..1.75)."""
    shape = (blocks, BS, NKV, D)
    if kv_dtype == torch.uint8:
        return [torch.empty(shape, dtype=torch.uint8, device="cuda").random_(0x28, 0x40) for _ in range(2)]
    return [torch.empty(shape, dtype=kv_dtype, device="cuda").normal_() for _ in range(2)]


def decode_calls(pool, batch: int, ctx: int, cfg=None, seed=0):
    """Closures for ``reps`` decode calls, each over its own random block tables of the pool."""
    nblk = ctx // BS
    # at least MIN_CALLS calls per graph: a graph replay costs several us of its own, which a decode step
    # shares among hundreds of kernels. With one call per graph, 8 x 8K fp16 timed 82 us where ncu put
    # its two kernels at 62.8 + 4.6 us; rotation alone gives one call to every shape over 200 MB
    reps = max(MIN_CALLS, min(32, int(ROTATE_BYTES // (batch * ctx * TOKEN_BYTES[pool[0].dtype]) + 1)))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    calls = []
    for _ in range(reps):
        ids = torch.randint(0, pool[0].shape[0], (batch, nblk), generator=gen, device="cuda", dtype=torch.int32)
        q = torch.randn(batch, NH, 2 * D, device="cuda", dtype=torch.float16)
        calls.append(lambda ids=ids, q=q: paged_attention_with(q[..., :D], pool[0], pool[1], ids, seq_lens, qsl,
                                                               D ** -0.5, 1, ctx, q[..., D:], cfg=cfg))
    return calls


def prefill_setup(lens, kv_dtype, cfg=None):
    """Paged caches holding fresh random K/V for ragged prompts; returns (ours, sdpa) closures."""
    t = sum(lens)
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(t, NH, D, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(t, NKV, D, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(t, NKV, D, device="cuda", dtype=torch.float16, generator=gen)
    blocks = sum((n + BS - 1) // BS for n in lens)
    kc = torch.empty((blocks, BS, NKV, D), device="cuda", dtype=kv_dtype)
    vc = torch.empty_like(kc)
    perm = torch.randperm(blocks, device="cuda", generator=gen).to(torch.int32)
    width = max((n + BS - 1) // BS for n in lens)
    tables = torch.zeros((len(lens), width), dtype=torch.int32, device="cuda")
    slots, used = [], 0
    for b, n in enumerate(lens):
        nb = (n + BS - 1) // BS
        tables[b, :nb] = perm[used:used + nb]
        used += nb
        pos = torch.arange(n, device="cuda")
        slots.append(tables[b, pos // BS].long() * BS + pos % BS)
    kv_store.store_kv(k, v, kc, vc, torch.cat(slots))
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")

    def ours():
        return paged_attention_with(q, kc, vc, tables, seq_lens, qsl, D ** -0.5, max(lens), max(lens), cfg=cfg)

    starts = qsl.tolist()
    per_seq = [(q[s:s + n].transpose(0, 1)[None], k[s:s + n].repeat_interleave(NH // NKV, 1).transpose(0, 1)[None],
                v[s:s + n].repeat_interleave(NH // NKV, 1).transpose(0, 1)[None]) for s, n in zip(starts, lens)]
    per_seq = [tuple(x.contiguous() for x in trip) for trip in per_seq]

    def sdpa():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return [torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=True) for a, b, c in per_seq]
    return ours, sdpa



# ----------------------------------------------------------------------------- parallel compile
def _warm(spec):
    """Worker: run one case once on a small pool, so Triton compiles (and caches) its kernels. A launch
    that does not fit the GPU is reported by the timing phase, not here."""
    kind, args = spec
    try:
        if kind == "decode":
            kv_dtype, batch, ctx, cfg = args
            for c in decode_calls(make_pool(kv_dtype, 4096), batch, ctx, cfg)[:1]:
                c()
        else:
            lens, kv_dtype, cfg = args
            prefill_setup(lens, kv_dtype, cfg)[0]()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - surfaced again, with its message, when timed
        return f"{spec}: {type(e).__name__}"
    return ""


def precompile(specs, jobs: int):
    if jobs <= 1 or not specs:
        return
    t0 = time.time()
    with mp.get_context("spawn").Pool(min(jobs, len(specs))) as pool:
        for err in pool.imap_unordered(_warm, specs):
            if err:
                print("warm-up failed:", err, flush=True)
    print(f"compiled {len(specs)} attention variants in {time.time() - t0:.0f} s on {jobs} processes", flush=True)


def decode_variants(batch):
    """The distinct compiled variants the decode table needs: split or not, per KV dtype."""
    return [(kv, b, ctx, None) for kv in (torch.float16, torch.uint8) for b, ctx in ((1, 131072), (batch, 1024))]


# ----------------------------------------------------------------------------- sections
def bench_decode(copy_gbs, quick):
    blocks = max(b * c for b in BATCHES for c in CONTEXTS if b * c * TOKEN_BYTES[torch.float16] <= KV_LIMIT) // BS
    rows, times = [], {}
    for kv in (torch.float16, torch.uint8):
        pool = make_pool(kv, blocks)
        for b in BATCHES:
            for ctx in CONTEXTS:
                nbytes = b * ctx * TOKEN_BYTES[kv]
                if nbytes > KV_LIMIT or (quick and b * ctx > 1 << 20):
                    continue
                ms = graph_ms(decode_calls(pool, b, ctx))
                times[(kv, b, ctx)] = ms
                frac = nbytes / (ms * 1e-3) / 1e9 / copy_gbs
                speed = f"{times[(torch.float16, b, ctx)] / ms:.2f}x" if kv == torch.uint8 else ""
                target = "" if b * ctx < 65536 else ("ok" if frac >= 0.8 else "MISS")
                if kv == torch.uint8 and ctx >= 32768:
                    target = (target + " " if target else "") + ("ok" if times[(torch.float16, b, ctx)] / ms >= 1.7
                                                                  else "MISS(1.7x)")
                rows.append(["e5m2" if kv == torch.uint8 else "fp16", b, ctx, ms * 1e3, nbytes / 1e9 / (ms * 1e-3),
                             frac, speed, target])
        del pool
        torch.cuda.empty_cache()
    print_table("decode (24 q / 4 kv heads, d 256, gated)", ["KV", "batch", "context", "us", "GB/s",
                                                               "of copy BW", "e5m2 speedup", "target"], rows)


def bench_prefill():
    rows = []
    for name, lens in PREFILL_CASES.items():
        flops = sum(4 * D * NH * n * (n + 1) / 2 for n in lens)
        for kv in (torch.float16, torch.uint8):
            ours, sdpa = prefill_setup(lens, kv)
            ms = bench_ms(ours)
            ref_ms = bench_ms(sdpa) if kv == torch.float16 else float("nan")
            ratio = (ref_ms / ms) if kv == torch.float16 else float("nan")
            rows.append([name, "e5m2" if kv == torch.uint8 else "fp16", ms, flops / ms / 1e9,
                         flops / ref_ms / 1e9 if ref_ms == ref_ms else "", ratio if ratio == ratio else "",
                         ("ok" if ratio >= 0.8 else "MISS") if ratio == ratio else ""])
            del ours, sdpa
            torch.cuda.empty_cache()
    print_table("prefill (causal, fp16 q; SDPA = torch flash backend, fp16 K/V)", ["prompts", "KV", "ms", "TFLOP/s",
                                                                                  "SDPA TFLOP/s", "vs SDPA", "target"],
                rows)


def bench_small(copy_gbs):
    t, h = 8192, 5120
    f16 = torch.float16
    x, r = torch.randn(t, h, device="cuda", dtype=f16), torch.randn(t, h, device="cuda", dtype=f16)
    w = torch.randn(h, device="cuda", dtype=f16) * 0.1
    xs = torch.randn(t, 2 * 17408, device="cuda", dtype=f16)
    xg, zg, wg = (torch.randn(t, 48, 128, device="cuda", dtype=f16), torch.randn(t, 48, 128, device="cuda", dtype=f16),
                  torch.randn(128, device="cuda", dtype=f16))
    qg = torch.randn(t, NH, 2 * D, device="cuda", dtype=f16)
    k = torch.randn(t, NKV, D, device="cuda", dtype=f16)
    cs = rope_cos_sin_cache(262144, 64, 1e7, device="cuda")
    pos = torch.randint(0, 262144, (t,), device="cuda")
    t_kv = 32768  # store_kv moves little per token: more tokens keep launch overhead out
    k_kv = torch.randn(t_kv, NKV, D, device="cuda", dtype=f16)
    kc16 = torch.empty((t_kv // BS + 8, BS, NKV, D), device="cuda", dtype=f16)
    kc8 = torch.empty((t_kv // BS + 8, BS, NKV, D), device="cuda", dtype=torch.uint8)
    slots = torch.randperm(kc16.shape[0] * BS, device="cuda")[:t_kv]
    e = 2
    cases = [
        ("rms_norm + residual 8192x5120", lambda: norm_rope.rms_norm(x, w, 1e-6, r), 4 * t * h * e),
        ("rms_norm 8192x5120", lambda: norm_rope.rms_norm(x, w, 1e-6), 2 * t * h * e),
        ("silu_mul 8192x(2x17408)", lambda: norm_rope.silu_mul(xs), 3 * t * 17408 * e),
        ("gated_rms_norm 8192x48x128", lambda: norm_rope.gated_rms_norm(xg, zg, wg, 1e-6), 3 * t * 48 * 128 * e),
        ("qk_norm_rope 8192 x (24+4) x 256",
         lambda: norm_rope.qk_norm_rope(qg[..., :D], k, w[:D], w[:D], pos, cs, 1e-6),
         2 * t * (NH + NKV) * D * e + t * 64 * 4),
        ("store_kv fp16 32768 tokens", lambda: kv_store.store_kv(k_kv, k_kv, kc16, kc16, slots),
         4 * t_kv * NKV * D * e),
        ("store_kv e5m2 32768 tokens", lambda: kv_store.store_kv(k_kv, k_kv, kc8, kc8, slots),
         2 * t_kv * NKV * D * (e + 1)),
    ]
    rows = []
    for name, fn, nbytes in cases:
        ms = bench_ms(fn)
        frac = nbytes / (ms * 1e-3) / 1e9 / copy_gbs
        rows.append([name, ms * 1e3, nbytes / (ms * 1e-3) / 1e9, frac, "ok" if frac >= 0.8 else "MISS"])
    v = 248320
    for b in (1, 64):
        logits = torch.randn(b, v, device="cuda") * 4
        args = (logits, torch.full((b,), 0.8, device="cuda"), torch.full((b,), 50, dtype=torch.int32, device="cuda"),
                torch.full((b,), 0.95, device="cuda"), torch.full((b,), 0.02, device="cuda"),
                torch.arange(b, device="cuda"), torch.zeros(b, dtype=torch.int64, device="cuda"))
        ms = graph_ms([lambda: sampler.sample_tokens(*args)])
        nbytes = 3 * b * v * 4  # three passes over the logits: max, sum/candidate, filter check
        rows.append([f"sample_tokens B={b} top-k 50 top-p .95 min-p .02", ms * 1e3, nbytes / (ms * 1e-3) / 1e9,
                     nbytes / (ms * 1e-3) / 1e9 / copy_gbs, ""])
    print_table("small ops (fp16)", ["op", "us", "GB/s", "of copy BW", "target"], rows)


def _timed(fn) -> float | str:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - e.g. a launch needing more shared memory than the GPU has
        return f"failed: {type(e).__name__}"


def _short(cfg: AttnLaunch) -> str:
    two = " 2-phase" if cfg.two_phase else ""
    prmt = " prmt" if cfg.widen_asm else ""
    return f"M{cfg.block_m} N{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} ctas/SM {cfg.ctas_per_sm}{two}{prmt}"


def sweep(copy_gbs):
    """Decode candidates per shape; e5m2 rows also give their speedup over the fp16 table row (first fp16
    candidate) on the same shape, the issue's 1.7x target from 32K tokens per sequence up."""
    rows, fp16_us = [], {}
    for kv in (torch.float16, torch.uint8):
        pool = make_pool(kv, 131072 * 8 // BS)
        for b, ctx in SWEEP_DECODE_SHAPES:
            gb = b * ctx * TOKEN_BYTES[kv] / 1e9
            for cfg in SWEEP_DECODE[kv]:
                us = _timed(lambda: graph_ms(decode_calls(pool, b, ctx, cfg)) * 1e3)  # noqa: B023 - called now
                ok = isinstance(us, float)
                fp16_us.setdefault((b, ctx), us if ok and kv == torch.float16 else None)
                ref = fp16_us[(b, ctx)]
                rows.append(["decode", "e5m2" if kv == torch.uint8 else "fp16", f"{b} x {ctx}", _short(cfg), us,
                             gb / (us * 1e-6) / copy_gbs if ok else "",
                             f"{ref / us:.2f}x" if ok and ref and kv == torch.uint8 else ""])
        pool = None
        torch.cuda.empty_cache()
    # e5m2 prefill: the sm_90 prefill row with both widenings (the row's widen_asm only acts on e5m2)
    for name in ("1 x 8K", "8 x ~4K ragged"):
        lens = PREFILL_CASES[name]
        flops = sum(4 * D * NH * n * (n + 1) / 2 for n in lens)
        for cfg in sweep_prefill_rows():
            ours = prefill_setup(lens, torch.uint8, cfg)[0]
            us = _timed(lambda: bench_ms(ours) * 1e3)  # noqa: B023 - called now
            rows.append(["prefill (TFLOP/s)", "e5m2", name, _short(cfg), us,
                         flops / (us * 1e-6) / 1e12 if isinstance(us, float) else "", ""])
    torch.cuda.empty_cache()
    t = 8192
    qg = torch.randn(t, NH, 2 * D, device="cuda", dtype=torch.float16)
    k = torch.randn(t, NKV, D, device="cuda", dtype=torch.float16)
    w = torch.randn(D, device="cuda", dtype=torch.float16) * 0.1
    cs = rope_cos_sin_cache(262144, 64, 1e7, device="cuda")
    pos = torch.randint(0, 262144, (t,), device="cuda")
    nbytes = 2 * t * (NH + NKV) * D * 2 + t * 64 * 4
    for cfg in SWEEP_QK:
        us = _timed(lambda: bench_ms(lambda: norm_rope.qk_norm_rope_with(qg[..., :D], k, w, w, pos, cs, 1e-6,  # noqa
                                                                         cfg=cfg)) * 1e3)  # noqa: B023
        rows.append(["qk_norm_rope", "", f"{t} x 28 x {D}", f"w{cfg.num_warps} rows {cfg.block_r}", us,
                     nbytes / (us * 1e-6) / 1e9 / copy_gbs if isinstance(us, float) else "", ""])
    h = 5120
    x, r = (torch.randn(t, h, device="cuda", dtype=torch.float16) for _ in range(2))
    w = torch.randn(h, device="cuda", dtype=torch.float16) * 0.1
    for res, name in ((None, "rms_norm"), (r, "rms_norm + residual")):
        nbytes = (2 if res is None else 4) * t * h * 2
        for cfg in SWEEP_RMS:
            us = _timed(lambda: bench_ms(lambda: norm_rope.rms_norm_with(x, w, 1e-6, res, cfg=cfg)) * 1e3)  # noqa: B023
            rows.append([name, "", f"{t} x {h}", f"w{cfg.num_warps} rows {cfg.block_r}", us,
                         nbytes / (us * 1e-6) / 1e9 / copy_gbs if isinstance(us, float) else "", ""])
    print_table("launch sweep (us per call; rate = fraction of copy bandwidth, prefill: TFLOP/s)",
                ["kernel", "KV", "shape", "launch", "us", "rate", "vs fp16 row"], rows)
    err = _timed(print_compiled)
    if err:
        print("compiled-kernel listing", err)


def sweep_prefill_rows():
    row = PREFILL[(arch_of(torch.device("cuda")), D)]
    return [dataclasses.replace(row, widen_asm=False), dataclasses.replace(row, widen_asm=True)]


def print_compiled():
    """Registers, spills, shared memory and pipelined buffers of every compiled decode kernel: the
    ctas_per_sm of a table row must match what this Triton build made of it."""
    import re

    from catengine.kernels.attention.paged import paged_attn_kernel
    rows = []
    for fn in (paged_attn_kernel,):
        try:
            caches = [c[0] if isinstance(c, tuple) else c for c in fn.device_caches.values()]
            kernels = [k for c in caches for k in c.values()]
        except Exception as e:  # noqa: BLE001 - Triton-version internals: report, do not fail the bench
            print("cannot list compiled kernels:", type(e).__name__, e)
            return
        for k in kernels:
            ttgir = k.asm.get("ttgir", "")
            bufs = ",".join(sorted(set(re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+x\d+x\d+x\w+)", ttgir))))
            tiles = re.findall(r"(?:tt.dot|warp_group_dot) .*?-> tensor<(\d+x\d+)", ttgir)
            ptx = k.asm.get("ptx", "")
            widen = "prmt" if "0x2404" in ptx else ("shift" if "xi16" in bufs else "")
            loops = ttgir.count("scf.for")  # 2 for a two-phase build
            rows.append([fn.__name__, k.metadata.num_warps, k.metadata.num_stages, getattr(k, "n_regs", ""),
                         getattr(k, "n_spills", ""), k.metadata.shared, bufs, " ".join(sorted(set(tiles))), widen,
                         loops])
    print_table("compiled attention kernels", ["kernel", "warps", "stages", "regs", "spills", "shared", "buffers",
                                               "dot outputs", "e5m2 widen", "key loops"], rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="time alternative launch configurations first")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="parallel compile processes")
    ap.add_argument("--quick", action="store_true", help="skip decode combos over 1M tokens")
    ap.add_argument("--only", default="", help="comma list of sections: decode,prefill,small,sweep")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    arch = arch_of(torch.device("cuda"))
    specs = [("decode", v) for v in decode_variants(64)] if not only or "decode" in only else []
    if not only or "prefill" in only:
        specs += [("prefill", ([4096, 100], kv, None)) for kv in (torch.float16, torch.uint8)]
    if args.sweep and (not only or "sweep" in only):
        # one split and one unsplit shape per launch: every compiled variant the sweep times
        specs += [("decode", (kv, b, ctx, cfg)) for kv in (torch.float16, torch.uint8) for cfg in SWEEP_DECODE[kv]
                  for b, ctx in ((1, 131072), (64, 8192))]
        specs += [("prefill", ([4096, 100], torch.uint8, cfg)) for cfg in sweep_prefill_rows()]
    precompile(specs, args.jobs)
    print(device_header(), f"| d256 rows of the sm_{arch} tables: decode fp16 "
          f"{_short(table_launch(arch, 256, True, False))}, decode e5m2 {_short(table_launch(arch, 256, True, True))}, "
          f"prefill {_short(PREFILL[(arch, 256)])}", flush=True)
    copy_gbs = copy_bandwidth_gbs()
    t0 = time.time()
    if args.sweep and (not only or "sweep" in only):
        sweep(copy_gbs)
    if not only or "decode" in only:
        bench_decode(copy_gbs, args.quick)
    if not only or "prefill" in only:
        bench_prefill()
    if not only or "small" in only:
        bench_small(copy_gbs)
    print(f"benchmark time {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
