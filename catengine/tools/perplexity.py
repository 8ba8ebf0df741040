"""Held-out perplexity of a model through catengine's own model code, per numeric path: weights as stored (AWQ
4-bit through the W4A16 kernels) or dequantized to dense, activations in float32/float16/bfloat16, the KV cache in
the model dtype or fp8 e5m2. The sm_70 path is the same code under ``CATENGINE_ARCH=70`` (read at import, so
:func:`perplexity_in_subprocess` runs it in a fresh interpreter).

Windows of ``window`` tokens are fed in prefill chunks of ``chunk`` tokens through a paged KV cache and GDN state
slots, as the engine would: later chunks read the earlier ones' K/V from the cache, so an fp8 KV cache shows in the
number. With an MTP head, the head runs over the same chunks (token t+1 and the main model's hidden at t) and
its t+2 top-1 accuracy is reported too.

CLI: ``python -m catengine.tools.perplexity MODEL [--dtype float16] [--kv-cache-dtype fp8_e5m2] [--dense]``
prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import CatEngineError, ConfigError

HELD_OUT_FILES = ("heldout_code.txt", "heldout_chat.txt")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def held_out_text(model_path, name: str = "heldout_code.txt") -> str:
    p = Path(model_path) / name
    if not p.is_file():
        raise ConfigError(f"{model_path} has no {name}; held-out perplexity needs a model trained by "
                          "catengine.tools.train_demo (it writes the held-out samples next to the weights)")
    return p.read_text(encoding="utf-8")


def _dense_weights(weights):
    """AWQ QuantizedWeights dequantized to dense [out, in] float32: the same rounded values without the 4-bit GEMM."""
    from ..kernels.w4a16.packing import QuantizedWeight, dequantize
    for name, v in weights:
        yield name, (dequantize(v, torch.float32).transpose(-1, -2).contiguous() if isinstance(v, QuantizedWeight)
                     else v)


def load(model_path, dtype: torch.dtype, device, dense: bool = False):
    from ..models import ModelConfig, model_class
    from ..models.loader import iter_checkpoint, list_tensors

    config = ModelConfig.from_pretrained(model_path)
    with_mtp = any(t.name.startswith("mtp.") for t in list_tensors(model_path))
    model = model_class(config.architecture)(config, dtype, device, with_mtp=with_mtp)
    weights = iter_checkpoint(model_path, config, device="cpu", dtype=dtype, progress=False)
    if dense:
        from dataclasses import replace
        model = model_class(config.architecture)(replace(config, quant=None), dtype, device, with_mtp=with_mtp)
        weights = _dense_weights(weights)
    model.load_weights(weights)
    return model


@torch.no_grad()
def perplexity(model, token_ids: list[int], *, window: int = 512, chunk: int = 256, max_tokens: int = 4096,
               kv_cache_dtype: str = "auto", block_size: int = 16) -> dict:
    """Mean next-token cross-entropy (and exp of it), top-1 accuracy and the MTP head's t+2 top-1 accuracy over
    the first ``max_tokens`` tokens of ``token_ids``, in independent windows of ``window`` tokens."""
    from ..models.batch import BatchMetadata

    if window % block_size or chunk <= 0:
        raise ConfigError(f"window ({window}) must be a multiple of block_size ({block_size}), chunk positive")
    device = model.device
    ids_all = torch.tensor(token_ids[: max_tokens + 1], dtype=torch.long)
    n_blocks = window // block_size
    caches = model.allocate_caches(n_blocks + 1, block_size, 1, kv_cache_dtype)
    table = list(range(n_blocks))
    nll, n, top1, mtp_hit, mtp_n = 0.0, 0, 0, 0, 0
    for start in range(0, ids_all.numel() - 1, window):
        ids = ids_all[start:start + window + 1]
        if ids.numel() < 3:
            break
        inp, tgt = ids[:-1].to(device), ids[1:].to(device)
        L = inp.numel()
        hidden = []
        for s in range(0, L, chunk):
            e = min(L, s + chunk)
            batch = BatchMetadata.build([e - s], [e], [table], block_size, [0], device=device)
            pos = BatchMetadata.positions([e - s], [e], device=device)
            h = model(inp[s:e], pos, batch, caches)
            hidden.append(h)
            logits = model.compute_logits(h)
            nll += F.cross_entropy(logits, tgt[s:e], reduction="sum").item()
            top1 += (logits.argmax(-1) == tgt[s:e]).sum().item()
            n += e - s
        if model.mtp is not None:
            h_all = torch.cat(hidden)
            M = L - 1  # position t reads token t+1 and predicts token t+2 (= tgt[t+1])
            for s in range(0, M, chunk):
                e = min(M, s + chunk)
                batch = BatchMetadata.build([e - s], [e], [table], block_size, [0], device=device)
                pos = BatchMetadata.positions([e - s], [e], device=device)
                hm = model.mtp_forward(inp[s + 1:e + 1], pos, h_all[s:e], batch, caches)
                mtp_hit += (model.compute_logits(hm).argmax(-1) == tgt[s + 1:e + 1]).sum().item()
                mtp_n += e - s
    if n == 0:
        raise ConfigError("the held-out text is shorter than 3 tokens")
    loss = nll / n
    return {"tokens": n, "loss": loss, "ppl": math.exp(loss), "top1": top1 / n,
            "mtp_top1": mtp_hit / mtp_n if mtp_n else None}


def encode(model_path, text: str) -> list[int]:
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(Path(model_path) / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def evaluate_path(model_path, *, dtype: str = "float32", device="cpu", kv_cache_dtype: str = "auto",
                  dense: bool = False, text_file: str = "heldout_code.txt", **kw) -> dict:
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r}: use one of {sorted(DTYPES)}")
    model = load(model_path, DTYPES[dtype], torch.device(device), dense=dense)
    res = perplexity(model, encode(model_path, held_out_text(model_path, text_file)),
                     kv_cache_dtype=kv_cache_dtype, **kw)
    return {"dtype": dtype, "kv_cache_dtype": kv_cache_dtype, "weights": "dense" if dense else "as stored",
            "device": str(device), **res}


def perplexity_in_subprocess(model_path, env: dict[str, str], **kw) -> dict:
    """:func:`evaluate_path` in a fresh interpreter with ``env`` added (e.g. CATENGINE_ARCH=70, read at import)."""
    args = [sys.executable, "-m", "catengine.tools.perplexity", str(model_path)]
    for k, v in kw.items():
        if isinstance(v, bool):
            args += [f"--{k.replace('_', '-')}"] if v else []
        else:
            args += [f"--{k.replace('_', '-')}", str(v)]
    r = subprocess.run(args, env={**os.environ, **env}, capture_output=True, text=True)
    if r.returncode:
        raise CatEngineError(f"perplexity subprocess failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m catengine.tools.perplexity", description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--dense", action="store_true", help="dequantize 4-bit weights to dense first")
    ap.add_argument("--text-file", default="heldout_code.txt", choices=HELD_OUT_FILES)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=256)
    a = ap.parse_args(argv)
    try:
        res = evaluate_path(a.model, dtype=a.dtype, device=a.device, kv_cache_dtype=a.kv_cache_dtype, dense=a.dense,
                            text_file=a.text_file, max_tokens=a.max_tokens, window=a.window, chunk=a.chunk)
    except CatEngineError as e:
        print(f"perplexity: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
