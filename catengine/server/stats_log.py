"""vLLM's periodic throughput line, every ``interval`` seconds while the server runs:

    Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 95.1 tokens/s, Running: 4 reqs,
    Waiting: 0 reqs, GPU KV cache usage: 12.5%, Prefix cache hit rate: 40.0%

Rates are the engine's counters (``Engine.stats``: prompt tokens at prefill, every generated token as it is
sampled) over the interval; the hit rate is the interval's prefix-cache hits over its queries (in tokens).
An idle interval (after the first) is logged at DEBUG, so an idle server's console stays quiet (vLLM does the same).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Mapping

log = logging.getLogger("catengine.stats")
DEFAULT_INTERVAL = 10.0


def stats_line(prev: Mapping[str, Any], cur: Mapping[str, Any], seconds: float) -> tuple[str, bool]:
    """(the line, whether anything happened) between two ``Engine.stats()`` snapshots."""
    def delta(key: str) -> float:
        return float(cur.get(key, 0) or 0) - float(prev.get(key, 0) or 0)

    dt = max(seconds, 1e-9)
    prompt, generation = delta("prompt_tokens_total"), delta("generation_tokens_total")
    queries, hits = delta("prefix_cache_queries"), delta("prefix_cache_hits")
    running, waiting = int(cur.get("num_running", 0) or 0), int(cur.get("num_waiting", 0) or 0)
    line = (f"Avg prompt throughput: {prompt / dt:.1f} tokens/s, Avg generation throughput: {generation / dt:.1f} "
            f"tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, "
            f"GPU KV cache usage: {100 * float(cur.get('kv_cache_usage', 0) or 0):.1f}%, "
            f"Prefix cache hit rate: {100 * hits / queries if queries > 0 else 0.0:.1f}%")
    if "spec_decode_num_drafts" in cur:   # speculative decoding on: vLLM's SpecDecoding figures of the interval
        drafts, drafted = delta("spec_decode_num_drafts"), delta("spec_decode_num_draft_tokens")
        accepted = delta("spec_decode_num_accepted_tokens")
        line += (f", Mean acceptance length: {1 + accepted / drafts if drafts else 0.0:.2f}, Draft acceptance rate: "
                 f"{100 * accepted / drafted if drafted else 0.0:.1f}%")
    return line, bool(prompt or generation or running or waiting)


class StatsLogger:
    """A daemon thread that logs :func:`stats_line` of ``ctx.engine_stats()`` every ``interval`` seconds."""

    def __init__(self, ctx: Any, interval: float = DEFAULT_INTERVAL):
        self.ctx = ctx
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="catengine-stats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.interval + 1)

    def _run(self) -> None:
        prev, then, was_active = self.ctx.engine_stats(), time.monotonic(), False
        while not self._stop.wait(self.interval):
            cur, now = self.ctx.engine_stats(), time.monotonic()
            line, active = stats_line(prev, cur, now - then)
            # the first idle interval after work is still shown: it says the load ended
            log.log(logging.INFO if active or was_active else logging.DEBUG, "%s", line)
            prev, then, was_active = cur, now, active
