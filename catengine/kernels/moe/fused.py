"""Triton MoE: the routed experts (W4A16 or dense fp16/bf16 weights); the top-k softmax routing and
the token alignment are in :mod:`catengine.kernels.moe.route`.

Two paths, picked by the number of (token, expert) rows T * top_k against the table's row_max:

- decode, W4A16 experts (table entry ``decode``): :mod:`catengine.kernels.moe.decode`, the
  chosen experts cut along N and K into one-tile GEMV programs, two launches with in-kernel
  split-K reduces (the weighted combine in the second), the second a programmatic dependent launch
  on sm_90 (``decode_pdl``).
- rows (decode, dense experts; W4A16 too where ``decode`` is None): no sorting at all.
  ``_moe_up_row_kernel`` runs one program per (row, column tile): it reads only that row's expert,
  computes gate and up, and stores ``silu(gate) * up``.
  ``_moe_down_row_kernel`` treats a token's top_k experts as one K dimension of length top_k * I
  (K-block b belongs to expert slot b // (I / BK)), so a single GEMV-style pass applies the routing
  weights and sums the experts in a fixed order: two launches, no atomics, only chosen experts read.
- sorted (prefill): rows are grouped by expert and padded to the block size BM (torch ops on the
  device, no host sync), then ``_moe_gemm_kernel`` runs the grouped ``tl.dot`` for gate_up (+ SiLU)
  and for down (+ routing weight), and ``_combine_kernel`` sums each token's top_k rows in order.

The output is fp32 on every path (the twin's contract): the weighted sum goes to the residual add
unrounded, since in an fp16 model it can pass 65,504.

The weight math is shared with :mod:`catengine.kernels.w4a16.gemm` (``fma_tile``, ``dequant_tile``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...errors import ConfigError, KernelContractError
from ..common.aot import AotConfig
from ..common.arch import arch_key, device_key
from ..common.splitk import REDUCE_BLOCK, splitk_reduce_kernel
from ..w4a16.gemm import INTERPRET, GemmConfig, GemvConfig, block_k, dequant_tile, gemv_block_k, mma, pick_split
from ..w4a16.gemv import fma_tile, gemv_tile_load
from ..w4a16.packing import QuantizedWeight
# the decode kernels are named here too: common/aot.py looks each configuration's kernel up in this module
from .decode import decode_aot_configs, moe_decode, moe_down_decode_kernel, moe_up_decode_kernel  # noqa: F401
from .route import align_tokens

NIB = 15
NIB2 = 0x000F000F


# ---------------------------------------------------------------- row kernels (decode)
# Both fetch the next weight tile by hand while computing the current one: Triton pipelines loads
# that do not feed tl.dot only in loops that ask for stages, which the down pass does when its
# table entry has num_stages > 1 (the measured table uses 1). A decode step is a handful of DRAM
# latencies long, so this is most of its time.
@triton.jit
def _moe_up_row_kernel(x_ptr, w_ptr, s_ptr, z_ptr, id_ptr, h_ptr, H, I, stride_xm, nib,
                       TOPK: tl.constexpr, G: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       QUANT: tl.constexpr):
    i_n, i_row = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(id_ptr + i_row).to(tl.int64)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < I
    p_x = x_ptr + (i_row // TOPK) * stride_xm
    if QUANT:
        o_r = tl.arange(0, BK // 8)
        # gate columns o_n and up columns I + o_n of this expert's [H // 8, 2I] weight
        p_w = w_ptr + i_e * (H // 8) * (2 * I)
        p_s = s_ptr + i_e * (H // G) * (2 * I)
        p_z = z_ptr + i_e * (H // G) * (2 * I)
        acc_g = tl.zeros([BN, BK // 8], tl.float32)
        acc_u = tl.zeros([BN, BK // 8], tl.float32)
        b_qg, b_sg, b_zg = gemv_tile_load(p_w, p_s, p_z, 0, H, o_r, o_n, m_n, 2 * I, G)
        b_qu, b_su, b_zu = gemv_tile_load(p_w + I, p_s + I, p_z + I, 0, H, o_r, o_n, m_n, 2 * I, G)
        for k0 in range(0, H, BK):
            n_qg, n_sg, n_zg = gemv_tile_load(p_w, p_s, p_z, k0 + BK, H, o_r, o_n, m_n, 2 * I, G)
            n_qu, n_su, n_zu = gemv_tile_load(p_w + I, p_s + I, p_z + I, k0 + BK, H, o_r, o_n, m_n, 2 * I, G)
            acc_g += fma_tile(b_qg, b_zg.to(tl.float32), p_x + k0 + o_r * 8, nib) * b_sg.to(tl.float32)
            acc_u += fma_tile(b_qu, b_zu.to(tl.float32), p_x + k0 + o_r * 8, nib) * b_su.to(tl.float32)
            b_qg, b_sg, b_zg, b_qu, b_su, b_zu = n_qg, n_sg, n_zg, n_qu, n_su, n_zu
    else:
        o_k = tl.arange(0, BK)
        p_w = w_ptr + i_e * (2 * I) * H
        acc_g = tl.zeros([BN, BK], tl.float32)
        acc_u = tl.zeros([BN, BK], tl.float32)
        for k0 in range(0, H, BK):
            m_k = (k0 + o_k) < H
            # [BK]
            b_x = tl.load(p_x + k0 + o_k, mask=m_k, other=0).to(tl.float32)
            m_w = m_n[:, None] & m_k[None, :]
            # [BN, BK] torch layout rows: gate features, then up features
            b_g = tl.load(p_w + o_n[:, None] * H + (k0 + o_k)[None, :], mask=m_w, other=0)
            b_u = tl.load(p_w + (I + o_n)[:, None] * H + (k0 + o_k)[None, :], mask=m_w, other=0)
            acc_g += b_g.to(tl.float32) * b_x[None, :]
            acc_u += b_u.to(tl.float32) * b_x[None, :]
    b_g = tl.sum(acc_g, axis=1)
    b_h = b_g * tl.sigmoid(b_g) * tl.sum(acc_u, axis=1)
    tl.store(h_ptr + i_row * I + o_n, b_h.to(h_ptr.dtype.element_ty), mask=m_n)


@triton.jit
def _down_tile_load(w_ptr, s_ptr, z_ptr, b_ids, o_j, kb, kb_end, n_ib, o_r, o_n, m_n, H, I,
                    G: tl.constexpr, BK: tl.constexpr):
    """Tile kb of a token's concatenated experts: expert slot kb // n_ib, rows (kb % n_ib) * BK..;
    zeros from kb_end on."""
    i_e = tl.sum(tl.where(o_j == kb // n_ib, b_ids, 0)).to(tl.int64)
    k_end = tl.where(kb < kb_end, I, 0)
    return gemv_tile_load(w_ptr + i_e * (I // 8) * H, s_ptr + i_e * (I // G) * H, z_ptr + i_e * (I // G) * H,
                          (kb % n_ib) * BK, k_end, o_r, o_n, m_n, H, G)


@triton.jit
def _moe_down_row_kernel(h_ptr, w_ptr, s_ptr, z_ptr, id_ptr, tw_ptr, y_ptr, part_ptr, T, H, I, nib,
                         TOPK: tl.constexpr, KP: tl.constexpr, G: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, SPLIT_K: tl.constexpr, QUANT: tl.constexpr, STAGES: tl.constexpr):
    i_n, i_t, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < H
    o_j = tl.arange(0, KP)
    # [KP] this token's experts and routing weights
    b_ids = tl.load(id_ptr + i_t * TOPK + o_j, mask=o_j < TOPK, other=0)
    b_tws = tl.load(tw_ptr + i_t * TOPK + o_j, mask=o_j < TOPK, other=0)
    n_ib = I // BK
    kb_per = tl.cdiv(TOPK * n_ib, SPLIT_K)
    kb_end = tl.minimum(kb_per * (i_s + 1), TOPK * n_ib)
    if QUANT:
        o_r = tl.arange(0, BK // 8)
        acc = tl.zeros([BN, BK // 8], tl.float32)
        if STAGES > 1:
            for kb in tl.range(kb_per * i_s, kb_end, num_stages=STAGES):
                j = kb // n_ib
                b_q, b_s, b_z = _down_tile_load(w_ptr, s_ptr, z_ptr, b_ids, o_j, kb, kb_end, n_ib, o_r, o_n, m_n,
                                                H, I, G, BK)
                b_tw = tl.sum(tl.where(o_j == j, b_tws, 0.0))
                p_x = h_ptr + (i_t * TOPK + j) * I + (kb % n_ib) * BK + o_r * 8
                acc += fma_tile(b_q, b_z.to(tl.float32), p_x, nib) * (b_s.to(tl.float32) * b_tw)
        else:
            b_q, b_s, b_z = _down_tile_load(w_ptr, s_ptr, z_ptr, b_ids, o_j, kb_per * i_s, kb_end, n_ib, o_r,
                                            o_n, m_n, H, I, G, BK)
            for kb in range(kb_per * i_s, kb_end):
                j = kb // n_ib
                n_q, n_s, n_z = _down_tile_load(w_ptr, s_ptr, z_ptr, b_ids, o_j, kb + 1, kb_end, n_ib, o_r, o_n,
                                                m_n, H, I, G, BK)
                b_tw = tl.sum(tl.where(o_j == j, b_tws, 0.0))
                p_x = h_ptr + (i_t * TOPK + j) * I + (kb % n_ib) * BK + o_r * 8
                acc += fma_tile(b_q, b_z.to(tl.float32), p_x, nib) * (b_s.to(tl.float32) * b_tw)
                b_q, b_s, b_z = n_q, n_s, n_z
    else:
        o_k = tl.arange(0, BK)
        acc = tl.zeros([BN, BK], tl.float32)
        for kb in range(kb_per * i_s, kb_end):
            j = kb // n_ib
            i0 = (kb % n_ib) * BK
            b_tw = tl.sum(tl.where(o_j == j, b_tws, 0.0))
            i_e = tl.sum(tl.where(o_j == j, b_ids, 0)).to(tl.int64)
            # [BK]
            b_x = tl.load(h_ptr + (i_t * TOPK + j) * I + i0 + o_k).to(tl.float32) * b_tw
            # [BN, BK]
            b_w = tl.load(w_ptr + i_e * H * I + o_n[:, None] * I + (i0 + o_k)[None, :], mask=m_n[:, None], other=0)
            acc += b_w.to(tl.float32) * b_x[None, :]
    b_y = tl.sum(acc, axis=1)
    if SPLIT_K == 1:
        tl.store(y_ptr + i_t * H + o_n, b_y.to(y_ptr.dtype.element_ty), mask=m_n)
    else:
        tl.store(part_ptr + (i_s * T + i_t) * H + o_n, b_y, mask=m_n)


# ---------------------------------------------------------------- sorted kernels (prefill)
@triton.jit
def _moe_gemm_kernel(a_ptr, w_ptr, s_ptr, z_ptr, sorted_ptr, bexp_ptr, npost_ptr, tw_ptr, out_ptr,
                     TK, N, K, stride_am, nib2, A_DIV: tl.constexpr, G: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, QUANT: tl.constexpr,
                     UP: tl.constexpr, INTERPRET: tl.constexpr):
    """UP: out[row] = silu(a W_gate) * (a W_up), a = x[row // A_DIV], W = [E, ., 2N].
    else: out[row] = topk_weight[row] * (a W), a = h[row], W = [E, ., N]."""
    DT: tl.constexpr = a_ptr.dtype.element_ty
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    if i_b * BM >= tl.load(npost_ptr):
        return
    i_e = tl.load(bexp_ptr + i_b).to(tl.int64)
    o_p = i_b * BM + tl.arange(0, BM)
    # [BM] flat (token, slot) ids; padding holds TK
    b_row = tl.load(sorted_ptr + o_p)
    m_p = b_row < TK
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    o_k = tl.arange(0, BK)
    if UP:
        NW = 2 * N
    else:
        NW = N
    acc = tl.zeros([BN, BM], tl.float32)
    acc_u = tl.zeros([BN, BM], tl.float32)
    if QUANT:
        o_r = tl.arange(0, BK // 8)
        p_w = w_ptr + i_e * (K // 8) * NW
        p_s = s_ptr + i_e * (K // G) * NW
        p_z = z_ptr + i_e * (K // G) * NW
        for k0 in range(0, K, BK):
            # [BK, BM]
            b_a = tl.load(a_ptr + (b_row // A_DIV)[None, :] * stride_am + (k0 + o_k)[:, None], mask=m_p[None, :],
                          other=0)
            o_q = (k0 // 8 + o_r)[None, :] * NW + o_n[:, None]
            o_sz = (k0 // G) * NW + o_n[:, None] + 0 * o_r[None, :]
            # [BN, BK // 8]
            b_q = tl.load(p_w + o_q, mask=m_n[:, None], other=0)
            b_s = tl.load(p_s + o_sz, mask=m_n[:, None], other=0)
            b_z = tl.load(p_z + o_sz, mask=m_n[:, None], other=0).to(tl.float32)
            acc = mma(dequant_tile(b_q, b_s, b_z, nib2, DT, INTERPRET), b_a, acc, INTERPRET)
            if UP:
                b_q = tl.load(p_w + o_q + N, mask=m_n[:, None], other=0)
                b_s = tl.load(p_s + o_sz + N, mask=m_n[:, None], other=0)
                b_z = tl.load(p_z + o_sz + N, mask=m_n[:, None], other=0).to(tl.float32)
                acc_u = mma(dequant_tile(b_q, b_s, b_z, nib2, DT, INTERPRET), b_a, acc_u, INTERPRET)
    else:
        p_w = w_ptr + i_e * NW * K
        for k0 in range(0, K, BK):
            m_k = (k0 + o_k) < K
            # [BK, BM]
            b_a = tl.load(a_ptr + (b_row // A_DIV)[None, :] * stride_am + (k0 + o_k)[:, None],
                          mask=m_p[None, :] & m_k[:, None], other=0)
            # [BN, BK] torch layout [out, in]
            b_w = tl.load(p_w + o_n[:, None] * K + (k0 + o_k)[None, :], mask=m_n[:, None] & m_k[None, :], other=0)
            acc = mma(b_w.to(DT), b_a, acc, INTERPRET)
            if UP:
                b_w = tl.load(p_w + (N + o_n)[:, None] * K + (k0 + o_k)[None, :], mask=m_n[:, None] & m_k[None, :],
                              other=0)
                acc_u = mma(b_w.to(DT), b_a, acc_u, INTERPRET)
    if UP:
        acc = acc * tl.sigmoid(acc) * acc_u
    else:
        acc = acc * tl.load(tw_ptr + b_row, mask=m_p, other=0)[None, :]
    tl.store(out_ptr + b_row[None, :] * N + o_n[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=m_n[:, None] & m_p[None, :])


@triton.jit
def _combine_kernel(y_ptr, out_ptr, H, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    i_t, i_b = tl.program_id(0), tl.program_id(1)
    o_n = i_b * BLOCK + tl.arange(0, BLOCK)
    m_n = o_n < H
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOPK):
        # [BLOCK]
        acc += tl.load(y_ptr + (i_t * TOPK + j) * H + o_n, mask=m_n, other=0).to(tl.float32)
    tl.store(out_ptr + i_t * H + o_n, acc.to(out_ptr.dtype.element_ty), mask=m_n)


# ---------------------------------------------------------------- launch table
@dataclass(frozen=True)
class MoeTable:
    row_max: int                # T * top_k at or below which the row kernels run
    up_row: GemvConfig          # waves unused: the up pass cannot split K (SiLU needs the full sum)
    down_row: GemvConfig
    gemm: tuple                 # ((max rows per expert on average, GemmConfig), ...) ascending
    decode: tuple | None = None     # W4A16 rows <= row_max: (up, down) GemvConfig of moe.decode
    decode_pdl: int = 0             # programmatic dependent launch (sm_90 on): 1 the down kernel, 2 both


# Row kernels: wide K tiles put a program's bytes in flight at once (their loads are not pipelined);
# the down pass splits the token's top_k * I rows over programs. sm_90's GEMM tiles stay under its
# 227 KB of shared memory with dense experts too (two weight tiles per stage in the gate_up pass).
# The sm_90 choices come from bench/bench_gemm.py --sweep on an H200. W4A16 decode (bench_moe.py --sweep): the
# dense GEMV's 64 x 512 tile in both passes, split toward 16 waves, the down kernel a programmatic
# dependent launch: 12.8 us for one token against 15.5 for the row kernels (decode=None). Unsplit
# passes (16 columns x all of K a program, the down pass as one tile of all top_k experts' rows)
# measured 16.7-21.4 us (sm_70/sm_80 take the tiles unmeasured, without PDL, which needs sm_90).
_DECODE = (GemvConfig(64, 512, 4, 1, 16), GemvConfig(64, 512, 4, 1, 16))
TABLES = {
    "sm70": MoeTable(32, GemvConfig(16, 512, 4, 1, 1), GemvConfig(32, 512, 4, 1, 4), (
        (16, GemmConfig(16, 64, 64, 4, 1)),
        (1 << 30, GemmConfig(64, 64, 32, 4, 2)),
    ), _DECODE),
    "sm80": MoeTable(32, GemvConfig(16, 512, 4, 1, 1), GemvConfig(32, 512, 4, 1, 4), (
        (16, GemmConfig(16, 64, 64, 4, 3)),
        (64, GemmConfig(64, 64, 64, 4, 3)),
        (1 << 30, GemmConfig(128, 128, 32, 8, 3)),
    ), _DECODE),
    "sm90": MoeTable(32, GemvConfig(16, 1024, 4, 1, 1), GemvConfig(32, 512, 4, 1, 2), (
        (16, GemmConfig(16, 64, 64, 4, 4)),
        (64, GemmConfig(64, 128, 64, 4, 3)),
        (1 << 30, GemmConfig(128, 128, 64, 8, 3)),
    ), _DECODE, decode_pdl=1),
}


def _dense_bk(bk: int, k: int) -> int:
    """The down pass's K-blocks must not straddle two experts: BK divides I."""
    bk = gemv_block_k(bk, k)
    if bk < 8:
        raise ConfigError(f"fused_moe: expert intermediate size {k} must be a multiple of 8")
    return bk


def _weights(w, quant: bool):
    if quant:
        return w.qweight.contiguous(), w.scales.contiguous(), w.zeros.contiguous(), w.group_size
    w = w.contiguous()
    return w, w, w, 1


def fused_moe(x, w13, w2, topk_weights, topk_ids):
    """Triton twin of :func:`catengine.kernels.moe.naive.fused_moe`."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ConfigError(f"fused_moe runs fp16/bf16 activations on CUDA, got {x.dtype}; "
                          "load the model with dtype float16 or bfloat16")
    quant = isinstance(w13, QuantizedWeight)
    if quant != isinstance(w2, QuantizedWeight):
        raise KernelContractError("fused_moe: w13 and w2 must both be QuantizedWeight or both dense tensors")
    t, hid = x.shape
    top_k = topk_ids.shape[1]
    if quant:
        e, inter = w13.qweight.shape[0], w13.out_features // 2
    else:
        e, inter = w13.shape[0], w13.shape[1] // 2
    # fp32 out: the twin's contract (the weighted sum, unrounded, goes to the residual add)
    out = torch.empty((t, hid), dtype=torch.float32, device=x.device)
    if t == 0:
        return out
    x = x if x.stride(-1) == 1 else x.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    tw = topk_weights.to(torch.float32).contiguous()
    w13_q, w13_s, w13_z, g13 = _weights(w13, quant)
    w2_q, w2_s, w2_z, g2 = _weights(w2, quant)
    key, sms = device_key(x.device)
    table = TABLES[key]
    if quant and t * top_k <= table.row_max and table.decode is not None:
        return moe_decode(x, w13, w2, tw, ids, *table.decode, sms, table.row_max, table.decode_pdl)
    h = torch.empty((t * top_k, inter), dtype=x.dtype, device=x.device)
    if t * top_k <= table.row_max:
        c = table.up_row
        bk = gemv_block_k(c.BK, hid) if quant else c.BK
        _moe_up_row_kernel[(triton.cdiv(inter, c.BN), t * top_k)](
            x, w13_q, w13_s, w13_z, ids, h, hid, inter, x.stride(0), NIB, TOPK=top_k, G=g13, BN=c.BN,
            BK=bk, QUANT=quant, num_warps=c.num_warps, num_stages=c.num_stages)
        c = table.down_row
        bk = _dense_bk(c.BK, inter)
        split = pick_split(triton.cdiv(hid, c.BN) * t, top_k * inter // bk, c.waves, sms)
        part = torch.empty((split, t, hid), dtype=torch.float32, device=x.device) if split > 1 else out
        _moe_down_row_kernel[(triton.cdiv(hid, c.BN), t, split)](
            h, w2_q, w2_s, w2_z, ids, tw, out, part, t, hid, inter, NIB, TOPK=top_k,
            KP=triton.next_power_of_2(top_k), G=g2, BN=c.BN,
            BK=bk, SPLIT_K=split, QUANT=quant, STAGES=c.num_stages, num_warps=c.num_warps,
            num_stages=c.num_stages)
        if split > 1:
            splitk_reduce_kernel[(t, triton.cdiv(hid, REDUCE_BLOCK))](
                part, out, out, t, hid, out.stride(0), SPLIT_K=split, BLOCK=REDUCE_BLOCK, HAS_BIAS=False,
                num_warps=4)
        return out
    c = next(cfg for max_rows, cfg in table.gemm if t * top_k <= max_rows * e)
    sorted_ids, block_expert, n_post = align_tokens(ids, e, c.BM)
    grid_b = block_expert.numel()
    bk13 = block_k(c.BK, g13, hid) if quant else c.BK
    _moe_gemm_kernel[(grid_b, triton.cdiv(inter, c.BN))](
        x, w13_q, w13_s, w13_z, sorted_ids, block_expert, n_post, tw, h, t * top_k, inter, hid,
        x.stride(0), NIB2, A_DIV=top_k, G=g13, BM=c.BM, BN=c.BN, BK=bk13, QUANT=quant, UP=True,
        INTERPRET=INTERPRET, num_warps=c.num_warps, num_stages=c.num_stages)
    # each row's weighted expert output: fp32 for fp16 activations (one expert's output alone can pass
    # 65,504), the activation dtype for bf16 (its range is fp32's; half the bytes of this scratch)
    y = torch.empty((t * top_k, hid), dtype=torch.float32 if x.dtype == torch.float16 else x.dtype, device=x.device)
    bk2 = block_k(c.BK, g2, inter) if quant else c.BK
    _moe_gemm_kernel[(grid_b, triton.cdiv(hid, c.BN))](
        h, w2_q, w2_s, w2_z, sorted_ids, block_expert, n_post, tw, y, t * top_k, hid, inter,
        h.stride(0), NIB2, A_DIV=1, G=g2, BM=c.BM, BN=c.BN, BK=bk2, QUANT=quant, UP=False,
        INTERPRET=INTERPRET, num_warps=c.num_warps, num_stages=c.num_stages)
    _combine_kernel[(t, triton.cdiv(hid, REDUCE_BLOCK))](y, out, hid, TOPK=top_k, BLOCK=REDUCE_BLOCK,
                                                          num_warps=4)
    return out




# ---------------------------------------------------------------- ahead-of-time list
_ARGS = {
    "_moe_up_row_kernel": "x_ptr w_ptr s_ptr z_ptr id_ptr h_ptr H I stride_xm nib TOPK G BN BK QUANT",
    "_moe_down_row_kernel": "h_ptr w_ptr s_ptr z_ptr id_ptr tw_ptr y_ptr part_ptr T H I nib TOPK KP G BN BK SPLIT_K "
                            "QUANT STAGES",
    "_moe_gemm_kernel": "a_ptr w_ptr s_ptr z_ptr sorted_ptr bexp_ptr npost_ptr tw_ptr out_ptr TK N K stride_am nib2 "
                        "A_DIV G BM BN BK QUANT UP INTERPRET",
    "_combine_kernel": "y_ptr out_ptr H TOPK BLOCK",
}


def _cfg(kernel, types, consts, warps, stages, name):
    """Pointer and size types from ``types``; other lower-case names are i32, the rest constexpr."""
    sig = {a: types.get(a, "i32" if a.islower() else "constexpr") for a in _ARGS[kernel].split()}
    return AotConfig(kernel, sig, consts, warps, stages, name)


def aot_configs(cc: int) -> list[AotConfig]:
    """The table's configurations for Qwen3.6-35B-A3B's shapes (top-8, group 128), quantised and
    dense experts, each activation dtype the architecture has (no bf16 before sm_80)."""
    table = TABLES[arch_key(cc)]
    out = []
    for dt in ("fp16",) + (("bf16",) if cc >= 80 else ()):
        for quant in (True, False):
            ty = {p: f"*{dt}" for p in ("x_ptr", "h_ptr", "a_ptr", "y_ptr", "out_ptr", "s_ptr", "z_ptr")}
            ty.update({p: "*i32" for p in ("id_ptr", "sorted_ptr", "bexp_ptr", "npost_ptr")})
            # y_ptr: the row down kernel's output, fp32 (fused_moe returns the unrounded sum)
            ty.update(w_ptr="*i32" if quant else f"*{dt}", tw_ptr="*fp32", part_ptr="*fp32", y_ptr="*fp32",
                      H="i32", I="i32",
                      T="i32", TK="i32", N="i32", K="i32")
            tag = f"{dt} {'w4' if quant else 'dense'}"
            c = table.up_row
            out.append(_cfg("_moe_up_row_kernel", ty, dict(TOPK=8, G=128, BN=c.BN, BK=c.BK, QUANT=quant),
                            c.num_warps, c.num_stages, f"up_row {tag}"))
            c = table.down_row
            out += [_cfg("_moe_down_row_kernel", ty, dict(TOPK=8, KP=8, G=128, BN=c.BN, BK=c.BK, SPLIT_K=split,
                                                          QUANT=quant, STAGES=c.num_stages), c.num_warps, c.num_stages,
                         f"down_row {tag} split{split}") for split in (1, 4)]
            # the down pass's out_ptr is the weighted rows y: fp32 for fp16 (see fused_moe)
            ty_down = {**ty, "out_ptr": "*fp32" if dt == "fp16" else f"*{dt}"}
            out += [_cfg("_moe_gemm_kernel", ty if up else ty_down, dict(A_DIV=8 if up else 1, G=128, BM=c.BM,
                                                                         BN=c.BN, BK=c.BK, QUANT=quant, UP=up,
                                                                         INTERPRET=False), c.num_warps,
                         c.num_stages, f"gemm rows<={max_rows} {tag} {'up' if up else 'down'}")
                    for max_rows, c in table.gemm for up in (True, False)]
        ty = {"logit_ptr": f"*{dt}", "w_ptr": "*fp32", "id_ptr": "*i32", "T": "i32", "E": "i32", "H": "i32",
              "y_ptr": "*fp32" if dt == "fp16" else f"*{dt}", "out_ptr": "*fp32"}
        out.append(_cfg("_combine_kernel", ty, dict(TOPK=8, BLOCK=REDUCE_BLOCK), 4, 1, f"combine {dt}"))
    if table.decode is not None:
        out += decode_aot_configs(cc, *table.decode, table.decode_pdl)
    return out
