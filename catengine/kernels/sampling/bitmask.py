"""Structured outputs' token mask on the logits (twin: ``sampling.naive.apply_token_bitmask``).

One program per (masked row, block of the vocabulary): it reads the block's bitmask words and writes
-inf into the disallowed logits only, so a row costs V / 8 bytes read plus the masked stores, and free
rows of the batch are not launched at all. No shared memory, no reduction: one table row fits all GPUs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import KernelContractError
from ..common.aot import AotConfig

BLOCK = 1024
NUM_WARPS = 4


@triton.jit
def _bitmask_kernel(logits, bitmask, rows, V, stride_l, stride_m, BLOCK: tl.constexpr):
    i_r = tl.program_id(0)
    i_b = tl.program_id(1)
    row = tl.load(rows + i_r)
    o_t = i_b * BLOCK + tl.arange(0, BLOCK)
    m_t = o_t < V
    # [BLOCK] (each word is loaded by its 32 tokens; the cache serves the repeats)
    b_w = tl.load(bitmask + i_r * stride_m + o_t // 32, mask=m_t, other=-1)
    b_bit = (b_w >> (o_t % 32)) & 1
    tl.store(logits + row.to(tl.int64) * stride_l + o_t, float("-inf"), mask=m_t & (b_bit == 0))


def apply_token_bitmask(logits, bitmask, rows):
    R = rows.shape[0]
    if R == 0:
        return
    B, V = logits.shape
    if logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise KernelContractError(f"apply_token_bitmask: logits must be fp32 with unit stride over the vocabulary, "
                                  f"got {logits.dtype} strides {logits.stride()}")
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[0] != R or 32 * bitmask.shape[1] < V \
            or bitmask.stride(1) != 1:
        raise KernelContractError(f"apply_token_bitmask: bitmask must be int32 [{R}, >= {-(-V // 32)}] with unit "
                                  f"inner stride, got {bitmask.dtype} {tuple(bitmask.shape)}")
    if rows.dtype != torch.int64 or rows.device != logits.device or bitmask.device != logits.device:
        raise KernelContractError("apply_token_bitmask: rows must be int64 and every tensor on the logits' device")
    _bitmask_kernel[(R, triton.cdiv(V, BLOCK))](logits, bitmask, rows, V, logits.stride(0), bitmask.stride(0),
                                                BLOCK=BLOCK, num_warps=NUM_WARPS)


def aot_configs(cc: int) -> list[AotConfig]:
    """The one launch shape (every architecture)."""
    sig = {"logits": "*fp32", "bitmask": "*i32", "rows": "*i64", "V": "i32", "stride_l": "i32", "stride_m": "i32",
           "BLOCK": "constexpr"}
    return [AotConfig("_bitmask_kernel", sig, dict(BLOCK=BLOCK), NUM_WARPS, 1, "token bitmask")]
