"""``catengine bench``: the flags; the benchmark itself is :mod:`catengine.tools.bench`."""
from __future__ import annotations

import argparse

from ..errors import ConfigError
from ..tools.bench import ENGINE_SECTIONS, SECTIONS, run_bench
from ..tools.bench_common import BENCH_PRESETS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-preset", action="append", dest="presets", metavar="NAME",
                   help=f"repeatable; one of {sorted(BENCH_PRESETS)} (default: qwen3.5-27b and qwen3.6-35b-a3b; "
                        "with --quick: tiny-dense and tiny-moe)")
    p.add_argument("--sections", default="engine",
                   help=f"comma list of {', '.join(SECTIONS)}; 'engine' = {', '.join(ENGINE_SECTIONS)}; 'all'")
    p.add_argument("--transformers", action="store_true", help="add the transformers fp16 baseline section")
    p.add_argument("--correctness", action="store_true", help="add the fp16-vs-float32 correctness section")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--dtype", default="auto", help="engine dtype: auto (fp16 on CUDA, float32 on CPU), float16, ...")
    p.add_argument("--workdir", default="/tmp/catengine-bench", help="where the random checkpoints are written")
    p.add_argument("--out", default=None, help="JSON file of every number (default: WORKDIR/bench.json)")
    p.add_argument("--quick", action="store_true", help="tiny lengths (and tiny models by default): a smoke run")
    p.add_argument("--reps", type=int, default=None, help="repetitions per latency (median) after one warm-up; default 5, quick 1")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (passed to the engine)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="engine step token budget")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)


def run(args) -> int:
    try:
        return run_bench(args)
    except ConfigError as e:
        print(f"catengine bench: error: {e}")
        return 2

