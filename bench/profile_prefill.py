"""Where a prefill step's time goes: per-kernel GPU time under torch.profiler for one prompt of LEN tokens in one
engine step, and the wall time of that step, on random AWQ checkpoints with the real layer dimensions but few layers
(the decode twin is profile_decode.py, whose checkpoints this shares).

    PYTHONPATH=. python3 bench/profile_prefill.py [--preset qwen3.6-35b-a3b] [--layers 8] [--len 8192]

To compare two trees, run this file with the other tree's catengine first on PYTHONPATH (the engine API it uses is
older than issue 21); both read the same checkpoint, since the random checkpoint writer did not change after df8fa90.
--host (cProfile), --trace (a chrome trace of host and GPU) and --sync-debug
(CUDA's warning at each host sync) say why a wall exceeds its kernels.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from catengine import Engine, SamplingParams
from profile_decode import checkpoint, kernel_times


def prefill_once(engine: Engine, rng: random.Random, length: int) -> None:
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    engine.generate([[rng.randrange(100_000) for _ in range(length)]], params)


def host_profile(fn, top: int) -> None:
    """cProfile of one call, by own time: a host that waits on the GPU shows it in the function that synchronises."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.runcall(fn)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    print("```\n" + "\n".join(buf.getvalue().strip().splitlines()[-top - 2:]) + "\n```")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", action="append", default=None)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--len", type=int, nargs="+", default=[8192])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--top", type=int, default=16)
    p.add_argument("--budget", type=int, default=None,
                   help="max_num_batched_tokens (default: the longest --len, one chunk; the bench's is 8192)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (the bench captures decode graphs)")
    p.add_argument("--host", action="store_true", help="also cProfile one prefill: where the host spends or waits")
    p.add_argument("--trace", default=None, help="a chrome trace (host and GPU) of one prefill, written here")
    p.add_argument("--sync-debug", action="store_true", help="warn at each host sync during one prefill")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of this script, its numbers mean nothing")
    args = p.parse_args()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    activity = ProfilerActivity.CUDA if args.device.startswith("cuda") else ProfilerActivity.CPU
    for preset in args.preset or ["qwen3.5-27b", "qwen3.6-35b-a3b"]:
        path = checkpoint(preset, args.layers, args.device)
        longest = max(args.len)
        engine = Engine(model=str(path), device=args.device, max_model_len=longest + 16, max_num_seqs=1,
                        max_num_batched_tokens=args.budget or longest, enable_prefix_caching=False,
                        enforce_eager=args.eager or not args.device.startswith("cuda"),
                        kv_cache_memory_bytes=4 << 30)
        rng = random.Random(0)
        for length in args.len:
            prefill_once(engine, rng, length)   # warm-up: compilation, autotuning
            walls = []
            for _ in range(args.reps):
                sync()
                t0 = time.perf_counter()
                prefill_once(engine, rng, length)
                sync()
                walls.append((time.perf_counter() - t0) * 1e6)
            with profile(activities=[activity]) as prof:
                prefill_once(engine, rng, length)
                sync()
            kernels = kernel_times(prof, attr="device_time_total" if activity == ProfilerActivity.CUDA else
                                   "self_cpu_time_total")
            total = sum(kernels.values())
            print(f"\n### {preset}, {args.layers} layers, prefill {length}: kernels {total:.0f} us, "
                  f"wall {statistics.median(walls):.0f} us (median of {args.reps}), "
                  f"{length / statistics.median(walls) * 1e6:,.0f} tok/s")
            print("| kernel | us | us/layer | share |\n|---|---|---|---|")
            for name, t in sorted(kernels.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"| {name[:90]} | {t:.1f} | {t / args.layers:.1f} | {t / total:.1%} |")
            print(f"{len(kernels)} kernel names, {sum(ev.count for ev in prof.key_averages() if ev.device_time_total > 0)}"
                  " launches" if activity == ProfilerActivity.CUDA else "")
            if args.trace:
                with profile(activities=sorted({ProfilerActivity.CPU, activity}, key=str)) as prof:
                    prefill_once(engine, rng, length)
                    sync()
                prof.export_chrome_trace(f"{args.trace}-{preset}-{length}.json")
            if args.sync_debug:
                torch.cuda.set_sync_debug_mode("warn")
                prefill_once(engine, rng, length)
                torch.cuda.set_sync_debug_mode("default")
            if args.host:
                host_profile(lambda: (prefill_once(engine, rng, length), sync()), args.top)
        engine.close()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
