"""The KV cache storage names (``EngineConfig.kv_cache_dtype``) and the tensor dtype each one stores.

One vocabulary: ``catengine/config.py`` validates a setting against :data:`KV_CACHE_DTYPES` and the
model maps a name to the dtype of its paged K/V with :func:`kv_cache_torch_dtype`. vLLM's plain "fp8"
means e4m3, which needs sm_89+: it is not offered, and config.py says so when it is asked for.
"""
from __future__ import annotations

import torch

from ..errors import ConfigError

KV_CACHE_DTYPES = ("auto", "fp8_e5m2")


def kv_cache_torch_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The K/V tensors' dtype: the model dtype for "auto", uint8 holding the e5m2 bytes for "fp8_e5m2"
    (the attention kernels convert them)."""
    if name == "auto":
        return model_dtype
    if name == "fp8_e5m2":
        return torch.uint8
    raise ConfigError(f"kv_cache_dtype {name!r} is not supported; use {' or '.join(map(repr, KV_CACHE_DTYPES))}")
