"""The canonical W4A16 weight container shared by the loader, the models and the kernels.

Layout (chosen so one 32-bit load gives a thread eight consecutive K values of one column,
which is what both the GEMV and the GEMM kernels want, and so experts stack along dim 0):

- ``qweight``: int32 ``[K // 8, N]``; nibble ``i`` (bits ``4i .. 4i+3``) of ``qweight[r, n]`` is the
  4-bit code ``q[8r + i, n]`` in 0..15.
- ``scales``: ``[K // G, N]`` in the activation dtype (fp16/bf16/fp32).
- ``zeros``: ``[K // G, N]`` same dtype as scales, the zero point as a float holding an integer 0..15
  (8 for symmetric formats).
- the weight value is ``w[k, n] = (q[k, n] - zeros[k // G, n]) * scales[k // G, n]`` and the layer
  computes ``y = x @ w`` (x: ``[M, K]``), i.e. ``w`` is the transpose of torch's ``Linear.weight``.

Stacked MoE experts add a leading ``E`` dimension to all three tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class QuantizedWeight:
    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    # int32 scratch of the GEMV's in-kernel split-K reduce (kernels/w4a16/gemm.py), allocated there on first use
    split_counters: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def in_features(self) -> int:
        return self.qweight.shape[-2] * 8

    @property
    def out_features(self) -> int:
        return self.qweight.shape[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    def to(self, device=None, dtype=None) -> "QuantizedWeight":
        return QuantizedWeight(
            self.qweight.to(device),
            self.scales.to(device=device, dtype=dtype),
            self.zeros.to(device=device, dtype=dtype),
            self.group_size,
        )


def pack_int4_along_k(q: torch.Tensor) -> torch.Tensor:
    """``q``: integer codes 0..15, ``[..., K, N]`` -> int32 ``[..., K // 8, N]`` (nibble i = row 8r+i)."""
    *lead, k, n = q.shape
    if k % 8:
        raise ValueError(f"input dimension {k} must be a multiple of 8 to pack 4-bit weights")
    q = q.to(torch.int64).reshape(*lead, k // 8, 8, n)
    shifts = (torch.arange(8, device=q.device, dtype=torch.int64) * 4).view(8, 1)
    packed = (q << shifts).sum(dim=-2)
    # values up to 2^32 - 1 must wrap into int32
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)
    return packed.to(torch.int32)


def unpack_int4_along_k(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4_along_k`: int32 ``[..., K // 8, N]`` -> int32 codes ``[..., K, N]``."""
    *lead, k8, n = packed.shape
    shifts = (torch.arange(8, device=packed.device, dtype=torch.int32) * 4).view(8, 1)
    q = (packed.unsqueeze(-2) >> shifts) & 0xF  # [..., K//8, 8, N]
    return q.reshape(*lead, k8 * 8, n)


def dequantize(w: QuantizedWeight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``[..., K, N]`` dense weight (x @ w layout) in ``dtype`` (default: the scales' dtype)."""
    q = unpack_int4_along_k(w.qweight).to(torch.float32)
    s = w.scales.to(torch.float32).repeat_interleave(w.group_size, dim=-2)
    z = w.zeros.to(torch.float32).repeat_interleave(w.group_size, dim=-2)
    return ((q - z) * s).to(dtype or w.scales.dtype)
