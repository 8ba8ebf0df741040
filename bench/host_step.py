"""Host time of one engine step (scheduler, batch building, sampling bookkeeping, detokenizing, outputs)
with the model call stubbed out: what every decode step costs before and after the GPU work, and what
a CUDA graph cannot remove. Runs on the CPU; a diagnostic, not a comparison table.

    PYTHONPATH=. python3 bench/host_step.py [--batch 1 32] [--tokens 300]

Uses a tiny random Qwen3.5 checkpoint (written once to /tmp) with a 2,048-token vocabulary, so sampling
costs little; prompts of 399 tokens; the best of 3 ``Engine.generate`` runs, divided by the steps.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catengine import Engine, SamplingParams  # noqa: E402


def tiny_checkpoint() -> Path:
    from catengine.tools.tiny_model import write_tiny_model
    path = Path("/tmp/catengine-host-step-model")
    if not (path / "config.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        write_tiny_model(path)
    return path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--tokens", type=int, default=300)
    args = p.parse_args()
    path = tiny_checkpoint()
    print("| batch | host us per step |\n|---|---|")
    for batch in args.batch:
        engine = Engine(str(path), max_model_len=4096, max_num_seqs=max(batch, 1), enable_prefix_caching=False)
        hidden, vocab = engine.model_config.hidden_size, engine.vocab_size
        engine.runner.forward = lambda ids, pos, b: torch.zeros(ids.shape[0], hidden)
        engine.model.compute_logits = lambda h: torch.zeros(h.shape[0], vocab)
        prompts = [list(range(1, 400))] * batch
        params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        engine.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            engine.generate(prompts, params)
            best = min(best, time.perf_counter() - t0)
        print(f"| {batch} | {best / args.tokens * 1e6:.0f} |")


if __name__ == "__main__":
    main()
