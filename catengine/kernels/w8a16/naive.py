"""Torch twin of the W8A16 linear and the per-output-channel int8 quantiser it reads."""
from __future__ import annotations

import torch

INT8_MAX = 127
# the smallest scale kept: an all-zero row would otherwise divide by zero, and fp16 rounds scales below
# 2^-24 to zero (the row's int8 values are then 0 whichever scale it gets)
MIN_SCALE = 2.0 ** -24
QUANT_ROWS = 8192


def quantize_per_channel(weight: torch.Tensor, scale_dtype: torch.dtype):
    """weight [N, K] -> (qweight [N, K] int8, scales [N] in ``scale_dtype``): symmetric, one scale per
    output row, absmax / 127. The int8 values are rounded against the scale *after* it is rounded to
    ``scale_dtype``, so qweight * scales is the nearest grid point of the stored grid."""
    q = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scales = torch.empty(weight.shape[0], dtype=scale_dtype, device=weight.device)
    # in row blocks: an fp32 copy of a 248K-row lm_head would be 5 GB of transient memory
    for r in range(0, weight.shape[0], QUANT_ROWS):
        w = weight[r:r + QUANT_ROWS].float()
        s = (w.abs().amax(dim=1) / INT8_MAX).clamp_min(MIN_SCALE).to(scale_dtype)
        q[r:r + QUANT_ROWS] = torch.round(w / s.float()[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        scales[r:r + QUANT_ROWS] = s
    return q, scales


def w8a16_linear(x, qweight, scales):
    """y = x W^T with W = qweight * scales[:, None]: x [M, K] (fp16/bf16; fp32 on CPU), qweight [N, K]
    int8, scales [N]. Returns [M, N] fp32 (the logits the sampler reads); the scale is applied to the fp32
    dot product, which is exact algebra since it is one factor per output column."""
    return (x.float() @ qweight.float().t()) * scales.float()[None, :]
