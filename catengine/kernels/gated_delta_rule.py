"""Gated DeltaNet chunked prefill (WY / UT-transform form, chunk 64); the gating and the recurrent
decode are in :mod:`catengine.kernels.gdn_recurrent`, which shares this module's table and checks.

Chunked prefill over a varlen batch is three kernels (after a tiny one for chunk offsets), the
structure of flash-linear-attention's chunk_gated_delta_rule:
1. WY (chunk x value head, all parallel; :mod:`.gdn_chunk_wy`): l2norm(k), cumulative log decay,
   X = (I + beta K K^T * decay)^-1, then w = X (beta k e^g) and u = X (beta v), in one kernel or
   (``GDNTable.wy_split``) as the inverse to memory and a w/u kernel tiled over dk and dv.
2. ``gdn_chunk_h_kernel`` (sequence x value head x dv block, sequential over chunks): the state
   recurrence alone, storing the state at each chunk's start and v_new (:mod:`.gdn_chunk_ho`).
3. ``gdn_chunk_o_kernel`` (chunk x value head x dv block, all parallel): the output; or
   (``GDNTable.o_bk`` > 0) ``gdn_chunk_o_loop_kernel``, dk in BK tiles, optionally heads-first grid.
The serial kernel has few programs for one or two long sequences and leaves SMs idle; then the
chunks are cut into windows: WY of window i+1 and the output of window i-1 run on two side
streams while the recurrence does window i, handing its state on through the slot.
Chunks never straddle sequences; program -> (sequence, chunk) is a binary search over the chunk
offsets, so nothing waits on the host. States are fp32; w, u, v_new, the per-chunk states and the
matmul operands are in the activation dtype with fp32 accumulation, as in flash-linear-attention.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .aot import AotConfig
from .arch import arch_from_cc, arch_of
from .gdn_chunk_ho import gdn_chunk_h_kernel, gdn_chunk_o_kernel, gdn_chunk_o_loop_kernel
from .gdn_chunk_wy import gdn_chunk_inv_kernel, gdn_chunk_wu_kernel, gdn_chunk_wy_kernel

BT = 64  # chunk length; the WY kernel is written for 4 sub-blocks of 16


@dataclass(frozen=True)
class GDNTable:
    wy_warps: int
    wy_dot: str             # precision of the fp32 block-merge products: "tf32" (sm_80+) or "ieee"
    h_bv: int               # the serial state kernel: dv block, warps, pipeline stages
    h_warps: int
    h_stages: int
    o_bv: int               # the parallel output kernel
    o_warps: int
    o_stages: int
    rec_bv: int
    rec_warps: int
    # window the chunks (WY and output on side streams, overlapping the serial kernel) when the
    # serial kernel has fewer programs than this and there are at least overlap_min_chunks chunks:
    # up to overlap_segments windows of at least overlap_min_chunks / 2 chunks each
    overlap_max_programs: int = 0
    overlap_min_chunks: int = 32
    overlap_segments: int = 8
    overlap_wy: bool = True     # with windows: WY beside the serial kernel (else all of it first)
    overlap_o: bool = True      # with windows: the output beside the serial kernel (else all of it last)
    # output kernel: 0 the single-block kernel; 64 / 128 the kernel that walks dk in BK-row tiles with
    # one accumulator, its grid heads-first (the Hv x dv-block programs of a chunk adjacent) if asked
    o_bk: int = 0
    o_heads_first: bool = False
    # WY as two kernels (inverse to memory, then w and u BD columns at a time); either form's grid
    # heads-first if asked (the value heads of a chunk, which share its keys, adjacent)
    wy_split: bool = False
    wu_bd: int = 64
    wu_warps: int = 4
    wu_stages: int = 2
    wy_heads_first: bool = False


_TABLE = {
    # sm_70: tl.dot is FMA (Triton >= 3.3), no tf32, no cp.async: small tiles, one stage, fp16 only
    70: GDNTable(wy_warps=4, wy_dot="ieee", h_bv=32, h_warps=4, h_stages=1, o_bv=32,
                 o_warps=4, o_stages=1, rec_bv=32, rec_warps=4, overlap_max_programs=4096),
    # sm_90 from the H200 sweeps (bench_gdn.py --sweep, whole op, 2026-11-30). h: BV 32 / 4 warps /
    # 2 stages (64K: 8.35 ms; BV 64 8.27, BV 16 10.2, 8 warps 10.4, 3 stages 8.21; 1 stage hit an
    # illegal address in Triton 3.6, so no sm_80+ row uses it). o: BV 128 / 8 warps (8 x 4K 3.75 ms
    # against 4.93 at BV 64 / 8 warps and 3.92 at BV 64 / 4 warps; the 64-wide 8-warp build holds
    # 230 registers: one program per SM). Windows: 64K 8.33 vs 10.0 without, 8 x 4K 4.18 vs 4.93
    # (1536 serial programs; not measured above that, hence the bound). WY 4 warps (8: 1.8x slower).
    # Decode BV 64 / 4 warps (BV 32 / 2-4 warps within 1%, BV 16 and 8 warps slower at 8-256).
    # sm_80 copies it unmeasured (no A100 here). The dk-tiled output kernel and the split WY (o_bk,
    # wy_split, *_heads_first) stay off until an H200 sweep (bench_gdn.py --only sweep-prefill) times
    # them. Registers per thread at sm_90 (Triton 3.9's PTX through ptxas 13.4, strides hinted % 16):
    # output single-block BV 128 / 8 warps 181, tiled BK 64 / BV 128 / 8 warps 126, BK 64 / BV 64 /
    # 4 warps 164; fused WY 187, inverse 150, w/u (BD 64, 4 warps) 98.
    80: GDNTable(wy_warps=4, wy_dot="tf32", h_bv=32, h_warps=4, h_stages=2, o_bv=128, o_warps=8, o_stages=2,
                 rec_bv=64, rec_warps=4, overlap_max_programs=4096),
    90: GDNTable(wy_warps=4, wy_dot="tf32", h_bv=32, h_warps=4, h_stages=2, o_bv=128, o_warps=8, o_stages=2,
                 rec_bv=64, rec_warps=4, overlap_max_programs=4096),
}


@functools.cache
def _device_table(device: torch.device) -> GDNTable:
    # the interpreter (CI) gets the sm_80 row
    return _TABLE[arch_of(device)]


# ---------------------------------------------------------------- shared helpers
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
    _check(q, k, v, g, beta, ssm_states, chunk_size)
    q, k, v, g, beta = (_rows(x) for x in (q, k, v, g, beta))
    t, hk, dk = q.shape
    hv, dv = v.shape[1:]
    nb = qsl.shape[0] - 1
    o = torch.empty((t, hv, dv), dtype=v.dtype, device=v.device)
    if t == 0 or nb == 0:
        return o, []
    cfg = table or _device_table(v.device)
    bk, bv = _pad(dk), _pad(dv)
    hbv, obv = min(cfg.h_bv, bv), min(cfg.o_bv, bv)
    nt = (t + (BT - 1) * nb) // BT  # >= sum over sequences of ceil(len / BT)
    dev, dt, r, l2 = v.device, v.dtype, hv // hk, bool(use_qk_l2norm)
    cu = torch.empty(nb + 1, dtype=torch.int32, device=dev)
    w = torch.empty((t, hv, dk), dtype=dt, device=dev)
    u = torch.empty((t, hv, dv), dtype=dt, device=dev)
    vn = torch.empty((t, hv, dv), dtype=dt, device=dev)
    hb = torch.empty((nt, hv, dk, dv), dtype=dt, device=dev)  # the state at each chunk's start
    kn = torch.empty((t, hv), dtype=torch.float32, device=dev)  # 1 / |k| per token (and value head)
    # row t of its chunk's (I + A)^-1, only when WY runs as two kernels
    ai = torch.empty((t, hv, BT) if cfg.wy_split else (0,), dtype=dt, device=dev)

    def offsets():
        gdn_chunk_offsets_kernel[(1,)](qsl, cu, nb, BT=BT, BB=128, num_warps=4)

    def wy(c_lo=0, c_hi=nt):
        grid = (hv, c_hi - c_lo) if cfg.wy_heads_first else (c_hi - c_lo, hv)
        if not cfg.wy_split:
            gdn_chunk_wy_kernel[grid](
                k, v, g, beta, w, u, kn, qsl, cu, c_lo, nb, hv, r, k.stride(0), k.stride(1), v.stride(0),
                v.stride(1), g.stride(0), beta.stride(0), K=dk, V=dv, BK=bk, BV=bv, USE_L2NORM=l2, DOT=cfg.wy_dot,
                HEADS_FIRST=cfg.wy_heads_first, num_warps=cfg.wy_warps, num_stages=1)
            return
        gdn_chunk_inv_kernel[grid](
            k, g, beta, ai, kn, qsl, cu, c_lo, nb, hv, r, k.stride(0), k.stride(1), g.stride(0), beta.stride(0),
            K=dk, BK=bk, USE_L2NORM=l2, DOT=cfg.wy_dot, HEADS_FIRST=cfg.wy_heads_first,
            num_warps=cfg.wy_warps, num_stages=1)
        gdn_chunk_wu_kernel[grid](
            k, v, g, beta, ai, kn, w, u, qsl, cu, c_lo, nb, hv, r, k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), g.stride(0), beta.stride(0), K=dk, V=dv, BD=min(cfg.wu_bd, max(bk, bv)),
            HEADS_FIRST=cfg.wy_heads_first, num_warps=cfg.wu_warps, num_stages=cfg.wu_stages)

    def state(c_lo=0, c_hi=nt):
        gdn_chunk_h_kernel[(nb * hv, triton.cdiv(dv, hbv))](
            k, w, u, g, kn, vn, hb, ssm_states, qsl, cu, state_slots, has_init, c_lo, c_hi, hv, r, k.stride(0),
            k.stride(1), g.stride(0), ssm_states.stride(0), K=dk, V=dv, BK=bk, BV=hbv,
            num_warps=cfg.h_warps, num_stages=cfg.h_stages)

    def out(c_lo=0, c_hi=nt):
        args = (q, k, vn, hb, g, kn, o, qsl, cu, c_lo, nb, hv, r, float(scale), q.stride(0), q.stride(1),
                k.stride(0), k.stride(1), g.stride(0), o.stride(0), o.stride(1))
        if not cfg.o_bk:
            gdn_chunk_o_kernel[(c_hi - c_lo, hv, triton.cdiv(dv, obv))](
                *args, K=dk, V=dv, BK=bk, BV=obv, USE_L2NORM=l2, num_warps=cfg.o_warps, num_stages=cfg.o_stages)
            return
        heads = hv * triton.cdiv(dv, obv)
        gdn_chunk_o_loop_kernel[(heads, c_hi - c_lo) if cfg.o_heads_first else (c_hi - c_lo, heads)](
            *args, K=dk, V=dv, BK=min(cfg.o_bk, bk), BV=obv, USE_L2NORM=l2, HEADS_FIRST=cfg.o_heads_first,
            num_warps=cfg.o_warps, num_stages=cfg.o_stages)

    n_state = nb * hv * triton.cdiv(dv, hbv)
    if n_state >= cfg.overlap_max_programs or nt < cfg.overlap_min_chunks:
        return o, [("offsets", offsets), ("wy", wy), ("h", state), ("o", out)]
    seg = max(cfg.overlap_min_chunks // 2, triton.cdiv(nt, cfg.overlap_segments))
    windows = [(c, min(c + seg, nt)) for c in range(0, nt, seg)]

    def overlapped():
        """The serial kernel does window i on the current stream while WY of window i+1 runs on one
        side stream and the output of window i-1 on another. Without CUDA (the interpreter) the
        same windows run in order."""
        offsets()
        if not v.is_cuda:
            for lo, hi in windows:
                wy(lo, hi)
                state(lo, hi)
                out(lo, hi)
            return
        main = torch.cuda.current_stream(dev)
        s_wy, s_o = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
        s_wy.wait_stream(main)
        s_o.wait_stream(main)
        wy_done = []
        if cfg.overlap_wy:
            with torch.cuda.stream(s_wy):
                for lo, hi in windows:
                    wy(lo, hi)
                    wy_done.append(s_wy.record_event())
        else:
            wy()
        for i, (lo, hi) in enumerate(windows):
            if cfg.overlap_wy:
                main.wait_event(wy_done[i])
            state(lo, hi)
            if cfg.overlap_o:
                h_done = main.record_event()
                with torch.cuda.stream(s_o):
                    s_o.wait_event(h_done)
                    out(lo, hi)
        if cfg.overlap_o:
            main.wait_stream(s_o)
        else:
            out()

    return o, [("wy+h+o overlapped", overlapped)]


TRITON_OPS = {"chunk_gated_delta_rule": chunk_gated_delta_rule}


def _aot(kernel, ptrs: dict, consts: dict, num_warps: int, num_stages: int, name: str,
         strides16: bool = False) -> AotConfig:
    """Signature from the kernel's argument names: pointers as given, ``scale`` fp32, other ints i32.
    ``strides16``: the strides and HV are multiples of 16 at the model's shapes, and Triton
    specialises on that at run time (vectorised loads, fewer address registers), so the build checked
    here is the one that runs."""
    sig = {a: "constexpr" if a in consts else ptrs.get(a, "fp32" if a == "scale" else "i32")
           for a in kernel.arg_names}
    div = tuple(a for a in sig if a.startswith("stride_") or a == "HV") if strides16 else ()
    return AotConfig(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__, sig, consts,
                     num_warps, num_stages, name, div)


def aot_configs(cc: int) -> list[AotConfig]:
    """Every launch of this architecture's table at the model's head dims (dk = dv = 128), for each
    activation dtype each architecture serves (fp16 on sm_70, which has no bf16; bf16
    from sm_80 on: the fp16 build of the same tiles has the same shared-memory footprint). The
    alternative WY and output kernels are built too (the output one with BK 64 when the row leaves
    it off), so switching a row to them cannot break the build."""
    c = _TABLE[arch_from_cc(cc)]
    out = []
    for dt in (["fp16"] if cc < 80 else ["bf16"]):
        p, f32, i32 = f"*{dt}", "*fp32", "*i32"
        dims = {"K": 128, "V": 128, "BK": 128, "USE_L2NORM": True}
        out += [
            _aot(gdn_chunk_wy_kernel, {"k": p, "v": p, "g": f32, "beta": f32, "w": p, "u": p, "kn": f32,
                                       "qsl": i32, "cu_chunks": i32},
                 dict(dims, BV=128, DOT=c.wy_dot, HEADS_FIRST=c.wy_heads_first), c.wy_warps, 1, f"chunk_wy_{dt}",
                 True),
            _aot(gdn_chunk_h_kernel, {"k": p, "w": p, "u": p, "g": f32, "kn": f32, "vn": p, "hb": p, "ssm": f32,
                                      "qsl": i32, "cu_chunks": i32, "state_slots": i32, "has_init": "*i1"},
                 {"K": 128, "V": 128, "BK": 128, "BV": c.h_bv}, c.h_warps, c.h_stages, f"chunk_h_{dt}", True),
            _aot(gdn_chunk_o_kernel, {"q": p, "k": p, "vn": p, "hb": p, "g": f32, "kn": f32, "o": p, "qsl": i32,
                                      "cu_chunks": i32},
                 dict(dims, BV=c.o_bv), c.o_warps, c.o_stages, f"chunk_o_{dt}", True),
            _aot(gdn_chunk_o_loop_kernel, {"q": p, "k": p, "vn": p, "hb": p, "g": f32, "kn": f32, "o": p,
                                           "qsl": i32, "cu_chunks": i32},
                 dict(dims, BK=c.o_bk or 64, BV=c.o_bv, HEADS_FIRST=c.o_heads_first), c.o_warps, c.o_stages,
                 f"chunk_o_loop_{dt}", True),
            _aot(gdn_chunk_inv_kernel, {"k": p, "g": f32, "beta": f32, "ai": p, "kn": f32, "qsl": i32,
                                        "cu_chunks": i32},
                 {"K": 128, "BK": 128, "USE_L2NORM": True, "DOT": c.wy_dot, "HEADS_FIRST": c.wy_heads_first},
                 c.wy_warps, 1, f"chunk_inv_{dt}", True),
            _aot(gdn_chunk_wu_kernel, {"k": p, "v": p, "g": f32, "beta": f32, "ai": p, "kn": f32, "w": p, "u": p,
                                       "qsl": i32, "cu_chunks": i32},
                 {"K": 128, "V": 128, "BD": c.wu_bd, "HEADS_FIRST": c.wy_heads_first}, c.wu_warps, c.wu_stages,
                 f"chunk_wu_{dt}", True),
        ]
    out.append(_aot(gdn_chunk_offsets_kernel, {"qsl": i32, "cu_chunks": i32}, {"BT": BT, "BB": 128}, 4, 1,
                    "chunk_offsets"))
    return out
