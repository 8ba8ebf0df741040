"""Gated DeltaNet gating and recurrent decode / speculative verify (twins: ``gdn.naive.gdn_gating``,
``gdn.naive.recurrent_gated_delta_rule``, and their composition ``gdn.naive.gdn_gating_recurrent``, which the
decode step takes: the gating computed in the recurrent kernel, one launch a layer fewer); they share the chunked
form's launch table (``rec_bv``, ``rec_warps``) and input checks (:mod:`.table`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.aot import AotConfig
from ..common.arch import arch_from_cc
from .table import AOT_DIMS, TABLE, GDNTable, aot_config, aot_dtype, device_table, pad, prepare, rows


# ---------------------------------------------------------------- gating
@triton.jit
def gdn_gating_kernel(A_log, a, dt_bias, b, g, beta, T, HV, stride_a_t, stride_b_t,
                      BT: tl.constexpr, BH: tl.constexpr):
    i_t = tl.program_id(0)
    o_t = (i_t * BT + tl.arange(0, BT)).to(tl.int64)
    o_h = tl.arange(0, BH)
    m_h = o_h < HV
    m = (o_t < T)[:, None] & m_h[None, :]
    # [BH]
    b_A = tl.load(A_log + o_h, mask=m_h, other=0.).to(tl.float32)
    b_dt = tl.load(dt_bias + o_h, mask=m_h, other=0.).to(tl.float32)
    # [BT, BH]
    b_a = tl.load(a + o_t[:, None] * stride_a_t + o_h[None, :], mask=m, other=0.)
    b_b = tl.load(b + o_t[:, None] * stride_b_t + o_h[None, :], mask=m, other=0.)
    b_g, b_beta = gate(b_a, b_b, b_A[None, :], b_dt[None, :])
    p = o_t[:, None] * HV + o_h[None, :]
    tl.store(g + p, b_g, mask=m)
    tl.store(beta + p, b_beta, mask=m)


@triton.jit
def gate(b_a, b_b, b_A, b_dt):
    """g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) in fp32, elementwise: one expression for the gating
    kernel and the recurrent kernel's GATING form, so both give the same bits."""
    b_x = b_a.to(tl.float32) + b_dt
    # softplus as torch has it (threshold 20); log(1 + e) loses e < 1e-4 to rounding, so take its series there
    b_e = tl.exp(tl.minimum(b_x, 20.))
    b_sp = tl.where(b_x > 20., b_x, tl.where(b_e < 1e-4, b_e - 0.5 * b_e * b_e, tl.log(1. + b_e)))
    return -tl.exp(b_A) * b_sp, tl.sigmoid(b_b.to(tl.float32))



