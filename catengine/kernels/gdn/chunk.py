"""Gated DeltaNet chunked prefill (WY / UT-transform form, chunk 64): the host side and the ahead-of-time
list; the kernels are in :mod:`.chunk_wy`, :mod:`.chunk_h` and :mod:`.chunk_o`, the launch table and the
input checks in :mod:`.table`, which the gating and the recurrent decode
(:mod:`catengine.kernels.gdn.recurrent`) share.

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
offsets, so nothing waits on the host. States are carried in fp32 (a 16-bit slot, mamba_ssm_cache_dtype,
is rounded only when stored, at the end of a window); w, u, X, v_new, the per-chunk states and
the matmul operands are in the activation dtype with fp32 accumulation, as in flash-linear-attention.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.aot import AotConfig
from ..common.arch import arch_from_cc
from .chunk_h import gdn_chunk_h_kernel, gdn_chunk_scan_kernel
from .chunk_o import gdn_chunk_o_kernel
from .chunk_h_sm70 import h_hmma_applies, state_launch
from .chunk_o_sm70 import o_hmma_applies, output_launch
from .chunk_wy import gdn_chunk_inv_kernel, gdn_chunk_wy_kernel
from .chunk_wy_sm70 import wy_hmma_applies, wy_launch_sm70
from .table import AOT_DIMS, BT, SPLIT_MIN_BLOCK, TABLE, GDNTable, aot_config, aot_dtype, device_table, pad, prepare


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


def chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                           has_initial_state, scale: float, use_qk_l2norm: bool = True,
                           chunk_size: int = 64):
    """Triton twin of :func:`catengine.kernels.gdn.naive.chunk_gated_delta_rule` (same signature)."""
    o, steps = chunk_steps(q, k, v, g, beta, ssm_states, query_start_loc, state_slots, has_initial_state, scale,
                           use_qk_l2norm, chunk_size)
    for _, launch in steps:
        launch()
    return o


def chunk_steps(q, k, v, g, beta, ssm_states, qsl, state_slots, has_init, scale, use_qk_l2norm=True,
                chunk_size=BT, table: GDNTable | None = None):
    """The output tensor and the launches that fill it, in order, as (name, callable) pairs: the
    benchmark times them one by one and tries other tables."""
    q, k, v, g, beta, o, nb = prepare(q, k, v, g, beta, ssm_states, qsl, chunk_size)
    t = q.shape[0]
    if t == 0 or nb == 0:
        return o, []
    cfg = table or device_table(v.device)
    if cfg.prefill not in ("split", "scan"):
        raise ValueError(f"GDNTable.prefill must be 'split' or 'scan', got {cfg.prefill!r}")
    nt = (t + (BT - 1) * nb) // BT  # >= sum over sequences of ceil(len / BT)
    cu = torch.empty(nb + 1, dtype=torch.int32, device=v.device)

    def offsets():
        gdn_chunk_offsets_kernel[(1,)](qsl, cu, nb, BT=BT, BB=128, num_warps=4)

    # the split's serial kernel holds the state in 64-row blocks, at most two (dk <= 128, the model's). A row whose
    # split is there for its HMMA.884 stages (sm_70) runs the scan where none of them applies (not fp16, not CUDA):
    # its own tl.dot split build (1 stage) is the one that hit an illegal address on the H200 (table.py)
    hmma_row = cfg.o_hmma or cfg.h_hmma or cfg.wy_hmma
    split = cfg.prefill == "split" and q.shape[2] <= 128 and (
        not hmma_row or any(f(cfg, v.dtype, v.device) for f in (o_hmma_applies, h_hmma_applies, wy_hmma_applies)))
    make = _split_launches if split else _scan_launches
    wy, serial, out, n_serial, max_programs, min_chunks = make(q, k, v, g, beta, o, ssm_states, qsl, cu, state_slots,
                                                               has_init, float(scale), bool(use_qk_l2norm), nb, nt, cfg)
    names = ("wy", "h", "o") if out else ("wy", "scan")
    if n_serial >= max_programs or nt < min_chunks:
        return o, [("offsets", offsets)] + list(zip(names, (wy, serial, out)))
    seg = max(cfg.overlap_min_window, triton.cdiv(nt, cfg.overlap_segments))
    windows = [(c, min(c + seg, nt)) for c in range(0, nt, seg)]
    return o, [("+".join(names) + " overlapped", lambda: _overlapped(offsets, wy, serial, out, windows, cfg, v.device))]


def wy_launch(k, v, g, beta, qsl, cu, nb: int, nt: int, l2: bool, cfg: GDNTable):
    """The split's WY stage over a window of chunks [c_lo, c_hi) (the host side's ``wy``) and the tensors it fills:
    w [T, Hv, dk], u [T, Hv, dv] in v's dtype, the key norms kn [T, Hv] fp32 (1 / |k| per token and value head).
    k [T, Hk, dk], v [T, Hv, dv], g and beta [T, Hv] fp32 with unit stride in their last dim; cu [nb + 1] the
    int32 chunk offsets of the nb sequences, nt >= their number of chunks."""
    t, hk, dk = k.shape
    hv, dv = v.shape[1:]
    wbk, wbv = max(SPLIT_MIN_BLOCK, pad(dk)), max(SPLIT_MIN_BLOCK, pad(dv))
    w = torch.empty((t, hv, dk), dtype=v.dtype, device=v.device)
    u = torch.empty((t, hv, dv), dtype=v.dtype, device=v.device)
    kn = torch.empty((t, hv), dtype=torch.float32, device=v.device)

    def wy(c_lo=0, c_hi=nt):
        gdn_chunk_wy_kernel[(c_hi - c_lo, hv)](
            k, v, g, beta, w, u, kn, qsl, cu, c_lo, nb, hv, hv // hk, k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), g.stride(0), beta.stride(0), K=dk, V=dv, BK=wbk, BV=wbv, USE_L2NORM=l2, DOT=cfg.wy_dot,
            KS=cfg.wy_ks, num_warps=cfg.wy_warps, num_stages=1)

    return w, u, kn, wy


def _split_launches(q, k, v, g, beta, o, ssm, qsl, cu, slots, has_init, scale, l2, nb, nt, cfg):
    """WY (w, u, key norms), the serial state kernel and the output kernel, each over a window of
    chunks [c_lo, c_hi); plus the serial kernel's program count and the table's window bounds."""
    t, hk, dk = q.shape
    hv, dv = v.shape[1:]
    bk, bv = pad(dk), pad(dv)
    # the WY and the serial kernel share the padded key block
    wbk = max(SPLIT_MIN_BLOCK, bk)
    hbv, obv = min(cfg.h_bv, bv), min(cfg.o_bv, bv)
    dev, dt, r = v.device, v.dtype, hv // hk
    # sm_70: the products on HMMA.884 (Gluon) where the row says so, for fp16 on CUDA
    if wy_hmma_applies(cfg, dt, dev):
        w, u, kn, wy = wy_launch_sm70(k, v, g, beta, qsl, cu, nb, nt, l2)
    else:
        w, u, kn, wy = wy_launch(k, v, g, beta, qsl, cu, nb, nt, l2, cfg)
    vn = torch.empty((t, hv, dv), dtype=dt, device=dev)
    hb = torch.empty((nt, hv, dk, dv), dtype=dt, device=dev)  # the state at each chunk's start

    def state(c_lo=0, c_hi=nt):
        gdn_chunk_h_kernel[(nb * hv, triton.cdiv(dv, hbv))](
            k, w, u, g, kn, vn, hb, ssm, qsl, cu, slots, has_init, c_lo, c_hi, hv, r, k.stride(0), k.stride(1),
            g.stride(0), ssm.stride(0), K=dk, V=dv, BK=wbk, BV=hbv, num_warps=cfg.h_warps, num_stages=cfg.h_stages)

    n_state = nb * hv * triton.cdiv(dv, hbv)
    if h_hmma_applies(cfg, dt, dev):
        state, n_state = state_launch(k, w, u, g, kn, vn, hb, ssm, qsl, cu, slots, has_init, nb, nt)
    if o_hmma_applies(cfg, dt, dev):
        return wy, state, output_launch(q, k, vn, hb, g, kn, o, qsl, cu, scale, l2, nb, nt), n_state, \
            cfg.overlap_max_programs, cfg.overlap_min_chunks

    def out(c_lo=0, c_hi=nt):
        gdn_chunk_o_kernel[(c_hi - c_lo, hv, triton.cdiv(dv, obv))](
            q, k, vn, hb, g, kn, o, qsl, cu, c_lo, nb, hv, r, scale, q.stride(0), q.stride(1), k.stride(0),
            k.stride(1), g.stride(0), o.stride(0), o.stride(1), K=dk, V=dv, BK=bk, BV=obv, USE_L2NORM=l2,
            num_warps=cfg.o_warps, num_stages=cfg.o_stages)

    return wy, state, out, n_state, cfg.overlap_max_programs, cfg.overlap_min_chunks


def _scan_launches(q, k, v, g, beta, o, ssm, qsl, cu, slots, has_init, scale, l2, nb, nt, cfg):
    """WY (X only) and the scan, each over a window of chunks [c_lo, c_hi); no separate output
    launch (None); plus the scan's program count and the table's window bounds."""
    t, hk, dk = q.shape
    hv, dv = v.shape[1:]
    bk, sbv, r = pad(dk), min(cfg.scan_bv, pad(dv)), hv // hk
    x = torch.empty((t, hv, BT), dtype=v.dtype, device=v.device)  # row i of each chunk's (I + A)^-1

    def wy(c_lo=0, c_hi=nt):
        gdn_chunk_inv_kernel[(c_hi - c_lo, hv)](
            k, g, beta, x, qsl, cu, c_lo, nb, hv, r, k.stride(0), k.stride(1), g.stride(0), beta.stride(0),
            K=dk, BK=bk, USE_L2NORM=l2, DOT=cfg.wy_dot, KS=cfg.wy_ks, num_warps=cfg.wy_warps, num_stages=1)

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





def aot_configs(cc: int) -> list[AotConfig]:
    """Both prefill forms of this architecture's table (the row's ``prefill`` picks one, the other is
    its fall-back) at the model's head dims (dk = dv = 128), and the split's WY and serial kernels at
    dk = dv = 32 (the small models' dims, where SPLIT_MIN_BLOCK pads their blocks to 64)."""
    c = TABLE[arch_from_cc(cc)]
    dt = aot_dtype(cc)
    p, f32, i32 = f"*{dt}", "*fp32", "*i32"
    seq = {"qsl": i32, "cu_chunks": i32, "state_slots": i32, "has_init": "*i1"}
    h_ptrs = dict(seq, k=p, w=p, u=p, g=f32, kn=f32, vn=p, hb=p, ssm=f32)
    wy_ptrs = {"k": p, "v": p, "g": f32, "beta": f32, "w": p, "u": p, "kn": f32, "qsl": i32, "cu_chunks": i32}
    return [
        aot_config(gdn_chunk_wy_kernel, wy_ptrs, dict(AOT_DIMS, BV=128, DOT=c.wy_dot, KS=c.wy_ks), c.wy_warps, 1,
                   f"chunk_wy_{dt}", True),
        aot_config(gdn_chunk_h_kernel, h_ptrs, {"K": 128, "V": 128, "BK": 128, "BV": c.h_bv}, c.h_warps, c.h_stages,
                   f"chunk_h_{dt}", True),
        aot_config(gdn_chunk_wy_kernel, wy_ptrs, dict(K=32, V=32, BK=SPLIT_MIN_BLOCK, BV=SPLIT_MIN_BLOCK,
                                                      USE_L2NORM=True, DOT=c.wy_dot, KS=c.wy_ks),
                   c.wy_warps, 1, f"chunk_wy_dk32_{dt}", True),
        aot_config(gdn_chunk_h_kernel, h_ptrs, {"K": 32, "V": 32, "BK": SPLIT_MIN_BLOCK, "BV": min(c.h_bv, 32)},
                   c.h_warps, c.h_stages, f"chunk_h_dk32_{dt}", True),
        aot_config(gdn_chunk_o_kernel, {"q": p, "k": p, "vn": p, "hb": p, "g": f32, "kn": f32, "o": p, "qsl": i32,
                                        "cu_chunks": i32},
                   dict(AOT_DIMS, BV=c.o_bv), c.o_warps, c.o_stages, f"chunk_o_{dt}", True),
        aot_config(gdn_chunk_inv_kernel, {"k": p, "g": f32, "beta": f32, "x": p, "qsl": i32, "cu_chunks": i32},
                   dict(K=128, BK=128, USE_L2NORM=True, DOT=c.wy_dot, KS=c.wy_ks), c.wy_warps, 1, f"chunk_inv_{dt}",
                   True),
        aot_config(gdn_chunk_scan_kernel, dict(seq, q=p, k=p, v=p, x=p, g=f32, beta=f32, o=p, ssm=f32),
                   dict(AOT_DIMS, BV=c.scan_bv), c.scan_warps, c.scan_stages, f"chunk_scan_{dt}", True),
        aot_config(gdn_chunk_offsets_kernel, {"qsl": i32, "cu_chunks": i32}, {"BT": BT, "BB": 128}, 4, 1,
                   "chunk_offsets"),
    ]
