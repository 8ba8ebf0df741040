"""MTP speculative decoding on the H200: what a verify step costs and what drafting buys (issue 20).

For each random AWQ model (few layers, to fit the time: the ratios are per step, and every layer type is there)
and batch size, one engine sized for the largest k, greedy requests of random prompts:
- no MTP: drafter off, k = 0 (decode steps replay the CUDA graphs);
- never: a drafter whose k drafts are always wrong: every step verifies k+1 rows and adds one token, so its
  step time over the no-MTP step time is the verify-step cost (issue target <= 1.3x at k = 4, batch 1) and its
  tokens/s the worst-case overhead (target <= 10% slower);
- oracle: drafts exactly the tokens the target produces (the upper bound; target >= 2.5x at k = 4);
- MTP head: the real drafter on the random head (acceptance ~0: the drafting passes' cost on top of "never");
- MTP head, draft vocab N: the same with the draft lm_head over the N lowest ids (``--draft-vocab``), which
  shows what the reduced vocabulary saves per draft pass.
Then the trained demo model (catengine/demo_model, a trained MTP head): its real acceptance length and speed-up.
The last table gives the real MTP head's speed-up per batch size, what --speculative-disable-by-batch-size is
chosen from: drafting should stop above the largest batch where the head still pays (x no-MTP > 1) on real
weights at the acceptance a real checkpoint reaches (the random heads accept nothing, so their rows are the
cost side only; the demo model's rows at batch 1 and 4 the benefit side).

Usage: python bench/bench_mtp.py [--presets qwen3.5-27b,qwen3.6-35b-a3b] [--layers 4] [--batches 1,8]
       [--ks 1,2,3,4] [--tokens 48] [--draft-vocab 32768] [--skip-demo]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from catengine import Engine
from catengine.sampling import SamplingParams
from catengine.spec import MTPDrafter, ScriptedDrafter
from catengine.spec.vocab import draft_vocab_ids

from common import device_header, print_table   # noqa: E402  (run from bench/)


def set_k(engine, k: int, drafter) -> None:
    """Speculate with k drafts from now on (the engine was built for the largest k; nothing is running); the
    verify and draft CUDA graphs are captured again for k (the engine captures them for its own k only)."""
    import dataclasses

    from catengine.spec.draft_graphs import build_draft_graphs
    from catengine.spec.graphs import build_verify_graphs
    engine.scheduler.config = dataclasses.replace(engine.scheduler.config, num_speculative_tokens=k)
    engine.runner.drafter = drafter
    graphs = engine.runner.verify_graphs
    if k and engine.runner.graphs is not None and (graphs is None or graphs.query_len != k + 1):
        engine.runner.verify_graphs = build_verify_graphs(engine.runner, num_drafts=k)
    if k and engine.runner.graphs is not None and isinstance(drafter, MTPDrafter) and (
            drafter.graphs is None or drafter.graphs.num_drafts != k):
        drafter.graphs = build_draft_graphs(engine.runner, drafter, num_drafts=k)


def draft_runs(engine) -> int:
    d = engine.runner.drafter
    return d.graphs.num_runs if isinstance(d, MTPDrafter) and d.graphs is not None else 0


def graph_runs(engine) -> int:
    g = engine.runner.verify_graphs
    return g.num_runs if g is not None else 0


def timed(engine, prompts, params) -> tuple[float, list, dict]:
    torch.cuda.synchronize()
    before = dict(engine.stats())
    t0 = time.perf_counter()
    res = engine.generate(prompts, params)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    after = engine.stats()
    d = {k: after[k] - before.get(k, 0) for k in ("num_steps", "spec_decode_num_drafts",
                                                  "spec_decode_num_accepted_tokens")}
    return dt, res, d


def run_model(path: Path, name: str, batches, ks, tokens: int, draft_vocab: int, speedups: list,
              prompt_len: int = 32) -> None:
    kmax = max(ks)
    engine = Engine(model=str(path), speculative_config={"method": "mtp", "num_speculative_tokens": kmax,
                                                         "disable_by_batch_size": max(batches)},
                    max_num_seqs=max(batches), max_model_len=1024, enable_prefix_caching=False)
    vocab = engine.vocab_size
    mtp = engine.runner.drafter
    small = MTPDrafter(engine.model, engine.runner.device, draft_vocab_ids({"draft_vocab_size": draft_vocab}, vocab,
                                                                          engine.eos_token_ids))
    g = torch.Generator().manual_seed(0)
    for b in batches:
        prompts = [torch.randint(0, vocab, (prompt_len,), generator=g).tolist() for _ in range(b)]
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        set_k(engine, 0, None)
        timed(engine, prompts, params)                       # warm-up: compilation, graphs
        t_base, ref, d_base = timed(engine, prompts, params)
        step_base = t_base / d_base["num_steps"]
        expected = {(tuple(r.prompt_token_ids), 0): list(r.outputs[0].token_ids) for r in ref}
        rows = [["no MTP", 0, b * tokens / t_base, 1.0, 1.0, step_base * 1e3, "-", 0, 0]]
        for k in ks:
            for label, drafter in (("never", ScriptedDrafter(expected, vocab, 0)),
                                   ("oracle", ScriptedDrafter(expected, vocab)), ("MTP head", mtp),
                                   (f"MTP head, draft vocab {draft_vocab}", small)):
                set_k(engine, k, drafter)
                timed(engine, prompts, params)               # warm-up of this shape (verify kernels compile)
                runs, druns = graph_runs(engine), draft_runs(engine)
                t, res, d = timed(engine, prompts, params)
                same = [list(r.outputs[0].token_ids) for r in res] == [list(r.outputs[0].token_ids) for r in ref]
                acc = 1 + d["spec_decode_num_accepted_tokens"] / max(d["spec_decode_num_drafts"], 1)
                rows.append([label, k, b * tokens / t, t_base / t, acc, t / d["num_steps"] * 1e3,
                             "yes" if same else "NO", graph_runs(engine) - runs, draft_runs(engine) - druns])
                if drafter is mtp:
                    speedups.append([name, b, k, t_base / t, acc])
        print_table(f"{name}: batch {b}, {tokens} greedy tokens after a {prompt_len}-token prompt",
                    ["drafter", "k", "tok/s", "x no-MTP", "mean accept len", "ms/step", "same tokens",
                     "verify graph steps", "draft graph steps"], rows)
        never = {r[1]: r[5] for r in rows if r[0] == "never"}
        print_table(f"{name}: verify-step cost over a plain decode step, batch {b} (never-matching drafts)",
                    ["k", "verify ms", "decode ms", "ratio"],
                    [[k, never[k], step_base * 1e3, never[k] / (step_base * 1e3)] for k in ks])
    engine.close()


def run_demo(ks, tokens: int, speedups: list) -> None:
    from catengine.tools.demo import trained_model_path
    path = trained_model_path()
    text = (Path(path) / "heldout_code.txt").read_text()[:4000]
    engine = Engine(model=str(path), speculative_config={"method": "mtp", "num_speculative_tokens": max(ks)},
                    max_num_seqs=8, enable_prefix_caching=False)
    ids = engine.tokenizer.encode(text)
    prompts = [ids[i * 200:i * 200 + 64] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    mtp = engine.runner.drafter
    rows = []
    for b in (1, 4):
        set_k(engine, 0, None)
        timed(engine, prompts[:b], params)
        t_base, ref, _ = timed(engine, prompts[:b], params)
        rows.append([b, 0, b * tokens / t_base, 1.0, 1.0, "-", 0])
        for k in ks:
            set_k(engine, k, mtp)
            timed(engine, prompts[:b], params)
            t, res, d = timed(engine, prompts[:b], params)
            same = sum(list(r.outputs[0].token_ids) == list(q.outputs[0].token_ids) for r, q in zip(res, ref))
            acc = 1 + d["spec_decode_num_accepted_tokens"] / max(d["spec_decode_num_drafts"], 1)
            rows.append([b, k, b * tokens / t, t_base / t, acc, f"{same}/{b}", draft_runs(engine)])
            speedups.append(["demo model (trained head)", b, k, t_base / t, acc])
    print_table(f"demo model (trained MTP head), held-out code prompts, {tokens} greedy tokens",
                ["batch", "k", "tok/s", "x no-MTP", "mean accept len", "same tokens", "draft graph runs (total)"],
                rows)
    engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="qwen3.5-27b,qwen3.6-35b-a3b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--ks", default="1,2,3,4")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--workdir", default="/tmp/catengine-bench-mtp")
    ap.add_argument("--draft-vocab", type=int, default=32768, help="the reduced draft vocabulary's size")
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--demo-only", action="store_true")
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    print(device_header(), flush=True)
    speedups: list = []
    if not args.skip_demo:
        run_demo(ks, args.tokens, speedups)
    if not args.demo_only:
        run_presets(args, batches, ks, speedups)
    print_table("the real MTP head's speed-up per batch size (--speculative-disable-by-batch-size: drafting "
                "stops above the largest batch that still gains)", ["model", "batch", "k", "x no-MTP",
                                                                     "mean accept len"], speedups)


def run_presets(args, batches, ks, speedups) -> None:
    from catengine.tools.random_checkpoint import write_random_checkpoint
    for preset in args.presets.split(","):
        dst = Path(args.workdir) / f"{preset}-L{args.layers}-mtp"
        if not (dst / "config.json").exists():
            t0 = time.perf_counter()
            write_random_checkpoint(dst, preset, quant="awq", mtp=True, num_layers=args.layers, device="cuda",
                                    progress=False)
            print(f"wrote {dst} in {time.perf_counter() - t0:.0f} s", flush=True)
        run_model(dst, f"{preset} random AWQ, {args.layers} layers", batches, ks, args.tokens, args.draft_vocab,
                  speedups)


if __name__ == "__main__":
    main()