# ---------------------------------------------------------------- recurrent (decode, speculative verify)
@triton.jit
def gdn_recurrent_kernel(q, k, v, g, beta, A_log, dt_bias, o, ssm, qsl, state_slots, has_init, inter, HV, R, scale,
                         stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_g_t,
                         stride_beta_t, stride_o_t, stride_o_h, stride_ssm_slot, stride_inter_b,
                         K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                         USE_L2NORM: tl.constexpr, HAS_INTER: tl.constexpr, GATING: tl.constexpr = False):
    # GATING: g and beta hold the gating's inputs a and b (rows stride_g_t / stride_beta_t apart), and the kernel
    # computes g and beta itself from them, A_log and dt_bias (gate(), as gdn_gating_kernel does)
    # the V blocks of one head are neighbours in launch order, so together they read whole 512-byte state
    # rows (H200, 27B shape: batch 64 0.72 -> 0.84 of copy bandwidth, 256 0.74 -> 0.89, against all
    # heads' first halves, then all second halves)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_bh, i_v = tl.program_id(0) // NV, tl.program_id(0) % NV
    i_b, i_h = i_bh // HV, i_bh % HV
    i_hk = i_h // R
    bos, eos = tl.load(qsl + i_b), tl.load(qsl + i_b + 1)
    slot = tl.load(state_slots + i_b).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    n_init = tl.where(tl.load(has_init + i_b) != 0, K, 0)
    o_s = i_h * K * V + o_k[:, None] * V + o_v[None, :]
    # [BK, BV]
    # the slot may be fp16/bf16 (mamba_ssm_cache_dtype): the state is carried in fp32, rounded only when stored
    b_h = tl.load(ssm + slot * stride_ssm_slot + o_s, mask=(o_k < n_init)[:, None] & m_v[None, :],
                  other=0.).to(tl.float32)
    if GATING:
        b_A = tl.load(A_log + i_h).to(tl.float32)
        b_dt = tl.load(dt_bias + i_h).to(tl.float32)
    for i_t in range(0, eos - bos):
        t = bos + i_t
        t64 = t.to(tl.int64)
        # [BK]
        b_q = tl.load(q + t64 * stride_q_t + i_hk * stride_q_h + o_k, mask=m_k, other=0.).to(tl.float32)
        b_k = tl.load(k + t64 * stride_k_t + i_hk * stride_k_h + o_k, mask=m_k, other=0.).to(tl.float32)
        if USE_L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 0) + 1e-6)
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 0) + 1e-6)
        b_q = b_q * scale
        # [BV]
        b_v = tl.load(v + t64 * stride_v_t + i_h * stride_v_h + o_v, mask=m_v, other=0.).to(tl.float32)
        if GATING:
            b_g, b_beta = gate(tl.load(g + t64 * stride_g_t + i_h), tl.load(beta + t64 * stride_beta_t + i_h), b_A,
                               b_dt)
        else:
            b_g = tl.load(g + t64 * stride_g_t + i_h)
            b_beta = tl.load(beta + t64 * stride_beta_t + i_h)
        # S' = e S + k d^T with d = beta (v - e S^T k), and o = S'^T q = e S^T q + (q . k) d: both
        # reductions read the old state, so only one [BK, BV] block is live
        b_e = tl.exp(b_g)
        b_hk = tl.sum(b_h * b_k[:, None], 0)
        b_hq = tl.sum(b_h * b_q[:, None], 0)
        b_v = b_beta * (b_v - b_e * b_hk)
        b_o = b_e * b_hq + tl.sum(b_q * b_k, 0) * b_v
        # rounded to the slot dtype after every token (a no-op for fp32), as if stored and reloaded: k tokens
        # verified in one launch then give the state (and outputs) of k one-token decodes, so speculative
        # decoding keeps greedy output with a 16-bit state too
        b_h = (b_h * b_e + b_k[:, None] * b_v[None, :]).to(ssm.dtype.element_ty).to(tl.float32)
        tl.store(o + t64 * stride_o_t + i_h * stride_o_h + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
        if HAS_INTER:
            i_s = tl.load(inter + i_b * stride_inter_b + i_t).to(tl.int64)
            n_rows = tl.where(i_s >= 0, K, 0)
            tl.store(ssm + tl.maximum(i_s, 0) * stride_ssm_slot + o_s, b_h.to(ssm.dtype.element_ty),
                     mask=(o_k < n_rows)[:, None] & m_v[None, :])
    n_fin = tl.where(eos > bos, K, 0)
    tl.store(ssm + slot * stride_ssm_slot + o_s, b_h.to(ssm.dtype.element_ty),
             mask=(o_k < n_fin)[:, None] & m_v[None, :])


# ---------------------------------------------------------------- host side
def gdn_gating(A_log, a, dt_bias, b):
    """Triton twin of :func:`catengine.kernels.gdn.naive.gdn_gating` (same signature)."""
    a, b = rows(a), rows(b)
    t, hv = a.shape
    g = torch.empty((t, hv), dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    if t:
        bh = triton.next_power_of_2(hv)
        bt = max(1, 2048 // bh)
        gdn_gating_kernel[(triton.cdiv(t, bt),)](A_log.contiguous(), a, dt_bias.contiguous(), b, g, beta, t, hv,
                                                 a.stride(0), b.stride(0), BT=bt, BH=bh, num_warps=4)
    return g, beta


def recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                               has_initial_state, scale: float, use_qk_l2norm: bool = True,
                               intermediate_state_slots=None):
    """Triton twin of :func:`catengine.kernels.gdn.naive.recurrent_gated_delta_rule` (same signature)."""
    return recurrent_gated_delta_rule_with(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                                           has_initial_state, scale, use_qk_l2norm, intermediate_state_slots, None)


def gdn_gating_recurrent(q, k, v, A_log, a, dt_bias, b, ssm_states, query_start_loc, state_slots, has_initial_state,
                         scale: float, use_qk_l2norm: bool = True, intermediate_state_slots=None):
    """Triton twin of :func:`catengine.kernels.gdn.naive.gdn_gating_recurrent` (same signature): one launch."""
    hv = v.shape[1]
    if A_log.shape != (hv,) or dt_bias.shape != (hv,):
        raise ValueError(f"gdn_gating_recurrent: A_log and dt_bias must be [Hv] = [{hv}] (one per value head of v); "
                         f"got A_log {tuple(A_log.shape)}, dt_bias {tuple(dt_bias.shape)}")
    return recurrent_gated_delta_rule_with(q, k, v, a, b, ssm_states, query_start_loc, state_slots, has_initial_state,
                                           scale, use_qk_l2norm, intermediate_state_slots, None,
                                           (A_log.contiguous(), dt_bias.contiguous()))


def recurrent_gated_delta_rule_with(q, k, v, g, beta, ssm_states, qsl, state_slots, has_init, scale, use_qk_l2norm,
                                    inter, table: GDNTable | None, gating=None):
    """recurrent_gated_delta_rule with an explicit table (None: this device's); the benchmark tries others.
    ``gating`` = (A_log, dt_bias): g and beta are the gating's inputs a and b (gdn_gating_recurrent)."""
    q, k, v, g, beta, o, nb = prepare(q, k, v, g, beta, ssm_states, qsl,
                                      names=("g", "beta") if gating is None else ("a", "b"))
    t, hk, dk = q.shape
    hv, dv = v.shape[1:]
    if t == 0 or nb == 0:
        return o
    cfg = table or device_table(v.device)
    rec_bv, rec_warps = cfg.rec_launch(ssm_states.dtype)
    bk, bv = pad(dk), min(rec_bv, pad(dv))
    has_inter = inter is not None
    inter_arg = inter if has_inter else state_slots
    a_log, dt_bias = gating if gating is not None else (g, g)
    gdn_recurrent_kernel[(nb * hv * triton.cdiv(dv, bv),)](
        q, k, v, g, beta, a_log, dt_bias, o, ssm_states, qsl, state_slots, has_init, inter_arg, hv, hv // hk,
        float(scale),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
        o.stride(0), o.stride(1), ssm_states.stride(0), inter.stride(0) if has_inter else 0,
        K=dk, V=dv, BK=bk, BV=bv, USE_L2NORM=bool(use_qk_l2norm), HAS_INTER=has_inter, GATING=gating is not None,
        num_warps=rec_warps, num_stages=1)
    return o


def aot_configs(cc: int) -> list[AotConfig]:
    """The gating kernel and every recurrent launch of this architecture's table at the model's head
    dims (dk = dv = 128), in the activation dtype the architecture serves: with g and beta given, and with the
    gating in the kernel (GATING: g and beta are then a and b, in that dtype), as the decode step runs it."""
    c = TABLE[arch_from_cc(cc)]
    bv16, warps16 = c.rec_launch(torch.float16)
    dt = aot_dtype(cc)
    p, f32, i32 = f"*{dt}", "*fp32", "*i32"
    ptrs = {"q": p, "k": p, "v": p, "g": f32, "beta": f32, "A_log": f32, "dt_bias": f32, "o": p, "ssm": f32,
            "qsl": i32, "state_slots": i32, "has_init": "*i1", "inter": i32}
    fused = {**ptrs, "g": p, "beta": p}
    return [aot_config(gdn_gating_kernel, {"A_log": f32, "a": p, "dt_bias": f32, "b": p, "g": f32, "beta": f32},
                       {"BT": 32, "BH": 64}, 4, 1, f"gating_{dt}")] + [
        aot_config(gdn_recurrent_kernel, fused if gating else ptrs,
                   dict(AOT_DIMS, BV=c.rec_bv, HAS_INTER=inter, GATING=gating), c.rec_warps, 1,
                   f"recurrent{'_gating' * gating}{'_inter' * inter}_{dt}")
        for gating in (False, True) for inter in (False, True)] + [
        # 16-bit state slots (mamba_ssm_cache_dtype): the decode kernel that reads and writes them every token
        aot_config(gdn_recurrent_kernel, {**(fused if gating else ptrs), "ssm": f"*{sdt}"},
                   dict(AOT_DIMS, BV=bv16, HAS_INTER=False, GATING=gating), warps16, 1,
                   f"recurrent{'_gating' * gating}_{dt}_state_{sdt}")
        for gating in (False, True) for sdt in ("fp16",) + (("bf16",) if cc >= 80 else ())]
