"""The reduced draft vocabulary: the MTP drafter's lm_head over N token ids instead of the whole vocabulary
(speculative_config ``"draft_vocab_size": N``). A draft outside the subset is never proposed, which lowers
acceptance only where the target would have produced a rare token; verification still uses the full lm_head,
so the output is unchanged. The draft lm_head then reads N rows instead of V (248K for Qwen3.5/3.6), the
larger part of a draft pass on a small batch.

Which N: ``"draft_vocab_file"``, a file of token ids most frequent first (whitespace- or comma-separated,
or a JSON list; ``python -m catengine.spec.vocab`` writes one from texts of the user's traffic), its first N;
without a file, the N lowest ids: byte-level BPE numbers its tokens in merge order, and a merge is learned
because the pair is frequent in the tokenizer's training corpus, so low ids are the common tokens of that
corpus (the bytes, frequent short pieces). The EOS ids are always in (a draft that ends a sequence is cheap to
get right). bench/NOTES.md has the measured acceptance with both.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from ..errors import ConfigError


def read_ids(path) -> list[int]:
    text = Path(path).read_text()
    try:
        ids = json.loads(text) if text.lstrip().startswith("[") else [int(t) for t in text.replace(",", " ").split()]
    except (ValueError, OSError) as e:
        raise ConfigError(f"speculative_config draft_vocab_file {path}: expected token ids (a JSON list or integers "
                          f"separated by spaces, commas or newlines), most frequent first: {e}") from None
    return [int(i) for i in ids]


def draft_vocab_ids(spec: dict | None, vocab_size: int, eos_token_ids=()) -> torch.Tensor | None:
    """The sorted int64 token ids the draft lm_head scores, or None for the whole vocabulary."""
    n = (spec or {}).get("draft_vocab_size")
    if not n or n >= vocab_size:
        return None
    path = spec.get("draft_vocab_file")
    chosen: dict[int, None] = {}   # insertion-ordered set
    if path is not None:
        try:
            ranked = read_ids(path)
        except OSError as e:
            raise ConfigError(f"speculative_config draft_vocab_file {path} cannot be read ({e}); give a file of "
                              f"token ids, e.g. from python -m catengine.spec.vocab") from None
        bad = [i for i in ranked if not 0 <= i < vocab_size]
        if bad:
            raise ConfigError(f"speculative_config draft_vocab_file {path} has ids outside the vocabulary "
                              f"[0, {vocab_size}): {bad[:5]}")
        for i in ranked:
            if len(chosen) == n:
                break
            chosen.setdefault(i)
    for i in range(vocab_size):   # the lowest ids (all of N without a file; the rest of a short file)
        if len(chosen) == n:
            break
        chosen.setdefault(i)
    for i in eos_token_ids:
        if 0 <= i < vocab_size:
            chosen.setdefault(i)
    return torch.tensor(sorted(chosen), dtype=torch.int64)


def ranked_token_ids(tokenizer, texts) -> list[int]:
    """Token ids of ``texts`` by count, most frequent first (ties: lower id first)."""
    counts = Counter()
    for text in texts:
        counts.update(tokenizer.encode(text))
    return sorted(counts, key=lambda i: (-counts[i], i))


def main(argv=None) -> None:
    import argparse

    from ..tokenizer import Tokenizer
    ap = argparse.ArgumentParser(description="write a draft_vocab_file: the token ids of texts, most frequent first")
    ap.add_argument("--model", required=True, help="the checkpoint (its tokenizer)")
    ap.add_argument("--out", required=True)
    ap.add_argument("texts", nargs="+", help="text files like the traffic the engine will serve")
    args = ap.parse_args(argv)
    tok = Tokenizer(args.model)
    ids = ranked_token_ids(tok, [Path(t).read_text() for t in args.texts])
    Path(args.out).write_text(json.dumps(ids))
    print(f"wrote {len(ids)} token ids to {args.out}")


if __name__ == "__main__":
    main()
