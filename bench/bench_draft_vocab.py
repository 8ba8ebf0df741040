"""The reduced draft vocabulary's effect on acceptance (issue 20): the trained demo model's MTP head drafting over
the whole vocabulary (8,192) or over N ids, chosen two ways: the N lowest ids (the default without a file) and
the N most frequent ids of a count over the first half of the demo model's held-out texts (a draft_vocab_file,
as `python -m catengine.spec.vocab` writes one); the prompts come from the second halves, so the count never
saw them. Greedy tokens are checked equal to the full-vocabulary run. Acceptance length is a property of the
head and the text, so the CPU measures it; the time a smaller draft lm_head saves is bench_mtp.py's (GPU).

Usage: python bench/bench_draft_vocab.py [--k 3] [--tokens 32] [--sizes 4096,2048,1024,512] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from catengine import Engine
from catengine.sampling import SamplingParams
from catengine.spec.vocab import ranked_token_ids
from catengine.tools.demo import trained_model_path

from common import device_header, print_table   # noqa: E402  (run from bench/)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--sizes", default="4096,2048,1024,512")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    print(device_header() if args.device.startswith("cuda") else "CPU, float32", flush=True)
    path = trained_model_path()
    texts = [(Path(path) / f).read_text() for f in ("heldout_code.txt", "heldout_chat.txt")]
    base = Engine(model=str(path), device=args.device, max_num_seqs=4)
    ranked = ranked_token_ids(base.tokenizer, [t[:len(t) // 2] for t in texts])
    ids = [base.tokenizer.encode(t[len(t) // 2:len(t) // 2 + 4000]) for t in texts]
    prompts = [ids[0][:64], ids[0][500:564], ids[1][:64], ids[1][500:564]]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    want = [list(r.outputs[0].token_ids) for r in base.generate(prompts, params)]
    vocab = base.vocab_size
    base.close()
    with tempfile.TemporaryDirectory() as tmp:
        counted = Path(tmp) / "ids.json"
        counted.write_text(json.dumps(ranked))
        rows = []
        configs = [("whole vocabulary", vocab, {})]
        for n in (int(s) for s in args.sizes.split(",")):
            configs += [("lowest ids", n, {"draft_vocab_size": n}),
                        ("counted (first halves)", n, {"draft_vocab_size": n, "draft_vocab_file": str(counted)})]
        for label, n, extra in configs:
            e = Engine(model=str(path), device=args.device, max_num_seqs=4,
                       speculative_config={"method": "mtp", "num_speculative_tokens": args.k, **extra})
            got = [list(r.outputs[0].token_ids) for r in e.generate(prompts, params)]
            s = e.stats()
            subset = e.runner.drafter.draft_ids
            inside = set(subset.tolist()) if subset is not None else None
            covered = 1.0 if inside is None else sum(t in inside for o in want for t in o) / sum(map(len, want))
            rows.append([label, n, covered, s["spec_decode_mean_acceptance_length"],
                         s["spec_decode_num_accepted_tokens_per_pos"], "yes" if got == want else "NO"])
            e.close()
    print_table(f"demo model, k = {args.k}, 4 held-out prompts (2 code, 2 chat), {args.tokens} greedy tokens",
                ["draft vocabulary", "N", "output tokens inside it", "mean accept len", "accepted per position",
                 "same tokens"], rows)
    print(f"{len(ranked)} distinct ids in the count", flush=True)


if __name__ == "__main__":
    main()
