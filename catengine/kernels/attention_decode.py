"""Pieces of the paged attention kernels (:mod:`catengine.kernels.attention`) split from that file: the
paged K/V tile gather, the exact e5m2 widening, the output epilogue, and the two ways of combining
split-KV decode partials (a second launch, or the last split program of each sequence and KV head).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _kv_tile(cache, p_table, start, m_n, kvh, o_d, BS, stride_b, stride_s, stride_h, BLOCK_N: tl.constexpr,
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


# e5m2 -> fp16 on one 32-bit register holding two int16 byte pairs, i.e. four e5m2 bytes b0..b3 (ldmatrix
# leaves the MMA operands that way: a register is two consecutive k of one operand row). The fp16 pair
# (b0 << 8, b2 << 8) is one byte permute and the pair (b1 << 8, b3 << 8) one mask, where the shift widening
# costs ~7 instructions per register (per-half shifts, masks and repacking). prmt d, a, b, sel: byte i of d
# is byte sel[4i+3:4i] of {b, a} (0-3 from a, 4-7 from b, here b = 0).
E5M2_EVEN_PTX = tl.constexpr("prmt.b32 $0, $1, 0, 0x2404;")
E5M2_ODD_PTX = tl.constexpr("and.b32 $0, $1, 0xFF00FF00;")


@triton.jit
def _e5m2_pair(b_x, dtype, ASM: tl.constexpr):
    """int16 words holding two e5m2 bytes -> (even, odd) elements, exactly (an e5m2 byte is the top
    byte of an fp16). Kept 16-bit wide so the dot operands load from shared memory with ldmatrix.
    ASM: the inline-PTX widening (two separate one-result ops, so that Triton still moves the operand
    layout conversion above them onto the int16 tile); bit-identical to the shifts."""
    if ASM:
        b_lo = tl.inline_asm_elementwise(E5M2_EVEN_PTX, "=r,r", [b_x], dtype=tl.float16, is_pure=True,
                                         pack=2).to(dtype)
        b_hi = tl.inline_asm_elementwise(E5M2_ODD_PTX, "=r,r", [b_x], dtype=tl.float16, is_pure=True,
                                         pack=2).to(dtype)
    else:
        b_u = b_x.to(tl.uint16, bitcast=True)
        b_lo = (b_u << 8).to(tl.uint16).to(tl.float16, bitcast=True).to(dtype)
        b_hi = (b_u & 0xFF00).to(tl.uint16).to(tl.float16, bitcast=True).to(dtype)
    return b_lo, b_hi


@triton.jit
def _split_reduce_kernel(part_o, part_ml, out, gate, NH, NUM_SPLITS, stride_ot, stride_oh, stride_gt, stride_gh,
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


@triton.jit
def _store_out(acc, l_i, out, gate, tok, hq, m_row, o_d, stride_ot, stride_oh, stride_gt, stride_gh,
               HAS_GATE: tl.constexpr):
    """out rows (tok, hq) = acc / l, times sigmoid(gate) when gated."""
    b_o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if HAS_GATE:
        # [BLOCK_M, D]
        b_g = tl.load(gate + tok[:, None] * stride_gt + hq[:, None] * stride_gh + o_d[None, :],
                      mask=m_row[:, None], other=0.0).to(tl.float32)
        b_o = b_o * tl.sigmoid(b_g)
    tl.store(out + tok[:, None] * stride_ot + hq[:, None] * stride_oh + o_d[None, :],
             b_o.to(out.dtype.element_ty), mask=m_row[:, None])


FUSED_MAX_BLOCK_S = tl.constexpr(64)   # splits whose maxima one load brings in the fused merge's first pass
FUSED_STEP = tl.constexpr(4)           # partial o tiles in flight per step of its second pass (registers:
#                                        BLOCK_M x D fp32 each, free again after the key loop)


@triton.jit
def _last_split_merges(part_o, part_ml, out, gate, p_count, row, tok, hq, m_row, o_d, NUM_SPLITS,
                       stride_ot, stride_oh, stride_gt, stride_gh, D: tl.constexpr, BLOCK_M: tl.constexpr,
                       HAS_GATE: tl.constexpr):
    """Split-KV decode without a second launch. Every split program of one (sequence, KV head) has
    stored its partial rows (row = first split's partial row of each query row); the one that arrives
    last at p_count (a zeroed int32) merges all splits in split order, so the result does not depend
    on which program came last, writes the output and re-arms the counter for the next call.
    Two passes: the rows' max over all splits (small loads), then a plain weighted sum of the partials
    with FUSED_STEP tiles loaded per step (independent loads, issued together: the merge is a
    latency chain of about NUM_SPLITS / FUSED_STEP round trips to L2)."""
    # every thread's partial stores before the release (the atomic is issued by one thread)
    tl.debug_barrier()
    arrived = tl.atomic_add(p_count, 1, sem="acq_rel", scope="gpu")
    if arrived == NUM_SPLITS - 1:
        o_s = tl.arange(0, FUSED_MAX_BLOCK_S)
        m_all = tl.full([BLOCK_M], -1e30, tl.float32)
        # num_stages=1: never software-pipelined (ring buffers on top of the key loop's shared memory)
        for s0 in tl.range(0, NUM_SPLITS, FUSED_MAX_BLOCK_S, num_stages=1):
            m_s = m_row[:, None] & (s0 + o_s < NUM_SPLITS)[None, :]
            # [BLOCK_M, FUSED_MAX_BLOCK_S]; .cg: from L2, where the other programs' partials are, never a
            # stale L1 line
            b_m = tl.load(part_ml + (row[:, None] + s0 + o_s[None, :]) * 2, mask=m_s, other=-1e30,
                          cache_modifier=".cg")
            m_all = tl.maximum(m_all, tl.max(b_m, 1))
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        l_all = tl.zeros([BLOCK_M], tl.float32)
        for s0 in tl.range(0, NUM_SPLITS, FUSED_STEP, num_stages=1):
            for j in tl.static_range(FUSED_STEP):
                m_s = m_row & (s0 + j + 0 * hq < NUM_SPLITS)
                p_ml = part_ml + (row + s0 + j) * 2
                # [BLOCK_M] each; empty splits carry (m -1e30, l 0, o 0): weight 0
                b_m = tl.load(p_ml, mask=m_s, other=-1e30, cache_modifier=".cg")
                b_l = tl.load(p_ml + 1, mask=m_s, other=0.0, cache_modifier=".cg")
                # [BLOCK_M, D]
                b_o = tl.load(part_o + (row + s0 + j)[:, None] * D + o_d[None, :], mask=m_s[:, None], other=0.0,
                              cache_modifier=".cg")
                w = tl.exp2(b_m - m_all)
                acc += b_o * w[:, None]
                l_all += b_l * w
        _store_out(acc, l_all, out, gate, tok, hq, m_row, o_d, stride_ot, stride_oh, stride_gt, stride_gh, HAS_GATE)
        tl.atomic_xchg(p_count, 0, sem="relaxed", scope="gpu")
