"""Torch twin of the skinny dense linear; the oracle in tests and the engine's CPU path (and cuBLAS itself on CUDA
wherever the kernel's table does not take a shape)."""
from __future__ import annotations

import torch.nn.functional as F


def skinny_linear(x, w, bias=None, counters=None):
    """y = x @ w^T (+ bias): x [..., K], w [N, K] dense (torch's Linear layout), bias [N], all one dtype; y
    [..., N] in that dtype. ``counters``: the weight's int32 arrival counters (``skinny_counters`` of them, zero
    between calls; None where it has none), which the Triton form's split-K reduce uses and leaves zero; ignored
    here."""
    return F.linear(x, w, bias)


def skinny_counters(w):
    """How many int32 arrival counters ``skinny_linear`` may use for the dense weight w [N, K] at any row count on
    w's device: 0 where it never splits K in-kernel (no kernel on this device or row, or a shape outside its
    table), so that nothing is allocated."""
    return 0
