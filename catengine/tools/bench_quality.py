"""The ``quality`` section of `catengine bench`: held-out perplexity of the trained demo model per numeric path, so
a change that hurts quality shows as a number (issue 19). Each path is :func:`catengine.tools.perplexity.evaluate_path`
on the demo model's shipped held-out code sample (Python standard-library files the model never saw):

- ``dense float32``: the AWQ weights dequantized to dense, float32 everywhere (the reference of the others);
- ``AWQ float32``: the 4-bit weights through the W4A16 path (the difference from dense is the kernel, not rounding);
- ``AWQ float16`` / ``AWQ bfloat16``: activations in half precision (CUDA; bf16 where the device has it);
- ``AWQ fp8 KV``: float16 (CPU: float32) with the KV cache in fp8 e5m2;
- ``sm_70``: float16 under ``CATENGINE_ARCH=70`` (CUDA only, in a subprocess: the variable is read at import).
"""
from __future__ import annotations

import math

import torch

from .bench_common import print_table


def quality_paths(device: torch.device) -> list[tuple[str, dict]]:
    cuda = device.type == "cuda"
    # the W4A16 kernels run 16-bit activations only, so on a CUDA machine the float32 AWQ row runs on its CPU
    paths = [("dense float32", dict(dtype="float32", dense=True)),
             ("AWQ float32", dict(dtype="float32", device="cpu") if cuda else dict(dtype="float32"))]
    if cuda:
        paths.append(("AWQ float16", dict(dtype="float16")))
        if torch.cuda.is_bf16_supported():
            paths.append(("AWQ bfloat16", dict(dtype="bfloat16")))
    paths.append(("AWQ fp8 KV", dict(dtype="float16" if cuda else "float32", kv_cache_dtype="fp8_e5m2")))
    if cuda:
        paths.append(("sm_70", dict(dtype="float16", env={"CATENGINE_ARCH": "70"})))
    return paths


def quality_report(args, max_tokens: int = 4096) -> dict:
    from .demo import trained_model_path
    from .perplexity import evaluate_path, perplexity_in_subprocess

    path = trained_model_path()
    if path is None:
        return {"error": "the trained demo model (catengine/demo_model) is missing"}
    device = torch.device(args.device)
    res: dict = {"model": str(path), "max_tokens": max_tokens, "paths": {}}
    for name, kw in quality_paths(device):
        env = kw.pop("env", None)
        kw.setdefault("device", str(device))
        kw.update(max_tokens=max_tokens)
        try:
            r = perplexity_in_subprocess(path, env, **kw) if env else evaluate_path(path, **kw)
        except Exception as e:  # noqa: BLE001 - one broken path must not hide the others' numbers
            r = {"error": f"{type(e).__name__}: {e}"}
        res["paths"][name] = r
    ref = res["paths"]["dense float32"].get("loss")
    rows = []
    for name, r in res["paths"].items():
        if "error" in r:
            rows.append([name, r["error"][:60], None, None, None])
            continue
        delta = r["loss"] - ref if ref is not None else math.nan
        r["loss_minus_dense_fp32"] = delta
        rows.append([name, r["ppl"], delta, r["top1"], r["mtp_top1"]])
    print_table(f"demo model held-out perplexity ({max_tokens} tokens of held-out stdlib code)",
                ["path", "ppl", "d loss vs dense fp32", "top-1", "MTP t+2 top-1"], rows)
    return res
