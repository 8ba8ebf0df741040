"""Shared benchmark helpers: the hardware ceilings measured in the same run, and table printing.

Every benchmark reports our time, the peer's time and the hardware limit as ratios measured in one
process, so a reader never compares numbers from different runs or datasheets.
"""
from __future__ import annotations

import functools

import torch


def bench_ms(fn, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn()`` in milliseconds (CUDA events via triton.testing.do_bench)."""
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def graph_ms(calls) -> float:
    """Milliseconds per call of ``calls`` (zero-argument launches) replayed back to back from one CUDA graph:
    launch gaps stay out of the numbers, as they will on the serving path."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    return bench_ms(graph.replay) / len(calls)


# a benchmark's CUDA graph holds at least this many calls, so that the graph's own start is not
# charged to one or two calls, and a programmatic dependent launch overlaps the call before it
GRAPH_CALLS = 8


def rotated(items, fn) -> list:
    """At least GRAPH_CALLS zero-argument calls of fn, cycling over items (weight copies, routings)."""
    return [lambda it=items[i % len(items)]: fn(it) for i in range(max(GRAPH_CALLS, len(items)))]


@functools.cache
def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3) / 1e9


@functools.cache
def matmul_tflops(dtype: torch.dtype = torch.float16, n: int = 8192) -> float:
    """Measured dense matmul rate (cuBLAS through torch) on random data, TFLOP/s."""
    a = torch.randn(n, n, dtype=dtype, device="cuda")
    b = torch.randn(n, n, dtype=dtype, device="cuda")
    ms = bench_ms(lambda: a @ b)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def print_table(title: str, header: list[str], rows: list[list], file=None) -> str:
    """Print (and return) a Markdown table, numbers formatted compactly."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)
    lines = [f"### {title}", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, file=file, flush=True)
    return text


def device_header() -> str:
    props = torch.cuda.get_device_properties(0)
    return (f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
            f"copy {copy_bandwidth_gbs():.0f} GB/s, fp16 matmul {matmul_tflops():.0f} TFLOP/s")
