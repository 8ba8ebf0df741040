"""Host time of one engine decode step (scheduler, batch building, sampling bookkeeping, detokenizing, outputs)
with the model call stubbed out: what every decode step costs the host, and what a CUDA graph cannot remove.
Runs on the CPU; a diagnostic, not a comparison table.

    PYTHONPATH=. python3 bench/host_step.py [--batch 1 8 32] [--steps 200] [--repeats 5] [--profile 32]

Uses a tiny random Qwen3.5 checkpoint (written once to /tmp) with a 2,048-token vocabulary, so sampling
costs little; ``batch`` requests of 399-token prompts (greedy, ignore_eos, streamed through ``Engine.step``
as bench/bench_async_host.py drives the GPU engine) are prefilled, then ``steps`` decode steps are timed with
async scheduling off and on (``engine.step_loop.overlap``), the best of ``repeats`` runs kept: the CPU is
shared, so single runs are noisy. ``--deltas`` steps with ``Engine.step_deltas`` (the server's loop) instead
of ``Engine.step``'s cumulative outputs. ``--profile B`` prints a cProfile of the async (``--sync``: synchronous)
decode steps at batch B.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
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


def decoding_engine(path: Path, batch: int, max_tokens: int) -> Engine:
    """An engine with the model stubbed (zero hidden states and logits: greedy picks token 0), decode steps
    through the graph runner's buffers, and ``batch`` requests past their prefill."""
    engine = Engine(str(path), max_model_len=4096, max_num_seqs=max(batch, 1), enable_prefix_caching=False)
    hidden, vocab = engine.model_config.hidden_size, engine.vocab_size
    engine.runner.forward = lambda ids, pos, b: torch.zeros(ids.shape[0], hidden)
    engine.model.compute_logits = lambda h: torch.zeros(h.shape[0], vocab)
    # decode steps through the CUDA-graph runner's static buffers (run eagerly, the model stubbed there too),
    # as on the GPU: its input building is host work of every decode step
    engine.runner.enable_decode_graphs(capture=False)
    engine.runner.graphs._forward = lambda size: torch.zeros(size, hidden)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", list(range(1 + i, 400 + i)), params)
    while engine.stats()["num_waiting"] or any(s.num_computed < len(s.token_ids) - 1 for s in engine.scheduler.running):
        engine.step()
    return engine


def us_per_step(engine: Engine, steps: int, deltas: bool = False) -> float:
    step = engine.step_deltas if deltas else engine.step
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", type=int, default=None, help="cProfile the decode steps at this batch")
    p.add_argument("--sync", action="store_true", help="profile with async scheduling off")
    p.add_argument("--deltas", action="store_true", help="step with Engine.step_deltas (the server's) instead of "
                   "Engine.step (cumulative outputs, what bench_async_host.py times)")
    args = p.parse_args()
    # the stub's tensors are tiny: one thread, so that the shared CPU's thread-pool wake-ups do not dominate
    torch.set_num_threads(1)
    path = tiny_checkpoint()
    budget = 2 * args.steps * args.repeats + 50
    if args.profile is not None:
        engine = decoding_engine(path, args.profile, budget)
        engine.step_loop.overlap = not args.sync
        prof = cProfile.Profile()
        prof.runcall(us_per_step, engine, args.steps, args.deltas)
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        pstats.Stats(prof).sort_stats("cumtime").print_stats(40)
        return
    print("| batch | sync host us/step | async host us/step |\n|---|---|---|")
    for batch in args.batch:
        engine = decoding_engine(path, batch, budget)
        best = {False: float("inf"), True: float("inf")}
        for _ in range(args.repeats):
            for overlap in (False, True):
                engine.step_loop.overlap = overlap
                best[overlap] = min(best[overlap], us_per_step(engine, args.steps, args.deltas))
        engine.close()
        print(f"| {batch} | {best[False]:.0f} | {best[True]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
