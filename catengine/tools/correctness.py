"""The transformers sections of `catengine bench`: the fp16 baseline and the GPU correctness report (issue 8).

- ``transformers_baseline``: the benchmark's random weights unquantized in fp16 through transformers' ``generate``
  at batch 1, incremental decode TPS by the same formula as ours, and our / its ratio. The model comes from an
  unquantized checkpoint (``write_random_checkpoint(quant=None)``) when the disk holds one next to the AWQ copy;
  otherwise (the 27B is 54 GB in fp16, the GPU machine has 64 GiB of disk) it is built in memory from the same
  per-tensor generators (:func:`catengine.tools.random_checkpoint.make_tensor`), which gives the same values.
- ``correctness_report``: for a random mid-size dense and MoE model, the fp16 catengine model (half the tokens as
  one prefill chunk, the rest one decode step at a time: both kernel paths) vs float32 transformers,
  teacher-forced on random token ids: top-1 agreement and the largest difference of the reference top-1 token's
  logprob; transformers' own fp16 vs float32 is printed beside it as the noise floor.
"""
from __future__ import annotations

import gc
import random
import shutil
import time
from pathlib import Path

import torch

from ..errors import ConfigError
from .bench_common import (BENCH_PRESETS, PEERS, checkpoint, incremental_tps, print_table, random_prompts,
                           sync_device)

TARGET_TOP1, TARGET_LOGPROB = 0.99, 0.15   # issue 8


def _hf_class(moe: bool):
    import transformers
    return transformers.Qwen3_5MoeForCausalLM if moe else transformers.Qwen3_5ForCausalLM


def build_hf_in_memory(spec, device, dtype=torch.float16, seed: int = 0):
    """transformers model with exactly the tensors ``write_random_checkpoint(spec, quant=None, seed=seed,
    device=device)`` would write (unknown or missing names raise)."""
    import transformers

    from .random_checkpoint import build_config, make_tensor, tensor_specs
    text = build_config(spec, dtype=dtype)["text_config"]
    moe = bool(text.get("num_experts"))
    config = (transformers.Qwen3_5MoeTextConfig if moe else transformers.Qwen3_5TextConfig)(**text)
    with torch.device(device):
        model = _hf_class(moe)._from_config(config, dtype=dtype)
    params = dict(model.named_parameters())
    seen = set()
    with torch.no_grad():
        for s in tensor_specs(text):
            name = s.name.replace("model.language_model.", "model.")
            if name not in params or tuple(params[name].shape) != s.shape:
                raise ConfigError(f"transformers has no parameter {name} of shape {s.shape}; the in-memory build "
                                  "does not match this transformers version: free disk for the fp16 checkpoint")
            # the checkpoint's values are fp16-rounded whatever dtype the model runs in
            params[name].copy_(make_tensor(s, seed, device, torch.float16))
            seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise ConfigError(f"in-memory transformers model: no random tensor for {missing[:4]}")
    return model.eval()


def load_hf(preset: str, workdir: Path, device: str, dtype=torch.float16, in_memory: bool | None = None):
    from .random_checkpoint import estimate_checkpoint_bytes
    spec, _ = BENCH_PRESETS[preset]
    if in_memory is None:
        workdir.mkdir(parents=True, exist_ok=True)
        need = estimate_checkpoint_bytes(spec, None)
        in_memory = need * 1.1 > shutil.disk_usage(workdir).free
    if in_memory:
        print(f"{preset}: building the fp16 transformers model in memory (no disk for its checkpoint)", flush=True)
        return build_hf_in_memory(spec, device, dtype)
    path = checkpoint(workdir, preset, None, device)
    moe = isinstance(spec, dict) and bool(spec.get("num_experts")) or "a3b" in preset or "a10b" in preset
    return _hf_class(moe).from_pretrained(path, dtype=dtype).to(device).eval()


def hf_decode_tps(model, prompt_len: int, n: int, reps: int, vocab: int, device) -> float:
    rng = random.Random(1)

    def latencies(new: int) -> list[float]:
        times = []
        for i in range(reps + 1):  # first: warm-up
            ids = torch.tensor(random_prompts(rng, 1, prompt_len, vocab), device=device)
            sync_device(device)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                     min_new_tokens=new, do_sample=False, pad_token_id=0)
            sync_device(device)
            if i:
                times.append(time.perf_counter() - t0)
            assert out.shape[1] == prompt_len + new
        return times
    return incremental_tps(latencies(n), latencies(1), n)


def transformers_baseline(preset: str, workdir: Path, args, sizes, decode_b1: dict | None,
                          in_memory: bool | None = None) -> dict:
    device = torch.device(args.device)
    # fp16 matmuls are emulated on CPU (seconds per token): the CPU smoke run uses float32
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    model = load_hf(preset, workdir, str(device), dtype, in_memory)
    try:
        tps = hf_decode_tps(model, sizes.short_ctx, sizes.hf_tokens, sizes.hf_reps, model.config.vocab_size, device)
    finally:
        del model
        _free()
    ours = decode_b1["short"]["tps"] if decode_b1 else None
    res = {"ctx": sizes.short_ctx, "tokens": sizes.hf_tokens, "dtype": str(dtype).removeprefix("torch."),
           "transformers_fp16_tps": tps, "catengine_tps": ours,
           "ratio": None if ours is None else ours / tps}
    print_table(f"{preset}: transformers {res['dtype']} generate, batch 1, {sizes.short_ctx} context (tok/s)",
                ["transformers", "transformers (issue, 5.17)", "catengine", "catengine / transformers"],
                [[tps, PEERS.get(preset, {}).get("transformers_fp16_b1"), ours, res["ratio"]]])
    return res


