"""Gated DeltaNet chunked prefill (WY / UT-transform form, chunk 64); the gating and the recurrent
decode are in :mod:`catengine.kernels.gdn_recurrent`, which shares this module's table and checks.

Chunked prefill over a varlen batch is two kernels (after a tiny one for chunk offsets):
1. ``gdn_chunk_wy_kernel`` (chunk x value head, all parallel): l2norm(k), cumulative log decay,
   A = beta K K^T * decay (strictly lower) and X = (I + A)^-1, by forward substitution on the four
   16x16 diagonal blocks and two block-merge levels; X goes to memory in the activation dtype.
2. ``gdn_chunk_scan_kernel`` (sequence x value head x dv block, sequential over chunks):
   v_new = u - w S = X (beta v - (beta k e^g) S), o = (q e^g) S + tril(q k^T * decay) v_new,
   S = e^{g_last} S + (k e^{g_last-g})^T v_new. w, u, the per-chunk states and v_new never touch
   memory (the output is fused into the scan).
When the scan alone cannot fill the GPU (one or two long sequences), the chunks are cut into
segments and the WY kernel of segment i+1 runs on a side stream while the scan does segment i.
Chunks never straddle sequences; program -> (sequence, chunk) is a binary search over the chunk
offsets, so nothing waits on the host. States are fp32; X and the matmul operands are in the
activation dtype with fp32 accumulation, as in flash-linear-attention.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .aot import AotConfig
from .arch import arch_from_cc, arch_of

BT = 64  # chunk length; the WY kernel is written for 4 sub-blocks of 16


@dataclass(frozen=True)
class GDNTable:
    wy_warps: int
    wy_dot: str             # precision of the fp32 block-merge products: "tf32" (sm_80+) or "ieee"
    scan_bv: int
    scan_warps: int
    scan_stages: int
    rec_bv: int
    rec_warps: int
    # overlap the WY kernel with the scan on a side stream when the scan has fewer programs than
    # this (it leaves SMs idle) and there are at least overlap_min_chunks chunks: up to
    # overlap_segments segments of at least overlap_min_chunks / 2 chunks each
    overlap_max_programs: int = 0
    overlap_min_chunks: int = 32
    overlap_segments: int = 8


_TABLE = {
    # sm_70: tl.dot is FMA (Triton >= 3.3), no tf32, no cp.async: small tiles, one stage, fp16 only
    70: GDNTable(wy_warps=4, wy_dot="ieee", scan_bv=32, scan_warps=4, scan_stages=1, rec_bv=32, rec_warps=4,
                 overlap_max_programs=80),
    # sm_90 from the H200 sweep (bench_gdn.py --sweep, whole op at 1 x 64K): overlap 8.08 ms vs 8.73
    # without, scan 8 warps (9.16 at 4), 2 stages (8.20 at 3, 8.39 at 1), WY 4 warps (9.69 at 8);
    # decode BV 64 / 4 warps. ptxas: WY fits 4 warps unspilled, the scan spills ~0.5 KB/thread at 8
    # warps (more at 4). sm_80 copies it unmeasured (no A100 here); 108 = the A100's SM count.
    80: GDNTable(wy_warps=4, wy_dot="tf32", scan_bv=64, scan_warps=8, scan_stages=2, rec_bv=64, rec_warps=4,
                 overlap_max_programs=108),
    90: GDNTable(wy_warps=4, wy_dot="tf32", scan_bv=64, scan_warps=8, scan_stages=2, rec_bv=64, rec_warps=4,
                 overlap_max_programs=132),
}


@functools.cache
def _device_table(device: torch.device) -> GDNTable:
    # the interpreter (CI) gets the sm_80 row
    return _TABLE[arch_of(device)]


# ---------------------------------------------------------------- shared helpers
@triton.jit
def _find_seq(cu, n, i):
    """The largest b in [0, n) with cu[b] <= i, for non-decreasing cu with cu[0] <= i."""
    lo = i * 0
    hi = lo + n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = tl.load(cu + mid) <= i
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return lo


@triton.jit
def gdn_chunk_offsets_kernel(qsl, cu_chunks, B, BT: tl.constexpr, BB: tl.constexpr):
    carry = tl.load(qsl) * 0
    tl.store(cu_chunks, carry)
    for i0 in range(0, B, BB):
        o_b = i0 + tl.arange(0, BB)
        m_b = o_b < B
        # [BB]
        b_n = tl.load(qsl + o_b + 1, mask=m_b, other=0) - tl.load(qsl + o_b, mask=m_b, other=0)
        b_c = (b_n + BT - 1) // BT
        tl.store(cu_chunks + o_b + 1, tl.cumsum(b_c, 0) + carry, mask=m_b)
        carry += tl.sum(b_c, 0)


# ---------------------------------------------------------------- chunked prefill
@triton.jit
def _wy_kkt(k, b_g, b_b, o_tt, m_t, i_hk, stride_k_t, stride_k_h, DT: tl.constexpr, K: tl.constexpr,
            BK: tl.constexpr, USE_L2NORM: tl.constexpr):
    """A = beta K K^T * decay: [64, 64], strictly lower."""
    o_t = tl.arange(0, 64)
    o_k = tl.arange(0, BK)
    # [64, BK], kept in the input dtype (an fp32 copy costs 64 more registers)
    b_k = tl.load(k + o_tt[:, None] * stride_k_t + i_hk * stride_k_h + o_k[None, :],
                  mask=m_t[:, None] & (o_k < K)[None, :], other=0.)
    b_n = tl.rsqrt(tl.sum(b_k.to(tl.float32) * b_k.to(tl.float32), 1) + 1e-6) if USE_L2NORM else b_b * 0 + 1.
    b_k = (b_k.to(tl.float32) * b_n[:, None]).to(DT)
    # above the diagonal the exponent is > 0: clamp it, the mask drops those entries anyway
    b_a = tl.dot(b_k, tl.trans(b_k))
    b_a = tl.where(o_t[:, None] > o_t[None, :], b_a * tl.exp(tl.minimum(b_g[:, None] - b_g[None, :], 0.)), 0.)
    return b_a * b_b[:, None]


@triton.jit
def gdn_chunk_wy_kernel(k, g, beta, x, qsl, cu_chunks, c_lo, B, HV, R, stride_k_t, stride_k_h, stride_g_t,
                        stride_beta_t, K: tl.constexpr, BK: tl.constexpr, USE_L2NORM: tl.constexpr,
                        DOT: tl.constexpr):
    i_c, i_h = tl.program_id(0) + c_lo, tl.program_id(1)
    i_hk = i_h // R
    i_b = _find_seq(cu_chunks, B, i_c)
    eos = tl.load(qsl + i_b + 1)
    t = tl.load(qsl + i_b) + (i_c - tl.load(cu_chunks + i_b)) * 64
    if t >= eos:
        return
    DT = x.dtype.element_ty
    o_t = tl.arange(0, 64)
    o_i = tl.arange(0, 16)
    o_s = tl.arange(0, 4)
    m_t = (t + o_t) < eos
    o_tt = (t + o_t).to(tl.int64)
    # [64]; rows past the end load g = 0, so the cumulative decay stays flat there
    b_g = tl.cumsum(tl.load(g + o_tt * stride_g_t + i_h, mask=m_t, other=0.), 0)
    b_b = tl.load(beta + o_tt * stride_beta_t + i_h, mask=m_t, other=0.)
    # the four 16x16 diagonal blocks of -A: [4, 16, 16]
    m_dd = (o_s[:, None, None, None] == o_s[None, None, :, None])  # [4, 1, 4, 1]: same 16-block
    b_a = _wy_kkt(k, b_g, b_b, o_tt, m_t, i_hk, stride_k_t, stride_k_h, DT, K, BK, USE_L2NORM)
    b_d = -tl.sum(tl.where(m_dd, tl.reshape(b_a, (4, 16, 4, 16)), 0.), 2)
    # forward substitution, all four blocks at once: step i turns row i into row i of X_ii - I,
    # reading only rows < i (already done); rows 0 and 1 are done from the start, rows past the
    # end of the sequence are zero
    for i in range(2, tl.minimum(eos - t, 16)):
        m_i = (o_i == i)[None, :, None]
        b_r = tl.sum(tl.where(m_i, b_d, 0.), 1)
        b_r = b_r + tl.where((o_i < i)[None, :], tl.sum(b_r[:, :, None] * b_d, 1), 0.)
        b_d = tl.where(m_i, b_r[:, None, :], b_d)
    b_d = b_d + (o_i[:, None] == o_i[None, :])[None, :, :].to(tl.float32)
    # block merge: with X_s the inverse of the s-blocks' diagonal, X_2s = X_s - X_s A_off X_s, A_off
    # the part of A inside a 2s-block but outside its s-blocks. [64, 64]
    b_x = tl.reshape(tl.where(m_dd, b_d[:, :, None, :], 0.), (64, 64))
    m_32 = (o_t // 32)[:, None] == (o_t // 32)[None, :]
    b_off = tl.where(m_32 & ((o_t // 16)[:, None] != (o_t // 16)[None, :]), b_a, 0.)
    b_x = b_x - tl.dot(tl.dot(b_x, b_off, input_precision=DOT), b_x, input_precision=DOT)
    b_off = tl.where(m_32, 0., b_a)
    b_x = b_x - tl.dot(tl.dot(b_x, b_off, input_precision=DOT), b_x, input_precision=DOT)
    tl.store(x + (o_tt * HV + i_h)[:, None] * 64 + o_t[None, :], b_x.to(DT), mask=m_t[:, None])


@triton.jit
def gdn_chunk_scan_kernel(q, k, v, x, g, beta, o, ssm, qsl, cu_chunks, state_slots, has_init, c_lo, c_hi, HV, R,
                          scale, stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_g_t,
                          stride_beta_t, stride_o_t, stride_o_h, stride_ssm_slot, K: tl.constexpr, V: tl.constexpr,
                          BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr):
    i_bh, i_v = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HV, i_bh % HV
    i_hk = i_h // R
    bos, eos = tl.load(qsl + i_b), tl.load(qsl + i_b + 1)
    c0 = tl.load(cu_chunks + i_b)
    # this launch's chunks [j0, j1) of the sequence: the global window [c_lo, c_hi) cut to it
    j0 = tl.maximum(c_lo - c0, 0)
    j1 = tl.minimum(c_hi, tl.load(cu_chunks + i_b + 1)) - c0
    if j1 <= j0:
        return
    slot = tl.load(state_slots + i_b).to(tl.int64)
    o_t = tl.arange(0, 64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    DT = x.dtype.element_ty
    # the slot holds a state to continue from after an earlier segment, or when has_initial_state
    # (scalar conditions become row bounds: the interpreter cannot AND a scalar bool into a block)
    n_init = tl.where(j0 > 0, K, tl.where(tl.load(has_init + i_b) != 0, K, 0))
    p_s = ssm + slot * stride_ssm_slot + i_h * K * V + o_k[:, None] * V + o_v[None, :]
    # [BK, BV]
    b_h = tl.load(p_s, mask=(o_k < n_init)[:, None] & m_v[None, :], other=0.)
    for t in range(bos + j0 * 64, bos + j1 * 64, 64):
        o_tt = (t + o_t).to(tl.int64)
        m_t = (t + o_t) < eos
        # [64]
        b_g = tl.load(g + o_tt * stride_g_t + i_h, mask=m_t, other=0.)
        b_b = tl.load(beta + o_tt * stride_beta_t + i_h, mask=m_t, other=0.)
        b_gl = tl.sum(b_g, 0)
        b_g = tl.cumsum(b_g, 0)
        # everything that does not depend on the state first, so that the fp32 copies of q and k
        # die before the state's products (register pressure)
        # [64, BK], [BK, 64]
        b_q = tl.load(q + o_tt[:, None] * stride_q_t + i_hk * stride_q_h + o_k[None, :],
                      mask=m_t[:, None] & m_k[None, :], other=0.).to(tl.float32)
        b_k = tl.load(k + o_tt[None, :] * stride_k_t + i_hk * stride_k_h + o_k[:, None],
                      mask=m_k[:, None] & m_t[None, :], other=0.).to(tl.float32)
        if USE_L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None]
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 0) + 1e-6)[None, :]
        b_q = b_q * scale
        # [64, 64]: causal q k^T * decay
        b_a = tl.dot(b_q.to(DT), b_k.to(DT))
        b_a = tl.where(o_t[:, None] >= o_t[None, :], b_a * tl.exp(tl.minimum(b_g[:, None] - b_g[None, :], 0.)), 0.)
        b_a = b_a.to(DT)
        b_qg = (b_q * tl.exp(b_g)[:, None]).to(DT)
        # (beta k e^g) as [64, BK] and k e^(g_last - g) as [BK, 64]
        b_kb = tl.trans((b_k * (b_b * tl.exp(b_g))[None, :]).to(DT))
        b_kd = (b_k * tl.exp(b_gl - b_g)[None, :]).to(DT)
        # [64, BV]
        b_v = tl.load(v + o_tt[:, None] * stride_v_t + i_h * stride_v_h + o_v[None, :],
                      mask=m_t[:, None] & m_v[None, :], other=0.).to(tl.float32) * b_b[:, None]
        # [64, 64]
        b_x = tl.load(x + (o_tt * HV + i_h)[:, None] * 64 + o_t[None, :], mask=m_t[:, None], other=0.)
        # v_new = u - w S = X (beta v - (beta k e^g) S): w and u never touch memory
        b_hd = b_h.to(DT)
        b_v = tl.dot(b_x, (b_v - tl.dot(b_kb, b_hd)).to(DT)).to(DT)
        b_o = tl.dot(b_qg, b_hd) + tl.dot(b_a, b_v)
        tl.store(o + o_tt[:, None] * stride_o_t + i_h * stride_o_h + o_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=m_t[:, None] & m_v[None, :])
        b_h = b_h * tl.exp(b_gl) + tl.dot(b_kd, b_v)
    tl.store(p_s, b_h, mask=m_k[:, None] & m_v[None, :])


# ---------------------------------------------------------------- host side
def _rows(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def _check(q, k, v, g, beta, ssm_states, chunk_size=BT):
    t, hk, dk = q.shape
    hv, dv = v.shape[1:]
    if k.shape != q.shape or v.shape[0] != t or hv % hk or g.shape != (t, hv) or beta.shape != (t, hv):
        raise ValueError(f"gated delta rule: q, k [T, Hk, dk], v [T, Hv, dv] with Hv a multiple of Hk, g and "
                         f"beta [T, Hv]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"gated delta rule: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if ssm_states.shape[1:] != (hv, dk, dv) or ssm_states.dtype != torch.float32 or \
            not ssm_states[0].is_contiguous():
        raise ValueError(f"gated delta rule: ssm_states must be fp32 [slots, {hv}, {dk}, {dv}], contiguous per "
                         f"slot; got {ssm_states.dtype} {tuple(ssm_states.shape)} strides {ssm_states.stride()}")
    if chunk_size != BT:
        raise ValueError(f"the Triton chunked gated delta rule uses chunk_size={BT}; got {chunk_size}")


def _prepare(q, k, v, g, beta, ssm_states, qsl, chunk_size=BT):
    """Checked inputs with unit stride in their last dim, the empty output [T, Hv, dv] and the number of
    sequences; shared by the chunked and the recurrent forms."""
    _check(q, k, v, g, beta, ssm_states, chunk_size)
    q, k, v, g, beta = (_rows(x) for x in (q, k, v, g, beta))
    o = torch.empty((q.shape[0],) + tuple(v.shape[1:]), dtype=v.dtype, device=v.device)
    return q, k, v, g, beta, o, qsl.shape[0] - 1


def _pad(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                           has_initial_state, scale: float, use_qk_l2norm: bool = True,
                           chunk_size: int = 64):
    """Triton twin of :func:`catengine.kernels.reference.chunk_gated_delta_rule` (same signature)."""
    o, steps = chunk_steps(q, k, v, g, beta, ssm_states, query_start_loc, state_slots, has_initial_state, scale,
                           use_qk_l2norm, chunk_size)
    for _, launch in steps:
        launch()
    return o


def chunk_steps(q, k, v, g, beta, ssm_states, qsl, state_slots, has_init, scale, use_qk_l2norm=True,
                chunk_size=BT, table: GDNTable | None = None):
    """The output tensor and the launches that fill it, in order, as (name, callable) pairs: the
    benchmark times them one by one and tries other tables."""
    q, k, v, g, beta, o, nb = _prepare(q, k, v, g, beta, ssm_states, qsl, chunk_size)
    t, hk, dk = q.shape
    hv, dv = v.shape[1:]
    if t == 0 or nb == 0:
        return o, []
    cfg = table or _device_table(v.device)
    bk, bv = _pad(dk), _pad(dv)
    sbv = min(cfg.scan_bv, bv)
    nt = (t + (BT - 1) * nb) // BT  # >= sum over sequences of ceil(len / BT)
    dev, dt, r, l2 = v.device, v.dtype, hv // hk, bool(use_qk_l2norm)
    cu = torch.empty(nb + 1, dtype=torch.int32, device=dev)
    x = torch.empty((t, hv, BT), dtype=dt, device=dev)  # row i of each chunk's (I + A)^-1

    def offsets():
        gdn_chunk_offsets_kernel[(1,)](qsl, cu, nb, BT=BT, BB=128, num_warps=4)

    def wy(c_lo=0, c_hi=nt):
        gdn_chunk_wy_kernel[(c_hi - c_lo, hv)](
            k, g, beta, x, qsl, cu, c_lo, nb, hv, r, k.stride(0), k.stride(1), g.stride(0), beta.stride(0),
            K=dk, BK=bk, USE_L2NORM=l2, DOT=cfg.wy_dot, num_warps=cfg.wy_warps, num_stages=1)

    def scan(c_lo=0, c_hi=nt):
        gdn_chunk_scan_kernel[(nb * hv, triton.cdiv(dv, sbv))](
            q, k, v, x, g, beta, o, ssm_states, qsl, cu, state_slots, has_init, c_lo, c_hi, hv, r, float(scale),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0),
            beta.stride(0), o.stride(0), o.stride(1), ssm_states.stride(0), K=dk, V=dv, BK=bk, BV=sbv,
            USE_L2NORM=l2, num_warps=cfg.scan_warps, num_stages=cfg.scan_stages)

    n_scan = nb * hv * triton.cdiv(dv, sbv)
    if n_scan >= cfg.overlap_max_programs or nt < cfg.overlap_min_chunks:
        return o, [("offsets", offsets), ("wy", wy), ("scan", scan)]
    seg = max(cfg.overlap_min_chunks // 2, triton.cdiv(nt, cfg.overlap_segments))
    windows = [(c, min(c + seg, nt)) for c in range(0, nt, seg)]

    def overlapped():
        """WY of segment i+1 on a side stream while the scan does segment i (the scan alone would
        leave SMs idle). Without CUDA (the interpreter) the same windows run in order."""
        offsets()
        if not v.is_cuda:
            for lo, hi in windows:
                wy(lo, hi)
                scan(lo, hi)
            return
        main, side = torch.cuda.current_stream(dev), torch.cuda.Stream(dev)
        side.wait_stream(main)
        done = []
        with torch.cuda.stream(side):
            for lo, hi in windows:
                wy(lo, hi)
                done.append(side.record_event())
        for (lo, hi), ev in zip(windows, done):
            main.wait_event(ev)
            scan(lo, hi)

    return o, [("wy+scan overlapped", overlapped)]


TRITON_OPS = {"chunk_gated_delta_rule": chunk_gated_delta_rule}


def _aot(kernel, ptrs: dict, consts: dict, num_warps: int, num_stages: int, name: str) -> AotConfig:
    """Signature from the kernel's argument names: pointers as given, ``scale`` fp32, other ints i32."""
    sig = {a: "constexpr" if a in consts else ptrs.get(a, "fp32" if a == "scale" else "i32")
           for a in kernel.arg_names}
    return AotConfig(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__, sig, consts,
                     num_warps, num_stages, name)


