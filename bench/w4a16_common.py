"""Helpers the W4A16 and MoE benchmarks share: the quantisation group, packed bytes, graph timing of a
list of calls, and the table sweep (time each candidate launch table, keep the fastest)."""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

from common import print_table

GROUP = 128


def graph_ms(calls, reps: int = 15) -> float:
    """Milliseconds per call: one CUDA graph holds every call once, replayed ``reps`` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:          # compile and allocate outside the capture
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times) / len(calls)


def qbytes(k, n):
    return k * n // 2 + 2 * (k // GROUP) * n * 2



@contextlib.contextmanager
def patched(module, key, table):
    old = module.TABLES[key]
    module.TABLES[key] = table
    try:
        yield
    finally:
        module.TABLES[key] = old


def pick_fastest(label, module, key, candidates, run, deadline):
    """Time run() under each candidate table (until the deadline); print them, return the fastest."""
    rows, best = [], (float("inf"), candidates[0][1])
    for desc, table in candidates:
        if time.time() > deadline:
            rows.append([desc, "skipped (deadline)"])
            continue
        try:
            with patched(module, key, table):
                total, parts = run()
        except Exception as e:      # e.g. a tile that needs more shared memory than the chip has
            rows.append([desc, f"failed: {type(e).__name__}: {str(e)[:80]}"])
            torch.cuda.synchronize()
            continue
        rows.append([desc, total * 1e3] + [p * 1e3 for p in parts])
        best = min(best, (total, table), key=lambda b: b[0])
    print_table(f"sweep {label} (us; first column the sum)", ["config", "sum"] + ["part"] * 3, rows)
    return best[1]
