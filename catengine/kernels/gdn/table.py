"""What the chunked and the recurrent gated delta rule share: the per-architecture launch table, the
input checks and the ahead-of-time signature helper (chunk.py and recurrent.py both launch from it).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from ..common.aot import AotConfig
from ..common.arch import arch_of

BT = 64  # chunk length; the WY kernel is written for 4 sub-blocks of 16
# the smallest dk / dv block of the split's WY and serial kernels (rows past dk, dv are masked to zero).
# On the H200 (Triton 3.6) the WY kernel wrote wrong w and u with 32-wide blocks (dk = dv = 32: relative
# error 1.1, so the op's output 1.14 and the final state 0.77 off) and hit an illegal address with
# 16-wide ones; with 64-wide blocks (or 8 warps) it was right. bench/NOTES.md had blamed the serial
# kernel's 32-row build (mma.sync beside a wgmma), but 64 rows there alone changed nothing; it keeps
# 64 rows anyway (a wgmma-only build; its 32-row build with a right WY was not run).
SPLIT_MIN_BLOCK = 64
# the recurrent state slots' storage (EngineConfig.mamba_ssm_cache_dtype); every kernel computes in fp32
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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
    # the recurrent kernel's (BV, warps) on 16-bit state slots (mamba_ssm_cache_dtype fp16 / bf16: half the bytes
    # per tile); None: rec_bv / rec_warps
    rec16_bv: int | None = None
    rec16_warps: int | None = None
    # split: the output stage on the tensor cores' m8n8k4 (chunk_o_sm70, Gluon) for fp16 on CUDA, instead of
    # the tl.dot kernel (FMA on sm_70 from Triton 3.3 on)
    o_hmma: bool = False
    # split: the serial state stage likewise (chunk_h_sm70: w S and k^T v_new, the state in fp32 registers)
    h_hmma: bool = False
    # split: the WY stage on HMMA.884 (chunk_wy_sm70: K K^T, the block merges of (I + A)^-1, w and u)
    wy_hmma: bool = False
    # WY: its products as slices of this many k (chunk_wy._dot_k), 0 = whole. sm_70's tl.dot is FMA, whose lowering
    # holds a thread's operand rows and columns over the whole k in registers: the whole-k build spilled (below)
    wy_ks: int = 0

    def rec_launch(self, state_dtype: torch.dtype) -> tuple[int, int]:
        """The recurrent kernel's (BV, warps) for state slots of ``state_dtype``."""
        if state_dtype != torch.float32 and self.rec16_bv is not None:
            return self.rec16_bv, self.rec16_warps
        return self.rec_bv, self.rec_warps