# the model's head dims, which every ahead-of-time build of the GDN kernels uses
AOT_DIMS = {"K": 128, "V": 128, "BK": 128, "USE_L2NORM": True}


def aot_dtype(cc: int) -> str:
    """The activation dtype an architecture serves: fp16 on sm_70, which has no bf16; bf16 from sm_80
    on (the fp16 build of the same tiles has the same shared-memory footprint)."""
    return "fp16" if cc < 80 else "bf16"


def aot_configs(cc: int) -> list[AotConfig]:
    """Every launch of this architecture's table at the model's head dims (dk = dv = 128)."""
    c = _TABLE[arch_from_cc(cc)]
    dt = aot_dtype(cc)
    p, f32, i32 = f"*{dt}", "*fp32", "*i32"
    return [
        _aot(gdn_chunk_wy_kernel, {"k": p, "g": f32, "beta": f32, "x": p, "qsl": i32, "cu_chunks": i32},
             dict(K=128, BK=128, USE_L2NORM=True, DOT=c.wy_dot), c.wy_warps, 1, f"chunk_wy_{dt}"),
        _aot(gdn_chunk_scan_kernel, {"q": p, "k": p, "v": p, "x": p, "g": f32, "beta": f32, "o": p, "ssm": f32,
                                     "qsl": i32, "cu_chunks": i32, "state_slots": i32, "has_init": "*i1"},
             dict(AOT_DIMS, BV=c.scan_bv), c.scan_warps, c.scan_stages, f"chunk_scan_{dt}"),
        _aot(gdn_chunk_offsets_kernel, {"qsl": i32, "cu_chunks": i32}, {"BT": BT, "BB": 128}, 4, 1, "chunk_offsets"),
    ]
