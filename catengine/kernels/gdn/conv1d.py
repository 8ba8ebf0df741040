"""Causal depthwise conv1d of the Gated DeltaNet layers (prefill over a varlen batch, and decode).

Both forms read the last Kc-1 *pre-conv* inputs of each sequence from its state slot
(``conv_states[slot]``: [Kc-1, C], channels contiguous) and write the new last Kc-1 back.

The varlen form is two launches: the conv over flat token tiles (a tile may straddle sequences; one
binary search over ``query_start_loc`` finds the tiles near a sequence start, whose first rows are
redone with the state, so no host sync and no per-sequence padding), then one program per (sequence,
channel block) that writes the new state. The split is what makes it race-free: a program of the first
launch may read the *old* state of a slot that the second launch overwrites.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..common.aot import AotConfig
from ..common.arch import arch_from_cc, arch_of


@dataclass(frozen=True)
class ConvLaunch:
    BT: int          # tokens per program (varlen conv only)
    BC: int          # channels per program
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class ConvTable:
    fwd: ConvLaunch      # causal_conv1d_fwd_kernel
    state: ConvLaunch    # causal_conv1d_state_kernel
    update: ConvLaunch   # causal_conv1d_update_kernel


# Memory-bound. The prefill tile is BT rows of BC channels walked row by row. sm_90 from the H200 sweep
# (bench_gdn.py --sweep, 8 x 4K ragged, ms): (16, 512, 4 warps) 0.378, (32, 512, 4) 0.409, (64, 512, 4)
# 0.481, (16, 1024, 4) 0.489, (32, 512, 2) 0.523; the former [BT, BC] tile with shifted tap loads 0.507
# at best. ptxas: 64 registers, no spills. sm_80 and sm_70 follow it unmeasured (sm_70: 1 stage, as
# there is no loop to pipeline anyway).
TABLE = {
    70: ConvTable(ConvLaunch(16, 512, 4, 1), ConvLaunch(1, 256, 2, 1), ConvLaunch(1, 256, 2, 1)),
    80: ConvTable(ConvLaunch(16, 512, 4, 1), ConvLaunch(1, 256, 2, 1), ConvLaunch(1, 512, 4, 1)),
    90: ConvTable(ConvLaunch(16, 512, 4, 1), ConvLaunch(1, 512, 4, 1), ConvLaunch(1, 512, 4, 1)),
}


@functools.cache
def device_table(device: torch.device) -> ConvTable:
    # the interpreter (CI) gets the sm_80 row: any entry works there
    return TABLE[arch_of(device)]


@triton.jit
def _x_row(x, t, t_end, o_c, C, stride_x_t):
    """Row t of x ([BC] channels), zeros outside [0, t_end). The row bound enters the mask through the
    channel bound (the interpreter cannot AND a scalar bool into a block)."""
    n_c = tl.where((t >= 0) & (t < t_end), C, 0)
    return tl.load(x + t.to(tl.int64) * stride_x_t + o_c, mask=o_c < n_c, other=0.)


@triton.jit
def _lag_weight(w, o_c, m_c, stride_w_c, KC: tl.constexpr, LAG: tl.constexpr):
    """[BC] fp32 weight of input row t - LAG in output row t."""
    return tl.load(w + o_c * stride_w_c + (KC - 1 - LAG), mask=m_c, other=0.).to(tl.float32)


@triton.jit
def _seq_of(qsl, B, N_SEARCH, t):
    """The sequence of token t: the largest b in [0, B) with qsl[b] <= t (qsl[0] = 0 keeps it valid)."""
    lo = t * 0
    hi = lo + B
    for _ in range(N_SEARCH):
        mid = (lo + hi) // 2
        ok = tl.load(qsl + mid) <= t
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return lo


@triton.jit
def causal_conv1d_fwd_kernel(x, w, conv_states, qsl, state_slots, has_init, out,
                             T, C, B, N_SEARCH, stride_x_t, stride_o_t, stride_s_slot, stride_w_c,
                             KC: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, SILU: tl.constexpr):
    # A program walks BT rows of BC channels one row at a time. For KC <= 4 the previous KC-1 input rows
    # stay in registers (a sliding window), so every x row is read once. The former [BT, BC] tile with
    # KC shifted loads fetched each row KC times through L1 (H200, 8 x 4K: 0.507 ms against 0.378).
    i_t, i_c = tl.program_id(0), tl.program_id(1)
    t0 = i_t * BT
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    DT = out.dtype.element_ty
    if KC <= 4:
        # First as if no sequence started near the tile; rows within KC-1 of a sequence start are redone
        # below. Nothing here waits for the sequence search. ptxas never moves a load of x above a store
        # to out (they might alias), so the loads run four rows ahead of the stores by hand:
        # xm1..xm3 are the rows before the current one, x0..x3 the current one and the next three.
        w0 = _lag_weight(w, o_c, m_c, stride_w_c, KC, 0)
        w1 = _lag_weight(w, o_c, m_c, stride_w_c, KC, 1)
        xm1 = _x_row(x, t0 - 1, t0, o_c, C, stride_x_t)
        if KC > 2:
            w2 = _lag_weight(w, o_c, m_c, stride_w_c, KC, 2)
            xm2 = _x_row(x, t0 - 2, t0, o_c, C, stride_x_t)
        if KC > 3:
            w3 = _lag_weight(w, o_c, m_c, stride_w_c, KC, 3)
            xm3 = _x_row(x, t0 - 3, t0, o_c, C, stride_x_t)
        t_end = tl.minimum(t0 + BT, T)
        x0 = _x_row(x, t0, t_end, o_c, C, stride_x_t)
        x1 = _x_row(x, t0 + 1, t_end, o_c, C, stride_x_t)
        x2 = _x_row(x, t0 + 2, t_end, o_c, C, stride_x_t)
        x3 = _x_row(x, t0 + 3, t_end, o_c, C, stride_x_t)
        for r in tl.static_range(BT):
            x4 = _x_row(x, t0 + r + 4, t_end, o_c, C, stride_x_t)
            acc = w0 * x0.to(tl.float32) + w1 * xm1.to(tl.float32)
            if KC > 2:
                acc += w2 * xm2.to(tl.float32)
            if KC > 3:
                acc += w3 * xm3.to(tl.float32)
                xm3 = xm2
            if KC > 2:
                xm2 = xm1
            xm1, x0, x1, x2, x3 = x0, x1, x2, x3, x4
            if SILU:
                acc = acc * tl.sigmoid(acc)
            n_c = tl.where(t0 + r < T, C, 0)
            tl.store(out + (t0 + r).to(tl.int64) * stride_o_t + o_c, acc.to(DT), mask=o_c < n_c)
    # Starts only grow with the sequence index, so if the sequence of the tile's last row started KC-1
    # or more rows before the tile, every window above stayed inside one sequence.
    b_last = _seq_of(qsl, B, N_SEARCH, tl.minimum(t0 + BT, T) - 1)
    if (tl.load(qsl + b_last) > t0 - KC + 1) | (KC > 4):
        # Row by row, each tap from x or, before its sequence's start, from the sequence's state slot
        # (row KC-1+src-bos), or zeros without an initial state. Stores of the rows the window got
        # right are masked off; the others overwrite what the window wrote, from the same threads
        # (same [BC] layout), so program order alone orders the two stores.
        for i_r in range(BT):
            t = t0 + i_r
            b = _seq_of(qsl, B, N_SEARCH, t)
            bos = tl.load(qsl + b)
            slot = tl.load(state_slots + b).to(tl.int64)
            has = tl.load(has_init + b) != 0
            acc = tl.zeros([BC], dtype=tl.float32)
            for j in tl.static_range(KC):
                src = t - (KC - 1) + j
                in_x = src >= bos
                p_row = tl.where(in_x, x + src.to(tl.int64) * stride_x_t,
                                 conv_states + slot * stride_s_slot + (KC - 1 + src - bos) * C)
                n_c = tl.where((t < T) & (in_x | has), C, 0)
                b_x = tl.load(p_row + o_c, mask=o_c < n_c, other=0.)
                acc += _lag_weight(w, o_c, m_c, stride_w_c, KC, KC - 1 - j) * b_x.to(tl.float32)
            if SILU:
                acc = acc * tl.sigmoid(acc)
            redo = (t - bos < KC - 1) | (KC > 4)
            n_c = tl.where((t < T) & redo, C, 0)
            tl.store(out + t.to(tl.int64) * stride_o_t + o_c, acc.to(DT), mask=o_c < n_c)


@triton.jit
def causal_conv1d_state_kernel(x, conv_states, qsl, state_slots, has_init, C, stride_x_t, stride_s_slot,
                               KC: tl.constexpr, KP: tl.constexpr, BC: tl.constexpr):
    i_b, i_c = tl.program_id(0), tl.program_id(1)
    bos = tl.load(qsl + i_b)
    n = tl.load(qsl + i_b + 1) - bos
    slot = tl.load(state_slots + i_b).to(tl.int64)
    # scalar conditions enter masks as row bounds (the interpreter cannot AND a scalar bool into a block)
    n_old = tl.where(tl.load(has_init + i_b) != 0, KC - 1, 0)
    n_rows = tl.where(n > 0, KC - 1, 0)  # an empty sequence keeps its state
    o_c = i_c * BC + tl.arange(0, BC)
    o_r = tl.arange(0, KP)
    m_c = o_c < C
    m_r = o_r < n_rows
    # new row r is row n + r of [old state (KC-1 rows); x (n rows)]
    o_src = n + o_r
    m_old = m_r & (o_src < n_old)
    m_new = m_r & (o_src >= KC - 1)
    p_old = conv_states + slot * stride_s_slot + o_src[:, None] * C + o_c[None, :]
    p_x = x + (bos + o_src - (KC - 1)).to(tl.int64)[:, None] * stride_x_t + o_c[None, :]
    # [KP, BC]
    b_old = tl.load(p_old, mask=m_old[:, None] & m_c[None, :], other=0.)
    b_x = tl.load(p_x, mask=m_new[:, None] & m_c[None, :], other=0.)
    b_new = tl.where(m_new[:, None], b_x.to(conv_states.dtype.element_ty), b_old)
    # rows are shifted in place: every thread must have read before any thread writes
    tl.debug_barrier()
    p_st = conv_states + slot * stride_s_slot + o_r[:, None] * C + o_c[None, :]
    tl.store(p_st, b_new, mask=m_r[:, None] & m_c[None, :])


@triton.jit
def causal_conv1d_update_kernel(x, w, conv_states, state_slots, out, C, stride_x_t, stride_o_t,
                                stride_s_slot, stride_w_c,
                                KC: tl.constexpr, KP: tl.constexpr, BC: tl.constexpr, SILU: tl.constexpr):
    i_b, i_c = tl.program_id(0), tl.program_id(1)
    slot = tl.load(state_slots + i_b).to(tl.int64)
    o_c = i_c * BC + tl.arange(0, BC)
    o_r = tl.arange(0, KP)
    m_c = o_c < C
    p_s = conv_states + slot * stride_s_slot + o_r[:, None] * C + o_c[None, :]
    # window = [state rows 0..KC-2; x], and the new state is window rows 1..KC-1
    # [KP, BC]
    b_s = tl.load(p_s, mask=(o_r < KC - 1)[:, None] & m_c[None, :], other=0.)
    b_s1 = tl.load(p_s + C, mask=(o_r < KC - 2)[:, None] & m_c[None, :], other=0.)
    # [BC]
    b_x = tl.load(x + i_b.to(tl.int64) * stride_x_t + o_c, mask=m_c, other=0.)
    # [KP, BC]
    b_w = tl.load(w + o_c[None, :] * stride_w_c + o_r[:, None], mask=(o_r < KC)[:, None] & m_c[None, :], other=0.)
    b_win = tl.where((o_r == KC - 1)[:, None], b_x[None, :].to(tl.float32), b_s.to(tl.float32))
    acc = tl.sum(b_win * b_w.to(tl.float32), 0)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out + i_b.to(tl.int64) * stride_o_t + o_c, acc.to(out.dtype.element_ty), mask=m_c)
    b_new = tl.where((o_r == KC - 2)[:, None], b_x[None, :].to(conv_states.dtype.element_ty), b_s1)
    tl.debug_barrier()
    tl.store(p_s, b_new, mask=(o_r < KC - 1)[:, None] & m_c[None, :])


# ---------------------------------------------------------------- host side
def _check(x, weight, conv_states):
    c, kc = weight.shape
    if x.shape[-1] != c or conv_states.shape[1:] != (kc - 1, c) or kc < 2:
        raise ValueError(f"causal_conv1d: x {tuple(x.shape)}, weight {tuple(weight.shape)} and conv_states "
                         f"{tuple(conv_states.shape)} must be [T, C], [C, Kc] and [slots, Kc-1, C] with Kc >= 2")
    if conv_states.dtype != x.dtype:
        raise ValueError(f"causal_conv1d: conv_states ({conv_states.dtype}) must have the dtype of x ({x.dtype})")
    if conv_states.stride(2) != 1 or conv_states.stride(1) != c:
        raise ValueError("causal_conv1d: conv_states is updated in place and must be contiguous per slot "
                         f"(strides {conv_states.stride()}); allocate it with torch.empty([slots, Kc-1, C])")


def _rows(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def causal_conv1d(x, weight, conv_states, query_start_loc, state_slots, has_initial_state,
                  activation: str | None = "silu"):
    """Triton twin of :func:`catengine.kernels.gdn.naive.causal_conv1d` (same signature)."""
    return causal_conv1d_with(x, weight, conv_states, query_start_loc, state_slots, has_initial_state, activation, None)


def causal_conv1d_update(x, weight, conv_states, state_slots, activation: str | None = "silu"):
    """Triton twin of :func:`catengine.kernels.gdn.naive.causal_conv1d_update` (same signature)."""
    return causal_conv1d_update_with(x, weight, conv_states, state_slots, activation, None)


def causal_conv1d_with(x, weight, conv_states, query_start_loc, state_slots, has_initial_state, activation,
                       table: ConvTable | None):
    """causal_conv1d with an explicit table (None: this device's); the benchmark tries others."""
    _check(x, weight, conv_states)
    x, weight = _rows(x), _rows(weight)
    t, c = x.shape
    kc = weight.shape[1]
    b = query_start_loc.shape[0] - 1
    out = torch.empty((t, c), dtype=x.dtype, device=x.device)
    if t == 0 or b == 0:
        return out
    cfg = table or device_table(x.device)
    f = cfg.fwd
    causal_conv1d_fwd_kernel[(triton.cdiv(t, f.BT), triton.cdiv(c, f.BC))](
        x, weight, conv_states, query_start_loc, state_slots, has_initial_state, out,
        t, c, b, b.bit_length(), x.stride(0), out.stride(0), conv_states.stride(0), weight.stride(0),
        KC=kc, BT=f.BT, BC=f.BC, SILU=activation == "silu", num_warps=f.num_warps, num_stages=f.num_stages)
    s = cfg.state
    causal_conv1d_state_kernel[(b, triton.cdiv(c, s.BC))](
        x, conv_states, query_start_loc, state_slots, has_initial_state, c, x.stride(0), conv_states.stride(0),
        KC=kc, KP=triton.next_power_of_2(kc), BC=s.BC, num_warps=s.num_warps, num_stages=s.num_stages)
    return out


def causal_conv1d_update_with(x, weight, conv_states, state_slots, activation, table: ConvTable | None):
    _check(x, weight, conv_states)
    x, weight = _rows(x), _rows(weight)
    b, c = x.shape
    kc = weight.shape[1]
    out = torch.empty((b, c), dtype=x.dtype, device=x.device)
    if b == 0:
        return out
    u = (table or device_table(x.device)).update
    causal_conv1d_update_kernel[(b, triton.cdiv(c, u.BC))](
        x, weight, conv_states, state_slots, out, c, x.stride(0), out.stride(0), conv_states.stride(0),
        weight.stride(0), KC=kc, KP=triton.next_power_of_2(kc), BC=u.BC, SILU=activation == "silu",
        num_warps=u.num_warps, num_stages=u.num_stages)
    return out




def aot_configs(cc: int) -> list[AotConfig]:
    """Every launch configuration of this architecture's table, for the model's Kc = 4 and each
    activation dtype each architecture serves (fp16 on sm_70, which has no bf16; bf16
    from sm_80 on: the fp16 build of the same tiles has the same shared-memory footprint)."""
    cfg = TABLE[arch_from_cc(cc)]
    dtypes = ["fp16"] if cc < 80 else ["bf16"]
    out = []
    for dt in dtypes:
        p = f"*{dt}"
        f, s, u = cfg.fwd, cfg.state, cfg.update
        out.append(AotConfig(
            "causal_conv1d_fwd_kernel",
            {"x": p, "w": p, "conv_states": p, "qsl": "*i32", "state_slots": "*i32", "has_init": "*i1", "out": p,
             "T": "i32", "C": "i32", "B": "i32", "N_SEARCH": "i32", "stride_x_t": "i32", "stride_o_t": "i32",
             "stride_s_slot": "i32", "stride_w_c": "i32",
             "KC": "constexpr", "BT": "constexpr", "BC": "constexpr", "SILU": "constexpr"},
            {"KC": 4, "BT": f.BT, "BC": f.BC, "SILU": True}, f.num_warps, f.num_stages, f"conv1d_fwd_{dt}"))
        out.append(AotConfig(
            "causal_conv1d_state_kernel",
            {"x": p, "conv_states": p, "qsl": "*i32", "state_slots": "*i32", "has_init": "*i1", "C": "i32",
             "stride_x_t": "i32", "stride_s_slot": "i32", "KC": "constexpr", "KP": "constexpr", "BC": "constexpr"},
            {"KC": 4, "KP": 4, "BC": s.BC}, s.num_warps, s.num_stages, f"conv1d_state_{dt}"))
        out.append(AotConfig(
            "causal_conv1d_update_kernel",
            {"x": p, "w": p, "conv_states": p, "state_slots": "*i32", "out": p, "C": "i32", "stride_x_t": "i32",
             "stride_o_t": "i32", "stride_s_slot": "i32", "stride_w_c": "i32",
             "KC": "constexpr", "KP": "constexpr", "BC": "constexpr", "SILU": "constexpr"},
            {"KC": 4, "KP": 4, "BC": u.BC, "SILU": True}, u.num_warps, u.num_stages, f"conv1d_update_{dt}"))
    return out
