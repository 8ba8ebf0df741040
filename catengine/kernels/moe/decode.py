"""Decode path of :func:`catengine.kernels.moe.fused.fused_moe` for W4A16 experts and a few tokens.

A decode step of Qwen3.6-35B-A3B reads ~12.6 MB (the 8 chosen experts' packed weights and scales),
~3 us at 4.2 TB/s. The earlier row kernels (16-32 column programs over all of K, then a split-K reduce
launch) took 15.5 us for one token on the H200. Here each chosen expert's weight is cut along N and
K into one-tile programs with the dense GEMV's tiles and half2 weight math
(:mod:`catengine.kernels.w4a16.gemv`):

- ``moe_up_decode_kernel``: program (column tile, K split, row = token * top_k + slot) reads gate
  columns n and up columns I + n of the row's expert over its K range. With a split, fp32 partials
  go to a scratch buffer and the last program of each (column tile, row) to arrive at an acq_rel
  counter sums them in split order, applies silu(gate) * up and stores h (activation dtype).
- ``moe_down_decode_kernel``: K is a token's top_k experts back to back (top_k * I rows); program
  (column tile, K split, token) reads its tiles (never straddling two experts) with the routing
  weight folded into the per-block scale, and the last arrival sums the splits in order and writes
  the output: the weighted combine needs no launch of its own.

An id of -1 (expert parallelism: an expert another rank holds) is skipped by both kernels: no weight is
read for it and it adds nothing. Two launches, no atomics on data (only arrival counters, left at zero), so a result does not depend
on scheduling; grids come from shapes only, so the path captures into a CUDA graph. The counters
belong to the weights (``QuantizedWeight.split_counters``), allocated on first use with room for the
table's largest decode batch. On sm_90 the down kernel can be a programmatic dependent launch (PDL):
it starts while the up kernel runs and fetches its weights, and waits (griddepcontrol.wait) only
before reading h.

Measured (H200, bench_moe.py --sweep, 1 token): 12.8 us with PDL, 13.8 without (0.25 of copy
bandwidth; the target is 0.6). torch.profiler puts the up kernel at 7.3 us for its 8.4 MB and the
down kernel at 6.0 us for 4.2 MB, so each kernel costs ~4 us beyond its bytes at copy speed. Fewer,
larger programs made it worse (the up pass unsplit: 16-21 us in total; the down pass as one tile of
all 8 experts' rows per 16 columns, no split: +2.6 us), so the split reduce is not what costs most.
The weight math is ~24 instructions per int32: 3.15 M int32 are 2.4 M warp instructions, ~2.3 us
for all 528 schedulers at one a cycle, and it starts only when a program's loads land; at 3 us of
bytes, 0.6 of copy bandwidth (5.2 us) would need the two to overlap almost completely.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.aot import AotConfig
from ..common.arch import INTERPRET
from ..common.splitk import pick_split
from ..w4a16.launch import GemvConfig, gemv_tile, split_counters
from ..w4a16.gemv import gemv_block_tile, gemv_rows, last_split_reduces


@triton.jit
def moe_up_decode_kernel(x_ptr, w_ptr, s_ptr, z_ptr, id_ptr, h_ptr, part_ptr, count_ptr, TK, H, I, stride_xm,
                         nib, n_split, TOPK: tl.constexpr, G: tl.constexpr, BN: tl.constexpr, R: tl.constexpr,
                         SR: tl.constexpr, SPLIT: tl.constexpr, F16X2: tl.constexpr, ASM: tl.constexpr,
                         PDL: tl.constexpr):
    """PDL 1: the down kernel may start once every program here has begun (it reads only what was
    written before this kernel started until its own gdc_wait); 2: this kernel too is a programmatic
    dependent of the one before it, so it first waits for that one (the routing) to complete."""
    if PDL == 2:
        tl.extra.cuda.gdc_wait()
    if PDL > 0:
        tl.extra.cuda.gdc_launch_dependents()
    i_n, i_s, i_row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_e = tl.load(id_ptr + i_row).to(tl.int64)
    if i_e < 0:
        # an expert another rank holds (expert parallelism): the down kernel skips this row, so h stays
        # unwritten and the split counters untouched
        return
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < I
    # this expert's [H // 8, 2I] weight: gate columns o_n, up columns I + o_n
    p_w = w_ptr + i_e * (H // 8) * (2 * I)
    p_s = s_ptr + i_e * (H // G) * (2 * I)
    p_z = z_ptr + i_e * (H // G) * (2 * I)
    p_x = x_ptr + (i_row // TOPK) * stride_xm
    n_kb = H // (8 * R)
    kb_per = tl.cdiv(n_kb, n_split)
    kb_end = tl.minimum(kb_per * i_s + kb_per, n_kb)
    acc_g = tl.zeros([BN, R // SR, 1], tl.float32)
    acc_u = tl.zeros([BN, R // SR, 1], tl.float32)
    for kb in range(kb_per * i_s, kb_end):
        # both tiles' loads are issued before either's math
        g_q, g_a, g_b, g_c = gemv_block_tile(p_w, p_s, p_z, kb * 8 * R, o_n, m_n, 2 * I, G, R, SR, F16X2, ASM)
        u_q, u_a, u_b, u_c = gemv_block_tile(p_w + I, p_s + I, p_z + I, kb * 8 * R, o_n, m_n, 2 * I, G, R, SR, F16X2,
                                             ASM)
        acc_g, _, _, _ = gemv_rows(acc_g, acc_g, acc_g, acc_g, g_q, g_a, g_b, g_c, p_x, 0, 0, 1, kb * 8 * R, nib,
                                   R, SR, 1, F16X2)
        acc_u, _, _, _ = gemv_rows(acc_u, acc_u, acc_u, acc_u, u_q, u_a, u_b, u_c, p_x, 0, 0, 1, kb * 8 * R, nib,
                                   R, SR, 1, F16X2)
    b_g = tl.sum(tl.sum(acc_g, axis=2), axis=1)
    b_u = tl.sum(tl.sum(acc_u, axis=2), axis=1)
    if not SPLIT:
        b_h = b_g * tl.sigmoid(b_g) * b_u
        tl.store(h_ptr + i_row * I + o_n, b_h.to(h_ptr.dtype.element_ty), mask=m_n)
    else:
        p_part = part_ptr + (i_s * TK + i_row) * (2 * I) + o_n
        tl.store(p_part, b_g, mask=m_n)
        tl.store(p_part + I, b_u, mask=m_n)
        # every thread's partial stores before the release (the atomic is issued by one thread)
        tl.debug_barrier()
        p_count = count_ptr + i_n * TK + i_row
        arrived = tl.atomic_add(p_count, 1, sem="acq_rel", scope="gpu")
        if arrived == n_split - 1:
            s_g = tl.zeros([BN], tl.float32)
            s_u = tl.zeros([BN], tl.float32)
            for j in range(0, n_split):
                # [BN] each; .cg: from L2, where the other programs' partials are
                p_j = part_ptr + (j * TK + i_row) * (2 * I) + o_n
                s_g += tl.load(p_j, mask=m_n, other=0., cache_modifier=".cg")
                s_u += tl.load(p_j + I, mask=m_n, other=0., cache_modifier=".cg")
            s_h = s_g * tl.sigmoid(s_g) * s_u
            tl.store(h_ptr + i_row * I + o_n, s_h.to(h_ptr.dtype.element_ty), mask=m_n)
            tl.atomic_xchg(p_count, 0, sem="relaxed", scope="gpu")


@triton.jit
def moe_down_decode_kernel(h_ptr, w_ptr, s_ptr, z_ptr, id_ptr, tw_ptr, y_ptr, part_ptr, count_ptr, T, H, I, nib,
                           n_split, TOPK: tl.constexpr, G: tl.constexpr, BN: tl.constexpr, R: tl.constexpr,
                           SR: tl.constexpr, SPLIT: tl.constexpr, F16X2: tl.constexpr, ASM: tl.constexpr,
                           PDL: tl.constexpr):
    """PDL: launched as a programmatic dependent of the up kernel, so it may run while that one does:
    ids and routing weights (written before the up kernel started) and the weights are read at once,
    h only after gdc_wait (the up kernel complete and its stores visible)."""
    i_n, i_s, i_t = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < H
    n_ib = I // (8 * R)
    n_kb = TOPK * n_ib
    kb_per = tl.cdiv(n_kb, n_split)
    kb_end = tl.minimum(kb_per * i_s + kb_per, n_kb)
    acc = tl.zeros([BN, R // SR, 1], tl.float32)
    for kb in range(kb_per * i_s, kb_end):
        j = kb // n_ib
        k0 = (kb % n_ib) * 8 * R
        i_e = tl.load(id_ptr + i_t * TOPK + j).to(tl.int64)
        if i_e >= 0:   # else an expert another rank holds (expert parallelism): nothing to read or add
            b_tw = tl.load(tw_ptr + i_t * TOPK + j)
            b_q, b_a, b_b, b_c = gemv_block_tile(w_ptr + i_e * (I // 8) * H, s_ptr + i_e * (I // G) * H,
                                                 z_ptr + i_e * (I // G) * H, k0, o_n, m_n, H, G, R, SR, F16X2, ASM)
            # the routing weight rides on the block scale: one multiply per block, not per weight
            b_c = b_c.to(tl.float32) * b_tw
            if PDL > 0:
                tl.extra.cuda.gdc_wait()
            acc, _, _, _ = gemv_rows(acc, acc, acc, acc, b_q, b_a, b_b, b_c, h_ptr + (i_t * TOPK + j) * I, 0, 0,
                                     1, k0, nib, R, SR, 1, F16X2)
    if PDL > 0:
        # no store before the up kernel is complete (its scratch may share memory with this one's),
        # whatever the loop ran
        tl.extra.cuda.gdc_wait()
    b_y = tl.sum(tl.sum(acc, axis=2), axis=1)
    if not SPLIT:
        tl.store(y_ptr + i_t * H + o_n, b_y.to(y_ptr.dtype.element_ty), mask=m_n)
    else:
        tl.store(part_ptr + (i_s * T + i_t) * H + o_n, b_y, mask=m_n)
        last_split_reduces(y_ptr, y_ptr, part_ptr, count_ptr + i_n * T + i_t, i_t, o_n, m_n, T, H, n_split, H,
                           1, False)


def _counters(weight, needed: int, size: int, device):
    """The weight's zeroed arrival counters; a fresh zeroed buffer (a memset, also under graph
    capture) when the weight has none that fit yet."""
    buf = split_counters(weight, needed, size)
    return buf if buf is not None else torch.zeros(needed, dtype=torch.int32, device=device)


def moe_decode(x, w13, w2, tw, ids, up: GemvConfig, down: GemvConfig, sms: int, max_rows: int, pdl: int = 0):
    """Routed W4A16 experts for T * top_k <= max_rows rows (x [T, H] fp16/bf16, contiguous ids int32
    and tw fp32 [T, top_k]): the two kernels above. Returns [T, H] fp32 (fused_moe's contract). pdl (sm_90 on; off in
    the interpreter): 1 launches the down kernel as a programmatic dependent of the up kernel, 2 the up
    kernel also of whatever precedes it."""
    pdl = 0 if INTERPRET else pdl
    t, hid = x.shape
    top_k = ids.shape[1]
    inter = w13.out_features // 2
    tk = t * top_k
    dev = x.device
    # half2 math needs PTX (not the interpreter) and fp16; x and h are read as 8-byte words
    f16x2 = x.dtype == torch.float16 and not INTERPRET
    if f16x2 and (x.stride(0) % 4 or x.data_ptr() % 8):
        x = torch.empty((t, hid), dtype=x.dtype, device=dev).copy_(x)
    h = torch.empty((tk, inter), dtype=x.dtype, device=dev)
    out = torch.empty((t, hid), dtype=torch.float32, device=dev)

    r, sr = gemv_tile(up, hid, w13.group_size)
    n_tiles = triton.cdiv(inter, up.BN)
    split = pick_split(n_tiles * tk, hid // (8 * r), up.waves, sms)
    part = torch.empty((split, tk, 2 * inter), dtype=torch.float32, device=dev) if split > 1 else h
    count = _counters(w13, n_tiles * tk, n_tiles * max_rows, dev) if split > 1 else ids
    moe_up_decode_kernel[(n_tiles, split, tk)](
        x, w13.qweight, w13.scales, w13.zeros, ids, h, part, count, tk, hid, inter, x.stride(0), 15, split,
        TOPK=top_k, G=w13.group_size, BN=up.BN, R=r, SR=sr, SPLIT=split > 1, F16X2=f16x2, ASM=not INTERPRET,
        PDL=pdl, num_warps=up.num_warps, num_stages=1, **({"launch_pdl": True} if pdl == 2 else {}))

    r, sr = gemv_tile(down, inter, w2.group_size)
    n_tiles = triton.cdiv(hid, down.BN)
    split = pick_split(n_tiles * t, top_k * inter // (8 * r), down.waves, sms)
    part = torch.empty((split, t, hid), dtype=torch.float32, device=dev) if split > 1 else out
    count = (_counters(w2, n_tiles * t, n_tiles * max(1, max_rows // top_k), dev) if split > 1 else ids)
    moe_down_decode_kernel[(n_tiles, split, t)](
        h, w2.qweight, w2.scales, w2.zeros, ids, tw, out, part, count, t, hid, inter, 15, split,
        TOPK=top_k, G=w2.group_size, BN=down.BN, R=r, SR=sr, SPLIT=split > 1,
        F16X2=f16x2 and inter % 4 == 0, ASM=not INTERPRET, PDL=pdl, num_warps=down.num_warps, num_stages=1,
        **({"launch_pdl": True} if pdl else {}))
    return out


# ---------------------------------------------------------------- ahead-of-time list
_UP_ARGS = ("x_ptr w_ptr s_ptr z_ptr id_ptr h_ptr part_ptr count_ptr TK H I stride_xm nib n_split "
            "TOPK G BN R SR SPLIT F16X2 ASM PDL")
_DOWN_ARGS = ("h_ptr w_ptr s_ptr z_ptr id_ptr tw_ptr y_ptr part_ptr count_ptr T H I nib n_split "
              "TOPK G BN R SR SPLIT F16X2 ASM PDL")


def decode_aot_configs(cc: int, up: GemvConfig, down: GemvConfig, pdl: int = 0) -> list[AotConfig]:
    """Both kernels at Qwen3.6-35B-A3B's shape (top-8, H 2048, I 512, group 128), split and unsplit,
    each activation dtype the architecture has (no bf16 before sm_80)."""
    out = []
    for dt in ("fp16",) + (("bf16",) if cc >= 80 else ()):
        ty = {p: f"*{dt}" for p in ("x_ptr", "h_ptr", "s_ptr", "z_ptr")}
        ty.update(y_ptr="*fp32", w_ptr="*i32", id_ptr="*i32", count_ptr="*i32", tw_ptr="*fp32", part_ptr="*fp32")
        for kernel, args, c, k in (("moe_up_decode_kernel", _UP_ARGS, up, 2048),
                                   ("moe_down_decode_kernel", _DOWN_ARGS, down, 512)):
            r, sr = gemv_tile(c, k, 128)
            for split in (False, True):
                consts = dict(TOPK=8, G=128, BN=c.BN, R=r, SR=sr, SPLIT=split, F16X2=dt == "fp16", ASM=True,
                              PDL=pdl)
                sig = {a: ty.get(a, "i32" if a.islower() or a in ("TK", "H", "I", "T") else "constexpr")
                       for a in args.split()}
                # the model's H, I and x's row stride are multiples of 16, and Triton specialises on that
                out.append(AotConfig(kernel, sig, consts, c.num_warps, 1, f"{kernel[5:-7]} {dt}{' split' * split}",
                                     divisible_by_16=tuple(n for n in ("H", "I", "stride_xm") if n in sig)))
    return out