# ----------------------------------------------------------------------------- correctness
def compare_logits(ref: torch.Tensor, got: torch.Tensor) -> dict:
    """Top-1 agreement and |logprob difference| of the reference's top-1 token, over positions ([T, V] each)."""
    ref, got = ref.float(), got.float()
    top = ref.argmax(-1, keepdim=True)
    diff = (ref.log_softmax(-1).gather(-1, top) - got.log_softmax(-1).gather(-1, top)).abs()
    return {"top1_agreement": (got.argmax(-1, keepdim=True) == top).float().mean().item(),
            "max_logprob_diff": diff.max().item(), "mean_logprob_diff": diff.mean().item()}


def catengine_logits(path: Path, ids: list[int], device, dtype=torch.float16) -> torch.Tensor:
    """[T, V] float32 logits of our model teacher-forced on ``ids``: one prefill chunk of T // 2, then decode."""
    from ..models import load_model
    from ..models.batch import BatchMetadata
    model = load_model(path, dtype=dtype, device=device, load_mtp=False, progress=False)
    bs = 16
    caches = model.allocate_caches(len(ids) // bs + 2, bs, 1, "auto", device)
    table = list(range(caches.num_blocks))
    chunks = [ids[:len(ids) // 2]] + [[t] for t in ids[len(ids) // 2:]]
    out, done = [], 0
    with torch.no_grad():
        for chunk in chunks:
            q, s = len(chunk), done + len(chunk)
            batch = BatchMetadata.build([q], [s], [table], bs, [0], device=device)
            pos = BatchMetadata.positions([q], [s], device=device)
            hidden = model(torch.tensor(chunk, device=device), pos, batch, caches)
            out.append(model.compute_logits(hidden).float().cpu())
            done = s
    del model, caches
    _free()
    return torch.cat(out)


def correctness_specs(sizes, quick: bool) -> dict[str, dict]:
    if quick:
        return {k: dict(BENCH_PRESETS[f"tiny-{k}"][0], num_hidden_layers=sizes.corr_layers,
                        hidden_size=sizes.corr_hidden) for k in ("dense", "moe")}
    h, layers = sizes.corr_hidden, sizes.corr_layers
    common = dict(hidden_size=h, num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                  linear_num_key_heads=8, linear_num_value_heads=16)
    return {"dense": dict(base="qwen3.5-27b", intermediate_size=3 * h, **common),
            "moe": dict(base="qwen3.6-35b-a3b", num_experts=64, num_experts_per_tok=8, moe_intermediate_size=h // 2,
                        shared_expert_intermediate_size=h // 2, **common)}


def correctness_report(workdir: Path, args, sizes) -> dict:
    device = torch.device(args.device)
    res, rows = {}, []
    for kind, spec in correctness_specs(sizes, args.quick).items():
        path = checkpoint(workdir, f"corr-{kind}-L{sizes.corr_layers}-H{sizes.corr_hidden}", None, str(device),
                          spec=spec)
        vocab = spec.get("vocab_size", 248320)
        ids = random_prompts(random.Random(2), 1, sizes.corr_tokens, vocab)[0]
        ours = catengine_logits(path, ids, device)
        hf = _hf_class(kind == "moe").from_pretrained(path, dtype=torch.float32).to(device).eval()
        with torch.no_grad():
            x = torch.tensor([ids], device=device)
            ref = hf(x).logits[0].float().cpu()
            hf16 = hf.half()(x).logits[0].float().cpu()
        del hf
        _free()
        r = {"tokens": len(ids), "catengine_fp16": compare_logits(ref, ours),
             "transformers_fp16": compare_logits(ref, hf16)}
        c = r["catengine_fp16"]
        r["pass"] = c["top1_agreement"] >= TARGET_TOP1 and c["max_logprob_diff"] <= TARGET_LOGPROB
        res[kind] = r
        for who in ("catengine_fp16", "transformers_fp16"):
            m = r[who]
            rows.append([kind, who, m["top1_agreement"], m["max_logprob_diff"], m["mean_logprob_diff"]])
        print(f"{kind}: " + ", ".join(f"{who} top-1 {r[who]['top1_agreement']:.4f} max |dlogprob| "
                                       f"{r[who]['max_logprob_diff']:.4f}" for who in ("catengine_fp16",
                                                                                         "transformers_fp16")),
              flush=True)   # a run cut short still reports the models it finished
    print_table(f"correctness vs float32 transformers, teacher-forced over {sizes.corr_tokens} tokens "
                f"(targets: top-1 >= {TARGET_TOP1}, max logprob diff <= {TARGET_LOGPROB})",
                ["model", "fp16 run", "top-1 agreement", "max |dlogprob|", "mean |dlogprob|"], rows)
    return res


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
