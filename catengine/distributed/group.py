"""The tensor-parallel group the sharded model calls: all-reduce, all-gather, broadcast.

The model receives its TPGroup explicitly (no process-group singleton): ``TPGroup.single()`` is the
one-rank group whose collectives are no-ops, so TP1 runs exactly the code it always ran.
"""
from __future__ import annotations

import torch


class TPGroup:
    def __init__(self, rank: int, size: int, pg=None):
        self.rank, self.size, self.pg = rank, size, pg
        self.oneshot = None   # distributed/oneshot.py: small CUDA sums (enable_one_shot_all_reduce)

    @classmethod
    def single(cls) -> "TPGroup":
        return cls(0, 1, None)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over the ranks, in x's dtype. 16-bit partial sums are added in fp32: a row-parallel
        projection's partials are each within range when their sum is not (fp16 tops out at 65,504), and
        fp32 keeps the sum's rounding one step, as in the unsharded GEMM's fp32 accumulator."""
        if self.size == 1:
            return x
        y = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x.contiguous().clone()
        if self.oneshot is not None and y.is_cuda and y.dtype == torch.float32 and y.numel() <= self.oneshot.max_numel:
            return self.oneshot(y).to(x.dtype)
        self.pg.allreduce([y]).wait()
        return y.to(x.dtype)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``x`` (same shape on each) concatenated along ``dim`` in rank order."""
        if self.size == 1:
            return x
        x = x.contiguous()
        outs = [torch.empty_like(x) for _ in range(self.size)]
        self.pg.allgather([outs], [x]).wait()
        return torch.cat(outs, dim)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``x`` (in place) from rank ``src``; the other ranks pass a buffer of the same shape and dtype."""
        if self.size > 1:
            self.pg.broadcast(x, src).wait()
        return x

    def barrier(self) -> None:
        if self.size > 1:
            self.all_reduce(torch.zeros(1))