TABLE = {
    # sm_70: tl.dot is FMA (Triton >= 3.3), no tf32, no cp.async: small tiles, one stage, fp16 only.
    # Unmeasured (no V100 here), so it keeps the scan it had; the split's row fits the 96 KB (test_aot),
    # but a 1-stage serial kernel hit an illegal address on the H200, so nothing vouches for it. The scan
    # takes the sm_90 row's BV 64 / 8 warps / 2 stages (32 KB of shared memory for sm_70, as before): its
    # BV 32 / 4 warps / 1 stage build was wrong on the H200 (bench/NOTES.md; again 2026-12-02: 0.85 relative
    # error at dk = dv = 128 fp16, where this launch gives 5.6e-4, test_arch70_gpu) and, under CATENGINE_ARCH=70
    # (2026-12-02, Triton 3.6), hit an illegal address in the first prefill, so the sm_70 path could not run
    # there at all; with this one the mid-size dense / MoE models agree with float32 transformers on 0.998 /
    # 1.0 of 512 teacher-forced tokens (tests/test_arch70_gpu.py). Its speed on a V100 is unknown either way.
    # o_hmma / h_hmma (2026-12-03): the split form's output and state products on HMMA.884 (chunk_o_sm70.py,
    # chunk_h_sm70.py), so the row now runs the split (its WY step then stayed tl.dot, FMA on sm_70); the scan above
    # remains the bf16 / non-CUDA fall-back's form only in name (sm_70 has no bf16). H200, Triton 3.6, same day:
    # tests/kernels/gdn/test_chunk_sm70.py -m gpu 7 passed (output alone and both stages, dk 32 / 128, ragged,
    # 33 chunks in overlapped windows; relative error o 4.5e-4, state 3e-5-7e-5, bound 5e-3).
    # WY (2026-12-06, sm_70 AOT builds at dk = dv = 128, Triton 3.9 / ptxas 12.9; bench/NOTES.md): whole-k products
    # on 4 warps ran on 32 registers with a 16,376 B stack a thread (44,949 STL/LDL), on 8 / 16 warps 11,520 / 3,032 B.
    # Slices of 16 k (wy_ks) with w and u in 64-column blocks on 8 warps: 255 registers, 456 B (439 STL/LDL); on 16
    # warps ptxas took 64 registers and spilled more (1,616 B; 128 forced: 968 B); slices of 16 with whole w, u
    # blocks on 16 warps 864 B. V100 projection of the 27B 8K WY (dry run): 4,071 us + 157 GB of spills before,
    # 2,797 us + 2.8 GB now. The tl.dot WY is the fall-back of wy_hmma (2026-12-06: the WY stage on HMMA.884,
    # chunk_wy_sm70.py; projected 519 us, the GDN op 1,771 us; not yet run on a GPU when set: if
    # tests/kernels/gdn/test_chunk_wy_sm70.py -m gpu fails, clear wy_hmma and the sliced tl.dot WY runs).
    70: GDNTable(wy_warps=8, wy_dot="ieee", wy_ks=16, h_bv=32, h_warps=4, h_stages=1, o_bv=32, o_warps=4, o_stages=1,
                 scan_bv=64, scan_warps=8, scan_stages=2, rec_bv=32, rec_warps=4, prefill="split",
                 overlap_max_programs=4096, scan_overlap_max_programs=80, o_hmma=True,
                 h_hmma=True, wy_hmma=True),
    # sm_90, H200, 2026-12-01 (bench_gdn.py, whole op, ms at 1 x 8K / 1 x 64K / 8 x 4K ragged; sweep rows
    # checked against the table's output). This row with h 2 stages and o 8 warps: split 0.95 / 6.23 / 3.05,
    # scan 1.11 / 7.90 / 3.63,
    # fla 1.32 / 5.97 / 2.85. Around it: h BV 32 0.92 / 6.74 / 3.27; windows from 32 chunks 1.99 / 6.25 /
    # 3.11 and none 0.96 / 7.73 / 3.16, hence from 256 (1 x 8K has 128; nothing measured from 129 to
    # 515); WY 8 warps 1.23 / 8.88 / 4.44; h 3 stages alone 0.84 / 5.87 / 2.92, o 4 warps alone 0.93 /
    # 6.16 / 2.82, so the row takes both. 2026-11-30: h 1 stage hit an illegal address (Triton
    # 3.6). Scan (the fall-back): windows 7.98 vs 8.71 without at 64K, 8 warps (9.14 at 4), 2 stages;
    # its BV 32 / 4 warps is wrong on the H200 (2.0 relative). Decode BV 64 / 4 warps; on 16-bit states (the
    # fp16 default) BV 32 / 1 warp: 13.3 / 47.9 / 91.7 us at batch 8 / 32 / 64 against 15.3 / 57.2 / 108 (H100,
    # session 15, bench_gdn.py --only sweep-decode: 63-73% of copy bandwidth against 55-62%). sm_80 copies it
    # unmeasured (no A100 here). Later, with the serial kernel's state as two 64-row blocks: this row
    # 0.805 / 5.57 / 2.82; h 2 stages 0.926 / 6.13 / 2.83, h BV 32 0.841 / 6.08 / 3.04, h 8 warps 0.867 /
    # 6.18 / 3.04 (bench_gdn.py --only sweep-prefill times these fields).
    80: GDNTable(wy_warps=4, wy_dot="tf32", h_bv=64, h_warps=4, h_stages=3, o_bv=128, o_warps=4, o_stages=2,
                 scan_bv=64, scan_warps=8, scan_stages=2, rec_bv=64, rec_warps=4,
                 overlap_max_programs=4096, overlap_min_chunks=256, scan_overlap_max_programs=108),
    90: GDNTable(wy_warps=4, wy_dot="tf32", h_bv=64, h_warps=4, h_stages=3, o_bv=128, o_warps=4, o_stages=2,
                 scan_bv=64, scan_warps=8, scan_stages=2, rec_bv=64, rec_warps=4, rec16_bv=32, rec16_warps=1,
                 overlap_max_programs=4096, overlap_min_chunks=256, scan_overlap_max_programs=132),
}


@functools.cache
def device_table(device: torch.device) -> GDNTable:
    # the interpreter (CI) gets the sm_80 row
    return TABLE[arch_of(device)]


def rows(t):
    """``t`` with unit stride in its last dim (copied only if it has not)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _check(q, k, v, g, beta, ssm_states, chunk_size=BT, names=("g", "beta")):
    t, hk, dk = q.shape
    hv, dv = v.shape[1:]
    ng, nb = names
    if k.shape != q.shape or v.shape[0] != t or hv % hk or g.shape != (t, hv) or beta.shape != (t, hv):
        raise ValueError(f"gated delta rule: q, k [T, Hk, dk], v [T, Hv, dv] with Hv a multiple of Hk, {ng} and "
                         f"{nb} [T, Hv]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"{ng} {tuple(g.shape)}, {nb} {tuple(beta.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"gated delta rule: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if ssm_states.shape[1:] != (hv, dk, dv) or ssm_states.dtype not in STATE_DTYPES or \
            not ssm_states[0].is_contiguous():
        raise ValueError(f"gated delta rule: ssm_states must be fp32, fp16 or bf16 [slots, {hv}, {dk}, {dv}], "
                         f"contiguous per slot; got {ssm_states.dtype} {tuple(ssm_states.shape)} strides "
                         f"{ssm_states.stride()}")
    if chunk_size != BT:
        raise ValueError(f"the Triton chunked gated delta rule uses chunk_size={BT}; got {chunk_size}")


def prepare(q, k, v, g, beta, ssm_states, qsl, chunk_size=BT, names=("g", "beta")):
    """Checked inputs with unit stride in their last dim, the empty output [T, Hv, dv] and the number of
    sequences; shared by the chunked and the recurrent forms. ``names``: what the caller calls g and beta in its
    errors (the fused gating's a and b)."""
    _check(q, k, v, g, beta, ssm_states, chunk_size, names)
    q, k, v, g, beta = (rows(x) for x in (q, k, v, g, beta))
    o = torch.empty((q.shape[0],) + tuple(v.shape[1:]), dtype=v.dtype, device=v.device)
    return q, k, v, g, beta, o, qsl.shape[0] - 1


def pad(n: int) -> int:
    """The block for a head dim of ``n``: the next power of two, at least 16."""
    return max(16, triton.next_power_of_2(n))


def aot_config(kernel, ptrs: dict, consts: dict, num_warps: int, num_stages: int, name: str,
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
