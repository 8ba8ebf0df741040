"""One dispatch for every op the model calls: the Triton kernel on CUDA, the torch twin elsewhere.

Each Triton module listed in ``TRITON_MODULES`` exports ``TRITON_OPS: dict[name, fn]`` whose
functions have exactly the signature of ``reference.<name>``. A module that does not exist yet is
skipped; one that exists but fails to import raises (a broken kernel must not silently fall back).
``CATENGINE_KERNELS=reference`` forces the twins everywhere (for A/B checks on a GPU).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os

from . import reference

TRITON_MODULES = (
    "catengine.kernels.w4a16",            # issue: Triton kernels I
    # registers w4a16_linear again, after w4a16: large M -> dequantise + cuBLAS, smaller M -> w4a16's kernels
    "catengine.kernels.w4a16_dequant",
    "catengine.kernels.fused_moe",        # issue: Triton kernels I
    "catengine.kernels.moe_route",        # issue: Triton kernels I (routing, split from fused_moe)
    "catengine.kernels.attention",        # issue: Triton kernels II
    "catengine.kernels.kv_store",         # issue: Triton kernels II
    "catengine.kernels.norm_rope",        # issue: Triton kernels II (norms, RoPE, activations)
    "catengine.kernels.sampler",          # issue: Triton kernels II
    "catengine.kernels.conv1d",           # issue: Triton kernels III
    "catengine.kernels.gated_delta_rule",  # issue: Triton kernels III
    "catengine.kernels.gdn_recurrent",    # issue: Triton kernels III (gating + recurrent, split from gated_delta_rule)
)

OP_NAMES = (
    "rms_norm", "gated_rms_norm", "silu_mul", "qk_norm_rope", "store_kv", "paged_attention",
    "causal_conv1d", "causal_conv1d_update", "gdn_gating", "chunk_gated_delta_rule",
    "recurrent_gated_delta_rule", "w4a16_linear", "moe_route", "fused_moe", "sample_tokens",
)


@functools.cache
def triton_ops() -> dict:
    """Name -> Triton implementation, from every listed module that exists."""
    table = {}
    for name in TRITON_MODULES:
        if importlib.util.find_spec(name) is None:
            continue
        module = importlib.import_module(name)
        for op, fn in getattr(module, "TRITON_OPS", {}).items():
            if op not in OP_NAMES:
                raise RuntimeError(f"{name} registers unknown op {op!r}; known ops: {OP_NAMES}")
            table[op] = fn
    return table


def use_triton(device) -> bool:
    return getattr(device, "type", str(device)) == "cuda" and os.environ.get("CATENGINE_KERNELS") != "reference"


def get(op: str, device):
    """The implementation of ``op`` for tensors on ``device``."""
    if use_triton(device):
        fn = triton_ops().get(op)
        if fn is not None:
            return fn
    return getattr(reference, op)


def _make(op: str):
    def dispatch(first, *args, **kwargs):
        return get(op, first.device)(first, *args, **kwargs)
    dispatch.__name__ = op
    dispatch.__doc__ = getattr(reference, op).__doc__
    return dispatch


for _op in OP_NAMES:
    globals()[_op] = _make(_op)

rope_cos_sin_cache = reference.rope_cos_sin_cache
fp16_to_e5m2 = reference.fp16_to_e5m2
e5m2_to_fp16 = reference.e5m2_to_fp16
