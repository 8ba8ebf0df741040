"""Gated DeltaNet chunked prefill (WY / UT-transform form, chunk 64): the launch table, the host side
and the ahead-of-time list; the kernels are in :mod:`.gdn_chunk_wy`, :mod:`.gdn_chunk_h` and
:mod:`.gdn_chunk_o`. The gating and the recurrent decode are in :mod:`catengine.kernels.gdn_recurrent`,
which shares this module's table and checks.

Two forms, chosen by ``GDNTable.prefill`` (after a tiny kernel for chunk offsets):
- "split", the structure of flash-linear-attention's chunk_gated_delta_rule: WY (chunk x value
  head, parallel) writes w, u and the key norms; ``gdn_chunk_h_kernel`` (sequence x value head x dv
  block, serial over chunks) carries the state alone, storing each chunk's start state and v_new;
  ``gdn_chunk_o_kernel`` (chunk x value head x dv block, parallel) computes the output.
- "scan": WY writes only X = (I + A)^-1; ``gdn_chunk_scan_kernel`` (serial over chunks) does the
  state and the output of each chunk; w, u, v_new and the chunk states never touch memory.
The serial kernel has few programs for one or two long sequences and leaves SMs idle; then the
chunks are cut into windows: WY of window i+1 (and the split's output of window i-1) run on side
streams while the serial kernel does window i, handing its state on through the slot.
Chunks never straddle sequences; program -> (sequence, chunk) is a binary search over the chunk
offsets, so nothing waits on the host. States are fp32; w, u, X, v_new, the per-chunk states and
the matmul operands are in the activation dtype with fp32 accumulation, as in flash-linear-attention.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .aot import AotConfig
from .arch import arch_from_cc, arch_of
from .gdn_chunk_h import gdn_chunk_h_kernel, gdn_chunk_scan_kernel
from .gdn_chunk_o import gdn_chunk_o_kernel
from .gdn_chunk_wy import gdn_chunk_inv_kernel, gdn_chunk_wy_kernel

BT = 64  # chunk length; the WY kernel is written for 4 sub-blocks of 16
# the smallest dk / dv block of the split's WY and serial kernels (rows past dk, dv are masked to zero).
# On the H200 (Triton 3.6) the WY kernel wrote wrong w and u with 32-wide blocks (dk = dv = 32: relative
# error 1.1, so the op's output 1.14 and the final state 0.77 off) and hit an illegal address with
# 16-wide ones; with 64-wide blocks (or 8 warps) it was right. bench/NOTES.md had blamed the serial
# kernel's 32-row build (mma.sync beside a wgmma), but 64 rows there alone changed nothing; it keeps
# 64 rows anyway (a wgmma-only build; its 32-row build with a right WY was not run).
SPLIT_MIN_BLOCK = 64


@dataclass(frozen=True)
class GDNTable:
    wy_warps: int
    wy_dot: str             # precision of the fp32 block-merge products: "tf32" (sm_80+) or "ieee"
    h_bv: int               # split: the serial state kernel's dv block, warps, pipeline stages
    h_warps: int
    h_stages: int
    o_bv: int               # split: the parallel output kernel
    o_warps: int
    o_stages: int
    scan_bv: int            # scan: the serial kernel that also writes the output
    scan_warps: int
    scan_stages: int
    rec_bv: int
    rec_warps: int
    prefill: str = "split"  # "split" or "scan"
    # window the chunks (WY, and the split's output, on side streams beside the serial kernel) when
    # the serial kernel has fewer programs than overlap_max_programs and there are at least
    # overlap_min_chunks chunks (split; scan_* for the scan): up to overlap_segments windows of at
    # least overlap_min_window chunks each
    overlap_max_programs: int = 0
    overlap_min_chunks: int = 32
    scan_overlap_max_programs: int = 0
    scan_overlap_min_chunks: int = 32
    overlap_segments: int = 8
    overlap_min_window: int = 16
    overlap_wy: bool = True     # with windows: WY beside the serial kernel (else all of it first)
    overlap_o: bool = True      # split, with windows: the output beside the serial kernel (else all last)


_TABLE = {
    # sm_70: tl.dot is FMA (Triton >= 3.3), no tf32, no cp.async: small tiles, one stage, fp16 only.
    # Unmeasured (no V100 here), so it keeps the scan it had; the split's row fits the 96 KB (test_aot),
    # but a 1-stage serial kernel hit an illegal address on the H200, so nothing vouches for it.
    70: GDNTable(wy_warps=4, wy_dot="ieee", h_bv=32, h_warps=4, h_stages=1, o_bv=32, o_warps=4, o_stages=1,
                 scan_bv=32, scan_warps=4, scan_stages=1, rec_bv=32, rec_warps=4, prefill="scan",
                 overlap_max_programs=4096, scan_overlap_max_programs=80),
    # sm_90, H200, 2026-12-01 (bench_gdn.py, whole op, ms at 1 x 8K / 1 x 64K / 8 x 4K ragged; sweep rows
    # checked against the table's output). This row with h 2 stages and o 8 warps: split 0.95 / 6.23 / 3.05,
    # scan 1.11 / 7.90 / 3.63,
    # fla 1.32 / 5.97 / 2.85. Around it: h BV 32 0.92 / 6.74 / 3.27; windows from 32 chunks 1.99 / 6.25 /
    # 3.11 and none 0.96 / 7.73 / 3.16, hence from 256 (1 x 8K has 128; nothing measured from 129 to
    # 515); WY 8 warps 1.23 / 8.88 / 4.44; h 3 stages alone 0.84 / 5.87 / 2.92, o 4 warps alone 0.93 /
    # 6.16 / 2.82, so the row takes both. 2026-11-30: h 1 stage hit an illegal address (Triton
    # 3.6). Scan (the fall-back): windows 7.98 vs 8.71 without at 64K, 8 warps (9.14 at 4), 2 stages;
    # its BV 32 / 4 warps is wrong on the H200 (2.0 relative). Decode BV 64 / 4 warps. sm_80 copies it
    # unmeasured (no A100 here). Later, with the serial kernel's state as two 64-row blocks: this row
    # 0.805 / 5.57 / 2.82; h 2 stages 0.926 / 6.13 / 2.83, h BV 32 0.841 / 6.08 / 3.04, h 8 warps 0.867 /
    # 6.18 / 3.04 (bench_gdn.py --only sweep-prefill times these fields).
    80: GDNTable(wy_warps=4, wy_dot="tf32", h_bv=64, h_warps=4, h_stages=3, o_bv=128, o_warps=4, o_stages=2,
                 scan_bv=64, scan_warps=8, scan_stages=2, rec_bv=64, rec_warps=4,
                 overlap_max_programs=4096, overlap_min_chunks=256, scan_overlap_max_programs=108),
    90: GDNTable(wy_warps=4, wy_dot="tf32", h_bv=64, h_warps=4, h_stages=3, o_bv=128, o_warps=4, o_stages=2,
                 scan_bv=64, scan_warps=8, scan_stages=2, rec_bv=64, rec_warps=4,
                 overlap_max_programs=4096, overlap_min_chunks=256, scan_overlap_max_programs=132),
}


@functools.cache
def _device_table(device: torch.device) -> GDNTable:
    # the interpreter (CI) gets the sm_80 row
    return _TABLE[arch_of(device)]


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
    t = q.shape[0]
    if t == 0 or nb == 0:
        return o, []
    cfg = table or _device_table(v.device)
    if cfg.prefill not in ("split", "scan"):
        raise ValueError(f"GDNTable.prefill must be 'split' or 'scan', got {cfg.prefill!r}")
    nt = (t + (BT - 1) * nb) // BT  # >= sum over sequences of ceil(len / BT)
    cu = torch.empty(nb + 1, dtype=torch.int32, device=v.device)

    def offsets():
        gdn_chunk_offsets_kernel[(1,)](qsl, cu, nb, BT=BT, BB=128, num_warps=4)

    # the split's serial kernel holds the state in 64-row blocks, at most two (dk <= 128, the model's)
    make = _split_launches if cfg.prefill == "split" and q.shape[2] <= 128 else _scan_launches
    wy, serial, out, n_serial, max_programs, min_chunks = make(q, k, v, g, beta, o, ssm_states, qsl, cu, state_slots,
                                                               has_init, float(scale), bool(use_qk_l2norm), nb, nt, cfg)
    names = ("wy", "h", "o") if out else ("wy", "scan")
    if n_serial >= max_programs or nt < min_chunks:
        return o, [("offsets", offsets)] + list(zip(names, (wy, serial, out)))
    seg = max(cfg.overlap_min_window, triton.cdiv(nt, cfg.overlap_segments))
    windows = [(c, min(c + seg, nt)) for c in range(0, nt, seg)]
    return o, [("+".join(names) + " overlapped", lambda: _overlapped(offsets, wy, serial, out, windows, cfg, v.device))]


def _split_launches(q, k, v, g, beta, o, ssm, qsl, cu, slots, has_init, scale, l2, nb, nt, cfg):
    """WY (w, u, key norms), the serial state kernel and the output kernel, each over a window of
    chunks [c_lo, c_hi); plus the serial kernel's program count and the table's window bounds."""
    t, hk, dk = q.shape
    hv, dv = v.shape[1:]
    bk, bv = _pad(dk), _pad(dv)
    # the WY and the serial kernel share the padded key block
    wbk, wbv = max(SPLIT_MIN_BLOCK, bk), max(SPLIT_MIN_BLOCK, bv)
    hbv, obv = min(cfg.h_bv, bv), min(cfg.o_bv, bv)
    dev, dt, r = v.device, v.dtype, hv // hk
    w = torch.empty((t, hv, dk), dtype=dt, device=dev)
    u = torch.empty((t, hv, dv), dtype=dt, device=dev)
    vn = torch.empty((t, hv, dv), dtype=dt, device=dev)
    hb = torch.empty((nt, hv, dk, dv), dtype=dt, device=dev)  # the state at each chunk's start
    kn = torch.empty((t, hv), dtype=torch.float32, device=dev)  # 1 / |k| per token (and value head)

    def wy(c_lo=0, c_hi=nt):
        gdn_chunk_wy_kernel[(c_hi - c_lo, hv)](
            k, v, g, beta, w, u, kn, qsl, cu, c_lo, nb, hv, r, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            g.stride(0), beta.stride(0), K=dk, V=dv, BK=wbk, BV=wbv, USE_L2NORM=l2, DOT=cfg.wy_dot,
            num_warps=cfg.wy_warps, num_stages=1)

    def state(c_lo=0, c_hi=nt):
        gdn_chunk_h_kernel[(nb * hv, triton.cdiv(dv, hbv))](
            k, w, u, g, kn, vn, hb, ssm, qsl, cu, slots, has_init, c_lo, c_hi, hv, r, k.stride(0), k.stride(1),
            g.stride(0), ssm.stride(0), K=dk, V=dv, BK=wbk, BV=hbv, num_warps=cfg.h_warps, num_stages=cfg.h_stages)

    def out(c_lo=0, c_hi=nt):
        gdn_chunk_o_kernel[(c_hi - c_lo, hv, triton.cdiv(dv, obv))](
            q, k, vn, hb, g, kn, o, qsl, cu, c_lo, nb, hv, r, scale, q.stride(0), q.stride(1), k.stride(0),
            k.stride(1), g.stride(0), o.stride(0), o.stride(1), K=dk, V=dv, BK=bk, BV=obv, USE_L2NORM=l2,
            num_warps=cfg.o_warps, num_stages=cfg.o_stages)

    return wy, state, out, nb * hv * triton.cdiv(dv, hbv), cfg.overlap_max_programs, cfg.overlap_min_chunks


def _scan_launches(q, k, v, g, beta, o, ssm, qsl, cu, slots, has_init, scale, l2, nb, nt, cfg):
    """WY (X only) and the scan, each over a window of chunks [c_lo, c_hi); no separate output
    launch (None); plus the scan's program count and the table's window bounds."""
    t, hk, dk = q.shape
    hv, dv = v.shape[1:]
    bk, sbv, r = _pad(dk), min(cfg.scan_bv, _pad(dv)), hv // hk
    x = torch.empty((t, hv, BT), dtype=v.dtype, device=v.device)  # row i of each chunk's (I + A)^-1

    def wy(c_lo=0, c_hi=nt):
        gdn_chunk_inv_kernel[(c_hi - c_lo, hv)](
            k, g, beta, x, qsl, cu, c_lo, nb, hv, r, k.stride(0), k.stride(1), g.stride(0), beta.stride(0),
            K=dk, BK=bk, USE_L2NORM=l2, DOT=cfg.wy_dot, num_warps=cfg.wy_warps, num_stages=1)

    def scan(c_lo=0, c_hi=nt):
        gdn_chunk_scan_kernel[(nb * hv, triton.cdiv(dv, sbv))](
            q, k, v, x, g, beta, o, ssm, qsl, cu, slots, has_init, c_lo, c_hi, hv, r, scale, q.stride(0),
            q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
            o.stride(0), o.stride(1), ssm.stride(0), K=dk, V=dv, BK=bk, BV=sbv, USE_L2NORM=l2,
            num_warps=cfg.scan_warps, num_stages=cfg.scan_stages)

    return wy, scan, None, nb * hv * triton.cdiv(dv, sbv), cfg.scan_overlap_max_programs, cfg.scan_overlap_min_chunks


def _overlapped(offsets, wy, serial, out, windows, cfg, dev):
    """The serial kernel does window i on the current stream while WY of window i+1 runs on one side
    stream and the output (split only) of window i-1 on another. Without CUDA (the interpreter) the
    same windows run in order."""
    offsets()
    if dev.type != "cuda":
        for lo, hi in windows:
            wy(lo, hi)
            serial(lo, hi)
            if out:
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
    side_o = out is not None and cfg.overlap_o
    for i, (lo, hi) in enumerate(windows):
        if cfg.overlap_wy:
            main.wait_event(wy_done[i])
        serial(lo, hi)
        if side_o:
            h_done = main.record_event()
            with torch.cuda.stream(s_o):
                s_o.wait_event(h_done)
                out(lo, hi)
    if side_o:
        main.wait_stream(s_o)
    elif out is not None:
        out()


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


# the model's head dims, which every ahead-of-time build of the GDN kernels uses
AOT_DIMS = {"K": 128, "V": 128, "BK": 128, "USE_L2NORM": True}


def aot_dtype(cc: int) -> str:
    """The activation dtype an architecture serves: fp16 on sm_70, which has no bf16; bf16 from sm_80
    on (the fp16 build of the same tiles has the same shared-memory footprint)."""
    return "fp16" if cc < 80 else "bf16"


def aot_configs(cc: int) -> list[AotConfig]:
    """Both prefill forms of this architecture's table (the row's ``prefill`` picks one, the other is
    its fall-back) at the model's head dims (dk = dv = 128), and the split's WY and serial kernels at
    dk = dv = 32 (the small models' dims, where SPLIT_MIN_BLOCK pads their blocks to 64)."""
    c = _TABLE[arch_from_cc(cc)]
    dt = aot_dtype(cc)
    p, f32, i32 = f"*{dt}", "*fp32", "*i32"
    seq = {"qsl": i32, "cu_chunks": i32, "state_slots": i32, "has_init": "*i1"}
    h_ptrs = dict(seq, k=p, w=p, u=p, g=f32, kn=f32, vn=p, hb=p, ssm=f32)
    wy_ptrs = {"k": p, "v": p, "g": f32, "beta": f32, "w": p, "u": p, "kn": f32, "qsl": i32, "cu_chunks": i32}
    return [
        _aot(gdn_chunk_wy_kernel, wy_ptrs, dict(AOT_DIMS, BV=128, DOT=c.wy_dot), c.wy_warps, 1, f"chunk_wy_{dt}", True),
        _aot(gdn_chunk_h_kernel, h_ptrs, {"K": 128, "V": 128, "BK": 128, "BV": c.h_bv}, c.h_warps, c.h_stages,
             f"chunk_h_{dt}", True),
        _aot(gdn_chunk_wy_kernel, wy_ptrs, dict(K=32, V=32, BK=SPLIT_MIN_BLOCK, BV=SPLIT_MIN_BLOCK, USE_L2NORM=True,
                                                DOT=c.wy_dot), c.wy_warps, 1, f"chunk_wy_dk32_{dt}", True),
        _aot(gdn_chunk_h_kernel, h_ptrs, {"K": 32, "V": 32, "BK": SPLIT_MIN_BLOCK, "BV": min(c.h_bv, 32)},
             c.h_warps, c.h_stages, f"chunk_h_dk32_{dt}", True),
        _aot(gdn_chunk_o_kernel, {"q": p, "k": p, "vn": p, "hb": p, "g": f32, "kn": f32, "o": p, "qsl": i32,
                                  "cu_chunks": i32},
             dict(AOT_DIMS, BV=c.o_bv), c.o_warps, c.o_stages, f"chunk_o_{dt}", True),
        _aot(gdn_chunk_inv_kernel, {"k": p, "g": f32, "beta": f32, "x": p, "qsl": i32, "cu_chunks": i32},
             dict(K=128, BK=128, USE_L2NORM=True, DOT=c.wy_dot), c.wy_warps, 1, f"chunk_inv_{dt}", True),
        _aot(gdn_chunk_scan_kernel, dict(seq, q=p, k=p, v=p, x=p, g=f32, beta=f32, o=p, ssm=f32),
             dict(AOT_DIMS, BV=c.scan_bv), c.scan_warps, c.scan_stages, f"chunk_scan_{dt}", True),
        _aot(gdn_chunk_offsets_kernel, {"qsl": i32, "cu_chunks": i32}, {"BT": BT, "BB": 128}, 4, 1, "chunk_offsets"),
    ]
