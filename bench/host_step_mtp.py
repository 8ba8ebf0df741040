"""Host time of one speculative step with the model stubbed out (bench/host_step.py's method for verify steps):
what a verify step costs the CPU beyond a decode step (drafting bookkeeping, the verify tables, acceptance,
the kept rows), which a short GPU step exposes. Runs on the CPU; a diagnostic, not a comparison table.

    PYTHONPATH=. python3 bench/host_step_mtp.py [--batch 1 8] [--k 4] [--tokens 200]

The graphs run with capture=False on stubbed forwards: the decode and verify graphs return zero hidden rows,
the draft graph and the eager passes drafts of token 1, and the lm_head zero logits (target token 0), so every draft is rejected
and every verify step adds one token: the rows "decode" and "verify" take the same number of steps.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catengine import Engine, SamplingParams  # noqa: E402
from catengine.spec.draft_graphs import build_draft_graphs  # noqa: E402
from catengine.spec.graphs import build_verify_graphs  # noqa: E402
from tests.spec.helpers import write_tiny_mtp_model  # noqa: E402


def stubbed(path: Path, batch: int, k: int) -> Engine:
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    e = Engine(str(path), device="cpu", max_model_len=2048, max_num_seqs=max(batch, 1), enable_prefix_caching=False,
               speculative_config=spec, cuda_graph_sizes=(1, 2, 4, 8, 16, 32))
    hidden, vocab = e.model_config.hidden_size, e.vocab_size
    e.runner.enable_decode_graphs(capture=False)
    e.runner.graphs._forward = lambda size: torch.zeros(size, hidden)
    e.runner.forward = lambda ids, pos, b: torch.zeros(ids.shape[0], hidden)   # prefill
    e.model.compute_logits = lambda h: torch.zeros(h.shape[0], vocab)
    if k:
        e.runner.verify_graphs = v = build_verify_graphs(e.runner, capture=False)
        v._forward = lambda size: torch.zeros(size * (k + 1), hidden)
        d = e.runner.drafter
        d.graphs = g = build_draft_graphs(e.runner, d, capture=False)
        g._forward = lambda size: torch.ones(size, k, dtype=torch.int64)
        d.greedy = lambda h: torch.ones(h.shape[0], dtype=torch.int64)   # the eager passes' drafts too
        e.model.mtp_forward = lambda ids, pos, h, batch, caches: torch.zeros(ids.shape[0], hidden)   # eager passes
    return e


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--tokens", type=int, default=200)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_mtp_model(Path(tmp))
        print("| batch | decode step, host us | verify step (k = %d), host us | ratio |\n|---|---|---|---|" % args.k)
        for batch in args.batch:
            us = []
            for k in (0, args.k):
                e = stubbed(path, batch, k)
                prompts = [list(range(1, 200))] * batch
                params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
                e.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
                best = float("inf")
                for _ in range(5):
                    steps = e.stats()["num_steps"]
                    t0 = time.perf_counter()
                    e.generate(prompts, params)
                    best = min(best, (time.perf_counter() - t0) / (e.stats()["num_steps"] - steps))
                us.append(best * 1e6)
                if k:
                    s = e.stats()
                    assert s["spec_decode_num_drafts"] > 0 and s["spec_decode_num_accepted_tokens"] == 0
                    assert e.runner.drafter.graphs.num_runs > 0
            print(f"| {batch} | {us[0]:.0f} | {us[1]:.0f} | {us[1] / us[0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
