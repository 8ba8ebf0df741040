"""Torch twin of the W4A16 linear (and of the dequantisation behind its large-M path); the oracle in
tests and the engine's CPU path.

Each function has exactly the signature of the Triton implementation that replaces it on CUDA
(``catengine.kernels.ops`` picks one or the other); shapes use the letters of the package docstring
(:mod:`catengine.kernels`). Unless said otherwise, outputs have the dtype of the main input and math is
done in fp32.
"""
from __future__ import annotations

import torch

from .packing import QuantizedWeight, dequantize


def w4a16_linear(x, weight: QuantizedWeight, bias=None):
    """x: [M, K] @ dequantized weight [K, N] (+ bias [N]) -> [M, N] in x.dtype, fp32 accumulation.
    See :mod:`catengine.kernels.w4a16.packing` for the weight layout."""
    y = x.float() @ dequantize(weight, torch.float32)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def w4a16_dequantize(weight: QuantizedWeight, dtype=None):
    """The dense [K, N] weight (x @ w layout) in ``dtype`` (default the scales' dtype): (q - z) * s in
    fp32, rounded once. Twin of the dequantise kernel behind large-M ``w4a16_linear`` on CUDA."""
    return dequantize(weight, dtype)
