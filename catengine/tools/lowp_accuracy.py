"""Teacher-forced accuracy cost of a 16-bit GDN recurrent state (``mamba_ssm_cache_dtype``) and of the int8
lm_head (``quantize_lm_head``), each against the float32 state and the stored lm_head on the same weights.

B windows of held-out text run side by side: a prompt of ``prompt`` tokens is prefilled, then every further
token is fed one decode step at a time (the recurrent kernel reads and writes the state slot each token, which
is where a 16-bit state is rounded: the chunked prefill carries its state in fp32 registers and stores it once
at the end of a step). All variants step in lockstep on their own caches, so each position's next-token
distribution is compared with the reference's at once (nothing [tokens, V] is kept). Per variant:
mean / max |delta log p(target)|, mean KL(ref || variant), top-1 agreement with the reference, and the mean
|delta log p| over the first and the last quarter of the decoded positions (a state error that accumulates
shows as a growing second number).

CLI: ``python -m catengine.tools.lowp_accuracy [MODEL] [--device cuda --dtype float16] [--windows 8 --len 512]``
(MODEL defaults to the trained demo model); prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from ..errors import CatEngineError, ConfigError

STATE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class _Run:
    """One variant: its own caches (state dtype) and logits function (lm_head form) over B sequences."""

    def __init__(self, model, b: int, length: int, ssm_dtype: torch.dtype, lm_head_int8, block_size: int):
        self.model, self.bs, self.int8 = model, block_size, lm_head_int8
        nblk = -(-length // block_size)
        self.caches = model.allocate_caches(b * nblk + 1, block_size, b, "auto", model.device, ssm_dtype=ssm_dtype)
        self.tables = [list(range(i * nblk, (i + 1) * nblk)) for i in range(b)]

    def logits(self, h):
        from ..kernels import ops
        return ops.w8a16_linear(h, *self.int8) if self.int8 is not None else self.model.compute_logits(h)

    def step(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """ids [B, n] at positions start..start+n-1 -> log-probs [B, V] of each sequence's last token."""
        from ..models.batch import BatchMetadata
        b, n = ids.shape
        dev = self.model.device
        batch = BatchMetadata.build([n] * b, [start + n] * b, self.tables, self.bs, list(range(b)), device=dev)
        pos = BatchMetadata.positions([n] * b, [start + n] * b, device=dev)
        h = self.model(ids.reshape(-1).to(dev), pos, batch, self.caches)
        return torch.log_softmax(self.logits(h.view(b, n, -1)[:, -1]).float(), -1)


@torch.no_grad()
def compare(model, windows: torch.Tensor, prompt: int, variants: dict[str, tuple[str, bool]],
            block_size: int = 16) -> dict:
    """windows [B, L] token ids; variants: name -> (state dtype name, int8 lm_head). The reference is
    ("float32", False). Returns {name: stats} (see the module docstring)."""
    from ..kernels.w8a16.naive import quantize_per_channel
    b, length = windows.shape
    if not 0 < prompt < length - 1:
        raise ConfigError(f"prompt ({prompt}) must be in 1..{length - 2} for windows of {length} tokens")
    q = quantize_per_channel(model.lm_head, model.dtype) if any(v[1] for v in variants.values()) else None
    ref = _Run(model, b, length, torch.float32, None, block_size)
    runs = {name: _Run(model, b, length, STATE_DTYPES[sd], q if i8 else None, block_size)
            for name, (sd, i8) in variants.items()}
    n_dec = length - prompt
    acc = {name: {"dlp": [], "kl": 0.0, "agree": 0, "nll": 0.0} for name in runs}
    nll_ref = 0.0
    for t in range(n_dec):
        # step 0 prefills the prompt; step t feeds token prompt + t - 1; each predicts token prompt + t
        start = 0 if t == 0 else prompt + t - 1
        ids = windows[:, :prompt] if t == 0 else windows[:, start:start + 1]
        tgt = windows[:, prompt + t:prompt + t + 1].to(model.device)
        lp_ref = ref.step(ids, start)
        nll_ref -= lp_ref.gather(1, tgt).sum().item()
        top_ref = lp_ref.argmax(-1)
        for name, run in runs.items():
            lp = run.step(ids, start)
            a = acc[name]
            a["dlp"].append((lp.gather(1, tgt) - lp_ref.gather(1, tgt)).abs().squeeze(1).cpu())
            a["kl"] += (lp_ref.exp() * (lp_ref - lp)).sum().item()
            a["agree"] += (lp.argmax(-1) == top_ref).sum().item()
            a["nll"] -= lp.gather(1, tgt).sum().item()
    n = n_dec
    quarter = max(1, n // 4)
    out = {"windows": b, "prompt": prompt, "decoded_per_window": n, "ref_nll": nll_ref / (n * b)}
    for name, a in acc.items():
        d = torch.stack(a["dlp"])   # [positions, B]
        out[name] = {"mean_abs_dlogp": d.mean().item(), "max_abs_dlogp": d.max().item(),
                     "mean_kl": a["kl"] / (n * b), "top1_agree": a["agree"] / (n * b),
                     "dnll": (a["nll"] - nll_ref) / (n * b),
                     "first_quarter_dlogp": d[:quarter].mean().item(), "last_quarter_dlogp": d[-quarter:].mean().item()}
    return out


def held_out_windows(model_path, b: int, length: int) -> torch.Tensor:
    """B windows of the model's held-out text; a random checkpoint (the demo tokenizer, no held-out file)
    reads the trained demo model's."""
    from pathlib import Path

    from .demo import serving_model_path
    from .perplexity import encode, held_out_text
    text_dir = model_path if (Path(model_path) / "heldout_code.txt").is_file() else serving_model_path()
    ids = encode(model_path, held_out_text(text_dir))
    if len(ids) < b * length:
        raise ConfigError(f"the held-out text has {len(ids)} tokens; {b} windows of {length} need {b * length}")
    return torch.tensor(ids[: b * length], dtype=torch.long).view(b, length)


DEFAULT_VARIANTS = {"state_float16": ("float16", False), "state_bfloat16": ("bfloat16", False),
                    "lm_head_int8": ("float32", True), "state_float16+lm_head_int8": ("float16", True)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m catengine.tools.lowp_accuracy", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="model directory (default: the trained demo model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=sorted(STATE_DTYPES))
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--len", type=int, default=256, dest="length")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--no-bf16", action="store_true", help="skip the bfloat16 state (sm_70)")
    a = ap.parse_args(argv)
    try:
        from .demo import serving_model_path
        from .perplexity import load
        path = a.model or serving_model_path()
        model = load(path, STATE_DTYPES[a.dtype], torch.device(a.device))
        variants = {k: v for k, v in DEFAULT_VARIANTS.items() if not (a.no_bf16 and v[0] == "bfloat16")}
        res = compare(model, held_out_windows(path, a.windows, a.length), a.prompt, variants)
    except CatEngineError as e:
        print(f"lowp_accuracy: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"model": str(path), "dtype": a.dtype, "device": a.device, **res}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
