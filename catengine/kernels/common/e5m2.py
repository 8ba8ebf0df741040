"""fp8 e5m2 KV bytes in torch: the twins of the Triton helpers in :mod:`.e5m2_jit` and the
conversions the attention twins and the engine's fp8 cache use (``ops.fp16_to_e5m2``, ``ops.e5m2_to_fp16``).
"""
from __future__ import annotations

import torch


def fp16_to_e5m2(x):
    """fp16 -> fp8 e5m2 as uint8, round to nearest even, no saturation (overflow -> inf),
    NaN -> 0x7F/0xFF by sign: bit-exact with ``x.to(torch.float8_e5m2)``. Integer ops only, as the
    sm_70 kernel must do (the design notes, ../shared/design/SM70.md)."""
    bits = x.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    mag = bits & 0x7FFF
    rounded = (bits + 0x7F + ((bits >> 8) & 1)) >> 8
    nan = (bits & 0x8000) >> 8 | 0x7F
    return torch.where(mag > 0x7C00, nan, rounded & 0xFF).to(torch.uint8)


def e5m2_to_fp16(b):
    """uint8 e5m2 bytes -> fp16 (exact: e5m2 is the top byte of an fp16)."""
    return (b.to(torch.int32) << 8).to(torch.int16).view(torch.float16)
