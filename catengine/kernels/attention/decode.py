"""Pieces of the paged attention kernels (:mod:`catengine.kernels.attention.paged`) split from that file: the
paged K/V tile gather, the exact e5m2 widening, and the pass that combines split-KV decode partials.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

REDUCE_BLOCK_S, REDUCE_BLOCK_D = 64, 64   # splits per round trip, output dims per program


@triton.jit
def kv_tile(cache, p_table, start, m_n, kvh, o_d, BS, stride_b, stride_s, stride_h, BLOCK_N: tl.constexpr,
            MASK: tl.constexpr):
    """[BLOCK_N, len(o_d)] raw cache elements of the keys or values start + [0, BLOCK_N), gathered per row.
    Every caller's start is a multiple of BLOCK_N (the key loops step by BLOCK_N from multiples of it),
    so with power-of-two sizes a row's slot in its block is fixed and its block index is start // BS plus
    a fixed step: no per-key division or modulo, and the in-block offsets are loop-invariant."""
    o_r = tl.arange(0, BLOCK_N)
    if BLOCK_N % BS == 0:
        o_blk = start // BS + o_r // BS
        o_slot = o_r % BS
    elif BS % BLOCK_N == 0:  # the whole tile lies in one block
        o_blk = tl.zeros_like(o_r) + start // BS
        o_slot = start % BS + o_r
    else:
        o_blk = (start + o_r) // BS
        o_slot = (start + o_r) % BS
    if MASK:
        # [BLOCK_N]
        b_page = tl.load(p_table + o_blk, mask=m_n, other=0)
    else:
        # [BLOCK_N]
        b_page = tl.load(p_table + o_blk)
    # block ids and strides are non-negative: zero-extended, the 64-bit product is one wide multiply
    b_off = b_page.to(tl.uint32, bitcast=True).to(tl.uint64) * stride_b.to(tl.uint32, bitcast=True).to(tl.uint64)
    p_x = cache + b_off + (o_slot * stride_s + kvh * stride_h)
    if MASK:
        # [BLOCK_N, len(o_d)]
        b_x = tl.load(p_x[:, None] + o_d[None, :], mask=m_n[:, None], other=0)
    else:
        # [BLOCK_N, len(o_d)]
        b_x = tl.load(p_x[:, None] + o_d[None, :])
    return b_x


@triton.jit
def split_reduce_kernel(part_o, part_ml, out, gate, NH, NUM_SPLITS, stride_ot, stride_oh, stride_gt, stride_gh,
                        D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HAS_GATE: tl.constexpr):
    """One (token, head, dims slice) per program, one pass over the splits with a running max: up to
    BLOCK_S splits are one round trip to memory, and the dims slices give a batch of 1 enough programs."""
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    row0 = (i_t * NH + i_h) * NUM_SPLITS
    o_s = tl.arange(0, BLOCK_S)
    o_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    m_all = tl.full([1], -1e30, tl.float32)
    l_all = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        m_s = s0 + o_s < NUM_SPLITS
        # [BLOCK_S]
        b_m = tl.load(part_ml + (row0 + s0 + o_s) * 2, mask=m_s, other=-1e30)
        # [BLOCK_S]
        b_l = tl.load(part_ml + (row0 + s0 + o_s) * 2 + 1, mask=m_s, other=0.0)
        # [BLOCK_S, BLOCK_D]
        b_o = tl.load(part_o + (row0 + s0 + o_s)[:, None] * D + o_d[None, :], mask=m_s[:, None], other=0.0)
        m_new = tl.maximum(m_all, tl.max(b_m, 0))
        alpha = tl.exp2(m_all - m_new)
        # empty splits carry (acc 0, l 0): any finite weight leaves them neutral
        w = tl.exp2(b_m - m_new)
        acc = acc * alpha + tl.sum(b_o * w[:, None], 0)
        l_all = l_all * alpha + tl.sum(b_l * w, 0)
        m_all = m_new
    b_out = acc / tl.where(l_all > 0, l_all, 1.0)
    if HAS_GATE:
        # [BLOCK_D]
        b_g = tl.load(gate + i_t * stride_gt + i_h * stride_gh + o_d).to(tl.float32)
        b_out = b_out * tl.sigmoid(b_g)
    tl.store(out + i_t * stride_ot + i_h * stride_oh + o_d, b_out.to(out.dtype.element_ty))


def split_partials(t: int, nh: int, num_splits: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 partial outputs [t, nh, splits, d] and (max, sum) [t, nh, splits, 2] a split-KV launch writes;
    unsplit, a 1-element placeholder of the same pointer type keeps one compiled signature."""
    if num_splits > 1:
        return (torch.empty((t, nh, num_splits, d), dtype=torch.float32, device=device),
                torch.empty((t, nh, num_splits, 2), dtype=torch.float32, device=device))
    part = torch.empty(1, dtype=torch.float32, device=device)
    return part, part


def reduce_splits(part_o, part_ml, out, g_arg, nh: int, num_splits: int, has_gate: bool) -> None:
    """Combine the split-KV partials into ``out`` (gated by ``g_arg`` when ``has_gate``)."""
    t, d = out.shape[0], part_o.shape[-1]
    split_reduce_kernel[(t, nh, d // REDUCE_BLOCK_D)](
        part_o, part_ml, out, g_arg, nh, num_splits, out.stride(0), out.stride(1),
        g_arg.stride(0), g_arg.stride(1), D=d, BLOCK_S=REDUCE_BLOCK_S, BLOCK_D=REDUCE_BLOCK_D,
        HAS_GATE=has_gate, num_warps=4)
