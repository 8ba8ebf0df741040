"""The ``mtp`` section of `catengine bench`: MTP speculative decoding on the trained demo model (the one
checkpoint here with a trained MTP head): tokens/s without and with k drafts, the mean acceptance length (tokens a
verify step adds per draft round, vLLM's figure) and whether the greedy tokens are the same."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from .bench_common import print_table, sync_device


def mtp_report(args, ks=(1, 2, 3, 4), tokens: int = 64, batches=(1, 4)) -> dict:
    import dataclasses

    from ..engine import Engine
    from ..sampling import SamplingParams
    from .demo import trained_model_path

    path = trained_model_path()
    if path is None:
        return {"error": "the trained demo model (catengine/demo_model) is missing"}
    engine = Engine(model=str(path), device=args.device, speculative_config={
        "method": "mtp", "num_speculative_tokens": max(ks)}, max_num_seqs=max(batches), enable_prefix_caching=False)
    ids = engine.tokenizer.encode((Path(path) / "heldout_code.txt").read_text()[:8000])
    prompts = [ids[i * 300:i * 300 + 64] for i in range(max(batches))]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    drafter = engine.runner.drafter

    def run(k: int, b: int):
        # one engine sized for the largest k; k = 0 switches the drafter off (nothing is running in between)
        engine.scheduler.config = dataclasses.replace(engine.scheduler.config, num_speculative_tokens=k)
        engine.runner.drafter = drafter if k else None
        engine.generate(prompts[:b], params)   # warm-up of the shapes
        before = engine.stats()
        sync_device(engine.device)
        t0 = time.perf_counter()
        res = engine.generate(prompts[:b], params)
        sync_device(engine.device)
        dt, after = time.perf_counter() - t0, engine.stats()
        drafts = after["spec_decode_num_drafts"] - before["spec_decode_num_drafts"]
        acc = after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
        return b * tokens / dt, 1 + acc / drafts if drafts else 1.0, [list(r.outputs[0].token_ids) for r in res]

    out: dict = {"model": str(path), "tokens": tokens, "runs": []}
    rows = []
    try:
        for b in batches:
            base_tps, _, base_ids = run(0, b)
            rows.append([b, 0, base_tps, 1.0, 1.0, "-"])
            for k in ks:
                tps, accept, got = run(k, b)
                same = got == base_ids
                out["runs"].append({"batch": b, "k": k, "tps": tps, "no_mtp_tps": base_tps,
                                    "mean_acceptance_length": accept, "same_tokens": same})
                rows.append([b, k, tps, tps / base_tps, accept, "yes" if same else "NO"])
    finally:
        engine.close()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print_table(f"MTP speculative decoding, demo model, held-out code prompts, {tokens} greedy tokens",
                ["batch", "k", "tok/s", "x no MTP", "mean acceptance length", "same tokens"], rows)
    return out
