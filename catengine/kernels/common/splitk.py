"""The split-K reduce that the W4A16 GEMM/GEMV and the MoE down projection share: SPLIT_K fp32
partials [SPLIT_K, M, N] summed in a fixed order (results do not depend on scheduling), plus the
optional bias, cast to the output dtype. One program per (row, BLOCK columns). Also the split picking
and the arrival counters (``held_counters``) of the kernels whose last split reduces in-kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .arch import pdl_supported

# output columns per reduce program: 256 (4 warps, 2 columns a thread) took 1.7-2.1 us a call where 1024 took 2.3-3.2
# at the decode step's split shapes, and the MoE combine likewise (bench/NOTES.md, session 16)
REDUCE_BLOCK = 256
MAX_SPLIT_K = 32        # splits of one tile at most (sm_80/90 kernels; gemm_sm70 keeps its own bound)


@triton.jit
def splitk_reduce_kernel(part_ptr, bias_ptr, y_ptr, M, N, stride_ym, SPLIT_K: tl.constexpr,
                         BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, TRIGGER: tl.constexpr = False):
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    i_m, i_b = tl.program_id(0), tl.program_id(1)
    o_n = i_b * BLOCK + tl.arange(0, BLOCK)
    m_n = o_n < N
    acc = tl.zeros([BLOCK], tl.float32)
    for i_s in tl.static_range(SPLIT_K):
        # [BLOCK]
        acc += tl.load(part_ptr + (i_s * M + i_m) * N + o_n, mask=m_n, other=0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + o_n, mask=m_n, other=0).to(tl.float32)
    tl.store(y_ptr + i_m * stride_ym + o_n, acc.to(y_ptr.dtype.element_ty), mask=m_n)


def whole_split(want: int, n_kb: int, cap: int = MAX_SPLIT_K) -> int:
    """``want`` splits of n_kb k blocks, clamped to 1..min(n_kb, cap) and rounded so no split is empty."""
    want = max(1, min(want, n_kb, cap))
    per = -(-n_kb // want)
    return -(-n_kb // per)


def pick_split(tiles: int, n_kb: int, waves: int, sms: int, cap: int = MAX_SPLIT_K) -> int:
    """Smallest split of n_kb k blocks giving about waves * SMs programs over ``tiles`` output tiles (whole_split)."""
    return whole_split(-(-waves * sms // tiles), n_kb, cap)


def held_counters(owner, attr: str, device, needed: int, size: int) -> torch.Tensor | None:
    """``owner.<attr>``: the zeroed int32 arrival counters of an in-kernel split-K reduce (each call leaves them
    zero again), ``max(size, needed)`` of them allocated on first use and never replaced (a captured CUDA graph
    keeps their address). None when a call needs more, or when the first use is inside a graph capture (the
    buffer would be the graph's, and its zeroing a captured memset): the caller then takes its other path."""
    buf = getattr(owner, attr)
    if buf is None:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = torch.zeros(max(size, needed), dtype=torch.int32, device=device)
        setattr(owner, attr, buf)
    return buf if needed <= buf.numel() else None


def split_partials(split: int, y: torch.Tensor) -> torch.Tensor:
    """fp32 partials [split, M, N] for y [M, N] when split > 1; else y itself (the kernels' unused part_ptr)."""
    return torch.empty((split,) + tuple(y.shape), dtype=torch.float32, device=y.device) if split > 1 else y


def reduce_splits(part: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor, split: int) -> torch.Tensor:
    """y [M, N] = the sum of split > 1 partials (+ bias) by ``splitk_reduce_kernel``; nothing to do for split 1."""
    if split > 1:
        m, n = y.shape
        splitk_reduce_kernel[(m, triton.cdiv(n, REDUCE_BLOCK))](
            part, bias if bias is not None else y, y, m, n, y.stride(0), SPLIT_K=split, BLOCK=REDUCE_BLOCK,
            HAS_BIAS=bias is not None, TRIGGER=pdl_supported(y.device))
    return y
