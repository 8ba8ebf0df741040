"""Prometheus metrics in the text exposition format (version 0.0.4), without a client library.

Names follow vLLM's (``vllm:`` prefix, label ``model_name``) so existing Grafana dashboards and
scrape configs work unchanged. Server-side counters and histograms live in a :class:`Metrics`
object owned by the server (no module-level registry); engine gauges (running / waiting requests,
KV usage, prefix-cache and speculative-decoding counters) are read from ``engine.stats()`` at scrape
time and passed to :meth:`Metrics.render`.
"""
from __future__ import annotations

import bisect
import math
import threading
from typing import Any, Iterable, Mapping

PREFIX = "vllm:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Bucket bounds as in vLLM, so histogram_quantile queries read the same.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000)

FINISH_REASONS = ("stop", "length", "abort", "error")

# engine.stats() key -> (metric, type, help). Keys the engine does not report are exported as 0.
ENGINE_GAUGES = {
    "num_running": ("num_requests_running", "Number of requests in model execution batches."),
    "num_waiting": ("num_requests_waiting", "Number of requests waiting to be processed."),
    "kv_cache_usage": ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
}
ENGINE_COUNTERS = {
    "prefix_cache_queries": ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    "prefix_cache_hits": ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    "num_preemptions": ("num_preemptions", "Cumulative number of preemptions from the engine."),
    "spec_decode_num_drafts": ("spec_decode_num_drafts", "Number of spec decoding drafts."),
    "spec_decode_num_draft_tokens": ("spec_decode_num_draft_tokens", "Number of draft tokens."),
    "spec_decode_num_accepted_tokens": ("spec_decode_num_accepted_tokens", "Number of accepted tokens."),
}


# Figures vLLM has no metric for, under our own prefix: the preparation queue (work accepted but not
# yet prepared, which num_requests_waiting cannot see) and the KV blocks by state.
OWN_PREFIX = "catengine:"
OWN_GAUGES = {
    "prep_tasks_waiting": ("prep_queue_tasks", "Preparation tasks (templates, tokenization) queued, not started."),
    "prep_owners_waiting": ("prep_queue_requests", "Requests with preparation tasks queued."),
    "prep_tasks_running": ("prep_queue_running", "Preparation tasks running (one per worker at most)."),
    "prep_workers": ("prep_workers", "Preparation worker threads started (a second starts under load)."),
    "num_kv_blocks": ("kv_cache_blocks", "KV-cache blocks in the pool."),
    "num_free_kv_blocks": ("kv_cache_available_blocks", "KV-cache blocks free or evictable (usable now)."),
    "num_evictable_kv_blocks": ("kv_cache_evictable_blocks",
                                "KV-cache blocks holding a cached prefix that no sequence references (evictable)."),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class Histogram:
    """Cumulative-bucket histogram of one label set."""

    def __init__(self, bounds: Iterable[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        if not math.isfinite(value):
            return
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: Mapping[str, str]) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.bounds + (math.inf,), self.counts):
            running += n
            le = "+Inf" if math.isinf(bound) else _num(bound)
            out.append(f"{name}_bucket{_labels({**labels, 'le': le})} {_num(running)}")
        out.append(f"{name}_count{_labels(labels)} {_num(self.count)}")
        out.append(f"{name}_sum{_labels(labels)} {_num(self.sum)}")
        return out


class Metrics:
    """Request-level metrics recorded by the server; thread-safe (a lock around every update)."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = {reason: 0 for reason in FINISH_REASONS}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.prompt_hist = Histogram(TOKEN_BUCKETS)
        self.generation_hist = Histogram(TOKEN_BUCKETS)

    def observe_first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def observe_token_gap(self, seconds: float, tokens: int = 1) -> None:
        """A delta of ``tokens`` tokens arrived ``seconds`` after the previous one."""
        with self._lock:
            for _ in range(max(tokens, 1)):
                self.itl.observe(seconds / max(tokens, 1))

    def count_tokens(self, prompt_tokens: int = 0, generation_tokens: int = 0) -> None:
        """Tokens as they are processed: a prompt once its prefill is done, each generated token as it
        arrives, so a request that is aborted (or still running) counts what it used."""
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens

    def observe_finished(self, reason: str, prompt_tokens: int, generation_tokens: int,
                         e2e_seconds: float) -> None:
        """One sequence ended (``reason`` stop / length / abort / error): the counts and histograms of
        finished requests (the token totals are :meth:`count_tokens`'s)."""
        with self._lock:
            self.finished[reason if reason in self.finished else "error"] += 1
            self.prompt_hist.observe(prompt_tokens)
            self.generation_hist.observe(generation_tokens)
            self.e2e.observe(e2e_seconds)

    def render(self, engine_stats: Mapping[str, Any] | None = None) -> str:
        """The full exposition text: engine gauges/counters from ``engine_stats`` plus ours."""
        stats = engine_stats or {}
        base = {"model_name": self.model_name}
        out: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[str]) -> None:
            out.append(f"# HELP {PREFIX}{name} {help_text}")
            out.append(f"# TYPE {PREFIX}{name} {kind}")
            out.extend(samples)

        for key, (name, help_text) in ENGINE_GAUGES.items():
            family(name, "gauge", help_text, [f"{PREFIX}{name}{_labels(base)} {_num(float(stats.get(key, 0) or 0))}"])
        for key, (name, help_text) in OWN_GAUGES.items():
            out.append(f"# HELP {OWN_PREFIX}{name} {help_text}")
            out.append(f"# TYPE {OWN_PREFIX}{name} gauge")
            out.append(f"{OWN_PREFIX}{name}{_labels(base)} {_num(float(stats.get(key, 0) or 0))}")
        for key, (name, help_text) in ENGINE_COUNTERS.items():
            value = float(stats.get(key, 0) or 0)
            family(name, "counter", help_text, [f"{PREFIX}{name}_total{_labels(base)} {_num(value)}"])
        per_pos = stats.get("spec_decode_num_accepted_tokens_per_pos") or []
        family("spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted tokens per draft position.",
               [f"{PREFIX}spec_decode_num_accepted_tokens_per_pos_total{_labels({**base, 'position': i})} {_num(n)}"
                for i, n in enumerate(per_pos)])
        with self._lock:
            family("prompt_tokens", "counter", "Number of prefill tokens processed.",
                   [f"{PREFIX}prompt_tokens_total{_labels(base)} {_num(self.prompt_tokens)}"])
            family("generation_tokens", "counter", "Number of generation tokens processed.",
                   [f"{PREFIX}generation_tokens_total{_labels(base)} {_num(self.generation_tokens)}"])
            family("request_success", "counter", "Count of successfully processed requests.",
                   [f"{PREFIX}request_success_total{_labels({**base, 'finished_reason': r})} {_num(n)}"
                    for r, n in self.finished.items()])
            for name, hist, help_text in (
                    ("time_to_first_token_seconds", self.ttft, "Histogram of time to first token in seconds."),
                    ("inter_token_latency_seconds", self.itl, "Histogram of inter-token latency in seconds."),
                    ("e2e_request_latency_seconds", self.e2e, "Histogram of e2e request latency in seconds."),
                    ("request_prompt_tokens", self.prompt_hist, "Number of prefill tokens processed."),
                    ("request_generation_tokens", self.generation_hist, "Number of generation tokens processed.")):
                family(name, "histogram", help_text, hist.lines(PREFIX + name, base))
        return "\n".join(out) + "\n"
