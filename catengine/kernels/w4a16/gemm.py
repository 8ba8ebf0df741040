"""Triton W4A16 linear: ``y = x @ dequant(W) (+ bias)`` for the canonical K-packed layout (packing.py).

Two kernels here, picked by M from a per-architecture table (and the tensor-core kernels below):

- ``w4a16_gemv_kernel`` (decode, M <= table's gemv_max_m; in :mod:`catengine.kernels.w4a16.gemv`,
  which describes its tiles and weight math): m_rows activation rows per program share each
  dequantised tile, packed half2 math in inline PTX for fp16 and fp32 mantissa-trick math for bf16
  and the interpreter, split-K so that even N = 5120 puts enough programs on the chip. On the H200
  (bench_gemm.py --gemv-m1 / --gemv-pick) the plain loop beat both a one-tile-ahead register
  prefetch (double registers, fewer warps) and Triton's cp.async pipelining (``tl.range(num_stages=
  3..4)``, 1.5-2.5x slower); the table holds the best of the tiles tried (64 x 512, 4 warps). On
  sm_90 each GEMV is a programmatic dependent launch (``pdl``): it fetches its first tile while the
  kernel before it runs out, which took the four 27B shapes at M = 1 from 93.3 to 75.7 us (graphs of
  8 or more back-to-back calls; bench/NOTES.md). At M = 2 two rows per program beat one (106 against
  127 us summed) and the GEMM; at M = 4 the GEMM wins by ~4%, hence gemv_max_m 2 on sm_90.
- ``_w4a16_gemm_kernel`` (M above that): ``tl.dot`` with the dequantised weight as the *first*
  operand (``acc[BN, BM] = W^T x^T``), so that on sm_90 the computed operand may sit in registers
  (wgmma takes only A from registers) while x streams into shared memory; a small M then costs a
  narrow wgmma N instead of a 64-row M tile. Dequant works on pairs: ``(w >> 4j) & 0x000F000F |
  0x64006400`` holds nibbles j and j+4 as the fp16 values ``1024 + q`` (``128 + q`` in bf16).

On sm_80/90, fp16 GEMMs of gemv_max_m < M <= the row's ``mma`` bound go to ``w4a16_gemm_mma`` (gemm_mma.py:
Gluon, mma.sync m16n8k16 with the weight dequantised in registers as the A operand): on the H100 it beat this
module's tl.dot GEMM 1.2-1.5x at M = 4-16 and lost above 24 rows (bench/NOTES.md), hence the bound. On sm_90 the
rows above it up to the ``wgmma`` bound go to ``w4a16_gemm_wgmma`` (gemm_wgmma.py: the same registers as wgmma's A
operand, x from shared memory): 1.3x the mma kernel at 24 rows and 1.3x tl.dot at 32 on the H100.
On the sm_70 row, fp16 GEMMs from ``hmma_min_m`` rows on go to ``w4a16_gemm_sm70`` (gemm_sm70.py: Gluon,
HMMA.884), since Triton >= 3.3 lowers ``tl.dot`` to FMA there; ``_w4a16_gemm_kernel`` stays for sm_80/90, for
what the HMMA kernel does not tile, and as its twin in the interpreter (which runs no Gluon).

Split-K programs write fp32 partials that ``splitk_reduce_kernel`` sums in a fixed order (results
do not depend on scheduling) while adding the bias and casting. A GEMV row with ``fused_reduce`` skips
that launch: the last program of each tile to arrive at an acq_rel counter (``split_counters``, owned
by the weight) sums the partials in the same fixed order. The sm_90 row uses it (see the table's
comment); the sm_70 and sm_80 rows keep the reduce launch, as nothing timed it there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...errors import ConfigError, KernelContractError
from ..common.aot import AotConfig
from ..common.arch import INTERPRET, arch_key, device_key
from ..common.splitk import REDUCE_BLOCK, reduce_splits, split_partials, splitk_reduce_kernel  # noqa: F401 (aot)
from .packing import QuantizedWeight
from .gemv import w4a16_gemv_kernel
from .gemm_sm70 import w4a16_gemm_sm70
from .gemm_mma import MmaTile, mma_applies, pick_mma_tile, w4a16_gemm_mma
from .gemm_wgmma import WgmmaTile, w4a16_gemm_wgmma, wgmma_applies


# ---------------------------------------------------------------- dequantisation helpers
@triton.jit
def _pair(b_q, J: tl.constexpr, b_zc, b_s, nib2, DT: tl.constexpr, F32_MATH: tl.constexpr):
    """Nibbles J and J+4 of b_q [BN, R] dequantised to DT: [BN, R, 2]."""
    if DT == tl.bfloat16:
        MAGIC: tl.constexpr = 0x43004300   # bf16 128.0 in both halves
    else:
        MAGIC: tl.constexpr = 0x64006400   # fp16 1024.0 in both halves
    b_v = ((b_q >> (4 * J)) & nib2) | MAGIC
    if F32_MATH:
        # a bf16's bits are the top half of the equal fp32
        b_p = tl.join((b_v << 16).to(tl.float32, bitcast=True), (b_v & -65536).to(tl.float32, bitcast=True))
    else:
        # the two halves of one int32, so the math below runs on b_v's register as a packed pair
        b_p = tl.join(b_v.to(tl.int16), (b_v >> 16).to(tl.int16)).to(DT, bitcast=True)
    # (magic + q) - (magic + z) is exact; one rounding in the product, as a dequantised fp16 weight has
    return ((b_p - b_zc[:, :, None]) * b_s[:, :, None]).to(DT)


@triton.jit
def dequant_tile(b_q, b_s, b_z, nib2, DT: tl.constexpr, INTERPRET: tl.constexpr):
    """K-packed int32 [BN, R] with scales/zeros [BN, R] (any float dtype) -> W^T [BN, 8R] in DT.

    join() adds an innermost dimension held by one thread, so every int32's eight values stay in
    its thread; the nesting makes the flattened index 4*c1 + 2*c2 + c3 equal the nibble index.
    nib2 is 0x000F000F passed at run time (see fma_tile). The interpreter stores bf16 as raw
    uint16 and cannot do arithmetic on it, so there (INTERPRET) bf16 math runs in fp32; the result
    is the same, one rounding."""
    F32_MATH: tl.constexpr = INTERPRET and DT == tl.bfloat16
    if DT == tl.bfloat16:
        b_zc = b_z + 128.0
    else:
        b_zc = b_z + 1024.0
    if not F32_MATH:
        b_zc = b_zc.to(DT)
        b_s = b_s.to(DT)
    else:
        b_s = b_s.to(tl.float32)
    w04 = _pair(b_q, 0, b_zc, b_s, nib2, DT, F32_MATH)
    w15 = _pair(b_q, 1, b_zc, b_s, nib2, DT, F32_MATH)
    w26 = _pair(b_q, 2, b_zc, b_s, nib2, DT, F32_MATH)
    w37 = _pair(b_q, 3, b_zc, b_s, nib2, DT, F32_MATH)
    b_w = tl.join(tl.join(w04, w26), tl.join(w15, w37))
    return tl.reshape(b_w, (b_q.shape[0], b_q.shape[1] * 8))


@triton.jit
def mma(b_a, b_b, acc, INTERPRET: tl.constexpr):
    """tl.dot(b_a, b_b, acc); the interpreter multiplies bf16's raw bits, so there it goes via fp32."""
    if INTERPRET and b_a.dtype == tl.bfloat16:
        return tl.dot(b_a.to(tl.float32), b_b.to(tl.float32), acc)
    return tl.dot(b_a, b_b, acc)


# ---------------------------------------------------------------- kernels
@triton.jit
def _w4a16_gemm_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, part_ptr, M, N, K, stride_xm,
                       stride_ym, nib2, G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
                       HAS_BIAS: tl.constexpr, INTERPRET: tl.constexpr):
    DT: tl.constexpr = x_ptr.dtype.element_ty
    i_t, i_s = tl.program_id(0), tl.program_id(1)
    # programs that run together share GROUP_M row tiles, so each weight tile is fetched once per group
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    i_g = i_t // (GROUP_M * n_n)
    m_first = i_g * GROUP_M
    g_m = tl.minimum(n_m - m_first, GROUP_M)
    i_m = m_first + (i_t % (GROUP_M * n_n)) % g_m
    i_n = (i_t % (GROUP_M * n_n)) // g_m
    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    m_m, m_n = o_m < M, o_n < N
    o_r = tl.arange(0, BK // 8)
    o_k = tl.arange(0, BK)
    n_kb = K // BK
    kb_per = tl.cdiv(n_kb, SPLIT_K)
    kb_end = tl.minimum(kb_per * (i_s + 1), n_kb)
    acc = tl.zeros([BN, BM], tl.float32)
    for kb in range(kb_per * i_s, kb_end):
        k0 = kb * BK
        # [BN, BK // 8]
        b_q = tl.load(qw_ptr + (k0 // 8 + o_r)[None, :] * N + o_n[:, None], mask=m_n[:, None], other=0)
        # [BN, BK // 8]: one scale row per tile, read in b_q's shape so that it lands in b_q's
        # layout (a [BN] vector would need a shared-memory layout conversion every iteration)
        p_sz = (k0 // G) * N + o_n[:, None] + 0 * o_r[None, :]
        b_s = tl.load(s_ptr + p_sz, mask=m_n[:, None], other=0)
        b_z = tl.load(z_ptr + p_sz, mask=m_n[:, None], other=0).to(tl.float32)
        b_w = dequant_tile(b_q, b_s, b_z, nib2, DT, INTERPRET)
        # [BK, BM]
        b_x = tl.load(x_ptr + o_m[None, :] * stride_xm + (k0 + o_k)[:, None], mask=m_m[None, :], other=0)
        acc = mma(b_w, b_x, acc, INTERPRET)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + o_n, mask=m_n, other=0).to(tl.float32)[:, None]
        tl.store(y_ptr + o_m[None, :] * stride_ym + o_n[:, None], acc.to(DT), mask=m_n[:, None] & m_m[None, :])
    else:
        tl.store(part_ptr + (i_s * M + o_m[None, :]) * N + o_n[:, None], acc, mask=m_n[:, None] & m_m[None, :])


# ---------------------------------------------------------------- launch table
@dataclass(frozen=True)
class GemvConfig:
    BN: int
    BK: int
    num_warps: int
    num_stages: int
    waves: int          # split K until about waves * SMs programs exist
    m_rows: int = 1     # dense GEMV: activation rows per program (1, 2 or 4), sharing each dequantised tile
    prefetch: bool = True   # dense GEMV: issue the next tile's loads before this tile's math
    half2: bool = True      # dense GEMV, fp16: packed half2 weight math (else the fp32 math bf16 uses)
    # dense GEMV with split K: the last split of a tile reduces (no second launch)
    fused_reduce: bool = False
    # dense GEMV (sm_90 only): a programmatic dependent launch that fetches its first tile while the
    # kernel before it finishes (gemv.py's PDL); the MoE decode kernels take moe.fused's decode_pdl
    pdl: bool = False


@dataclass(frozen=True)
class GemmConfig:
    BM: int
    BN: int
    BK: int
    num_warps: int
    num_stages: int
    waves: int = 1      # > 1 only for memory-bound sizes: split K toward waves * SMs programs
    group_m: int = 8


@dataclass(frozen=True)
class ArchTable:
    gemv_max_m: int
    gemv: GemvConfig
    gemm: tuple         # ((max_m, GemmConfig), ...) ascending; the last covers every larger M
    # sm_70: from this M on, fp16 GEMMs run on the tensor cores (HMMA.884, gemm_sm70.py) instead of tl.dot,
    # which Triton >= 3.3 lowers to FMA there; None: tl.dot only
    hmma_min_m: int | None = None
    # sm_80+: fp16 GEMMs of M above gemv_max_m up to the last bound run on mma.sync m16n8k16 with the weight in
    # registers (gemm_mma.py); ((max_m, MmaTile), ...) ascending, () for tl.dot only
    mma: tuple = ()
    # sm_90: fp16 GEMMs of M above the mma rows up to the last bound run on wgmma with the weight in registers
    # (gemm_wgmma.py); ((max_m, WgmmaTile), ...) ascending
    wgmma: tuple = ()


MAX_SPLIT_K = 32

# The GEMV row: 64 columns x 512 inputs per tile, no prefetch, no pipelining, split toward 16 waves
# (measured on the H200; sm_80 and sm_70 take it unmeasured, with M = 1 only, no PDL: griddepcontrol
# needs sm_90). On sm_90 the last split of a tile reduces in-kernel: 91.7 against 95.3 us summed over
# the four 27B shapes at M = 1 (bench_gemm.py --gemv-m1), and one launch fewer per linear; with PDL,
# splitting toward 8 waves (80.3 us) edged out 16 (82.4), and 2 rows per program serve M = 2. sm_70 has no
# cp.async, so its GEMM stages stay at 1-2, and its shared memory (96 KB) bounds the tiles. The sm_90
# choices come from bench/bench_gemm.py --sweep on an H200. The M <= 32 row (a decode step of 17-32
# sequences) was timed after that sweep, by hand, against the candidates its M = 32 bucket now lists: BM 32
# with split toward 8 waves beat BM 64, BM 16, BN 128 and 4 stages at M = 24 and 32 (lost at 48), and the
# four 27B shapes at M = 32 went from 243 to 198 us in bench_gemm.py's table (gate_up 112 -> 89 us).
# sm_70 takes HMMA.884 from 2 rows: its tl.dot GEMM is FMA there and spills, projected (CPU dry run, bench/NOTES.md)
# at 312 us for 5120 x 17408 at M = 2-6 against 55-57 us on HMMA.884 (the M = 1 GEMV: 55 us).
TABLES = {
    "sm70": ArchTable(1, GemvConfig(64, 512, 4, 1, 16, prefetch=False), (
        (16, GemmConfig(16, 64, 64, 4, 1, waves=4)),
        (64, GemmConfig(64, 64, 64, 4, 1, waves=2)),
        (1 << 30, GemmConfig(64, 128, 32, 8, 2)),
    ), hmma_min_m=2),
    "sm80": ArchTable(1, GemvConfig(64, 512, 4, 1, 16, prefetch=False), (
        (16, GemmConfig(16, 64, 128, 4, 3, waves=8)),
        (64, GemmConfig(64, 64, 128, 4, 3, waves=4)),
        (256, GemmConfig(64, 128, 64, 4, 3)),
        (1 << 30, GemmConfig(128, 128, 64, 8, 3)),
    ), mma=((16, MmaTile(1, 2, 4)), (24, MmaTile(2, 1, 4)))),
    "sm90": ArchTable(2, GemvConfig(64, 512, 4, 1, 8, m_rows=2, prefetch=False, fused_reduce=True, pdl=True), (
        (16, GemmConfig(16, 64, 128, 4, 3, waves=8)),
        (32, GemmConfig(32, 64, 128, 4, 3, waves=8)),
        (64, GemmConfig(64, 64, 128, 4, 3, waves=4)),
        (256, GemmConfig(128, 128, 64, 8, 3)),
        (1 << 30, GemmConfig(256, 128, 64, 8, 4)),
    ), mma=((16, MmaTile(1, 2, 4)),), wgmma=((32, WgmmaTile(2, 32, 2)), (64, WgmmaTile(1, 64, 2)))),
}


def split_counters(weight: QuantizedWeight, needed: int, size: int):
    """The weight's zeroed int32 arrival counters for the GEMV's in-kernel split-K reduce (each call
    leaves them zero again), ``size`` of them allocated on first use and never replaced (a captured
    CUDA graph keeps their address). None when a call needs more, or when the first use is inside a
    graph capture: the caller then launches the reduce kernel."""
    buf = weight.split_counters
    if buf is None:
        device = weight.qweight.device
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = weight.split_counters = torch.zeros(max(size, needed), dtype=torch.int32, device=device)
    return buf if needed <= buf.numel() else None


def pick_split(tiles: int, n_kb: int, waves: int, sms: int) -> int:
    """Smallest split count giving about waves * SMs programs; rounded so no split is empty."""
    want = max(1, min(-(-waves * sms // tiles), n_kb, MAX_SPLIT_K))
    per = -(-n_kb // want)
    return -(-n_kb // per)


def gemv_tile_rows(bk: int, k: int, group: int) -> tuple[int, int]:
    """Dense GEMV tile: (R packed rows dividing K / 8, SR rows per scale block: the largest power of
    two that divides the group's G / 8 rows, at most R)."""
    if group % 8:
        raise ConfigError(f"W4A16 group size {group} is not a multiple of 8; use a checkpoint quantised "
                          "with group size 32, 64 or 128")
    r = bk // 8
    while (k // 8) % r:
        r //= 2
    gr = group // 8
    return r, min(gr & -gr, r)


def gemv_thread_rows(r: int, sr: int, bn: int, num_warps: int) -> int:
    """The GEMV kernels' SR: rows of one scale block that one thread holds. Triton lays the tile
    [BN, R // SR, SR] out with 4 columns per thread (16-byte loads), the remaining threads along the
    blocks, and SR in registers; so each thread's rows share one scale and zero point (3 registers
    per column instead of 3 per column and block) and the accumulator is summed over them in-thread
    (one fp32 per block instead of one per int32). The 64 x 512 tile: 128 -> 64 registers and 28 -> 23
    SASS instructions per int32 (Triton 3.6, sm_90); on the H200 the dense GEMV is no faster for it
    (it was not occupancy-bound, bench/NOTES.md) and the MoE decode 1-token step is 12.8 -> 12.1 us."""
    threads = 32 * num_warps
    return max(1, min(sr, r * min(bn // 4, threads) // threads))


def gemv_tile(c: GemvConfig, k: int, group: int) -> tuple[int, int]:
    """The (R, SR) every GEMV-style kernel of config c is launched with: gemv_tile_rows, then
    gemv_thread_rows for its columns and warps."""
    r, sr = gemv_tile_rows(c.BK, k, group)
    return r, gemv_thread_rows(r, sr, c.BN, c.num_warps)


def gemv_rows_per_program(c: GemvConfig, m: int) -> int:
    """The MR the dense GEMV runs with for m activation rows: c.m_rows, capped at the kernel's 1, 2
    or 4-row forms."""
    return min(c.m_rows, 1 if m == 1 else 2 if m == 2 else 4)


def gemv_block_k(bk: int, k: int) -> int:
    """The GEMV reads each int32's own group, so its BK only has to divide K (K % 8 == 0)."""
    while k % bk:
        bk //= 2
    return bk


def block_k(bk: int, group: int, k: int) -> int:
    """The table's BK shrunk until it divides the quantisation group (so a tile has one scale row)."""
    while bk > 16 and (group % bk or k % bk):
        bk //= 2
    if group % bk or k % bk:
        raise ConfigError(f"W4A16 group size {group} (K={k}) is not a multiple of 16; "
                          "use a checkpoint quantised with group size 32, 64 or 128")
    return bk


# ---------------------------------------------------------------- entry point
def check_input(x, weight: QuantizedWeight) -> None:
    """ConfigError unless x is fp16/bf16 with the weight's input features (every W4A16 entry point)."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ConfigError(f"w4a16_linear runs fp16/bf16 activations on CUDA, got {x.dtype}; "
                          "load the model with dtype float16 or bfloat16")
    if x.shape[-1] != weight.in_features:
        raise KernelContractError(f"w4a16_linear: x has {x.shape[-1]} input features, the weight {weight.in_features}")


def hmma_applies(table: ArchTable, m: int, x2, weight: QuantizedWeight) -> bool:
    """Whether the HMMA.884 kernel (gemm_sm70.py) takes this GEMM: the table's row asks for it from this M on,
    fp16 activations, a group it tiles (32/64/128), and a compiled run (the interpreter has no Gluon; the tl.dot
    kernel is its twin there)."""
    return (table.hmma_min_m is not None and m >= table.hmma_min_m and not INTERPRET
            and x2.dtype == torch.float16 and weight.dtype == torch.float16 and weight.group_size in (32, 64, 128)
            and weight.in_features % weight.group_size == 0 and weight.qweight.dim() == 2)


def mma_tile(table: ArchTable, m: int, x2, weight: QuantizedWeight) -> MmaTile | None:
    """The gemm_mma tile for m rows when the row's mma bounds take m and the kernel takes the operands (fp16,
    16-byte rows, groups 32-128; compiled runs only: the interpreter has no Gluon, tl.dot is its twin there)."""
    if INTERPRET or not mma_applies(x2, weight):
        return None
    return pick_mma_tile(table.mma, m)


def wgmma_tile(table: ArchTable, m: int, x2, weight: QuantizedWeight) -> WgmmaTile | None:
    """The gemm_wgmma tile for m rows past the mma rows when the row's wgmma bounds take m and the kernel takes the
    operands (mma_tile's conditions and N % 16 == 0)."""
    if INTERPRET or not wgmma_applies(x2, weight) or (table.mma and m <= table.mma[-1][0]):
        return None
    return pick_mma_tile(table.wgmma, m)


def fused_w4a16_linear(x, weight: QuantizedWeight, bias=None):
    """Triton twin of :func:`catengine.kernels.w4a16.naive.w4a16_linear`."""
    check_input(x, weight)
    k, n = weight.in_features, weight.out_features
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    qw, sc, zr = weight.qweight.contiguous(), weight.scales.contiguous(), weight.zeros.contiguous()
    key, sms = device_key(x.device)
    table = TABLES[key]
    g = weight.group_size
    b_arg = bias if bias is not None else y
    if m <= table.gemv_max_m:
        c = table.gemv
        r, sr = gemv_tile(c, k, g)
        # half2 math needs PTX (not the interpreter) and fp16; x is read as 8-byte words
        f16x2 = c.half2 and x.dtype == torch.float16 and not INTERPRET
        pdl = c.pdl and not INTERPRET
        if f16x2 and (x2.stride(0) % 4 or x2.data_ptr() % 8):
            # a fresh copy: contiguous() may return the same misaligned view (a single row)
            x2 = torch.empty((m, k), dtype=x2.dtype, device=x2.device).copy_(x2)
        mr = gemv_rows_per_program(c, m)
        tiles = triton.cdiv(n, c.BN) * triton.cdiv(m, mr)
        split = pick_split(tiles, k // (8 * r), c.waves, sms)
        part = split_partials(split, y)
        grid = (triton.cdiv(n, c.BN), split, triton.cdiv(m, mr))
        counters = (split_counters(weight, grid[0] * grid[2], grid[0] * max(4, table.gemv_max_m))
                    if split > 1 and c.fused_reduce else None)
        w4a16_gemv_kernel[grid](
            x2, qw, sc, zr, b_arg, y, part, m, n, k, x2.stride(0), y.stride(0), 15, split,
            part if counters is None else counters, G=g, BN=c.BN, R=r, SR=sr, MR=mr, SPLIT=split > 1,
            HAS_BIAS=bias is not None, PREFETCH=c.prefetch, F16X2=f16x2, ASM=not INTERPRET, STAGES=c.num_stages,
            FUSED_REDUCE=counters is not None, PDL=pdl, num_warps=c.num_warps, num_stages=c.num_stages,
            **({"launch_pdl": True} if pdl else {}))
        if counters is not None:
            return y.reshape(*lead, n)
    elif hmma_applies(table, m, x2, weight):
        return w4a16_gemm_sm70(x2, weight, bias).reshape(*lead, n)
    elif (tile := mma_tile(table, m, x2, weight)) is not None:
        return w4a16_gemm_mma(x2, weight, bias, tile).reshape(*lead, n)
    elif (tile := wgmma_tile(table, m, x2, weight)) is not None:
        return w4a16_gemm_wgmma(x2, weight, bias, tile).reshape(*lead, n)
    else:
        c = next(cfg for max_m, cfg in table.gemm if m <= max_m)
        bk = block_k(c.BK, g, k)
        tiles = triton.cdiv(m, c.BM) * triton.cdiv(n, c.BN)
        split = pick_split(tiles, k // bk, c.waves, sms) if c.waves > 1 else 1
        part = split_partials(split, y)
        _w4a16_gemm_kernel[(tiles, split)](
            x2, qw, sc, zr, b_arg, y, part, m, n, k, x2.stride(0), y.stride(0), 0x000F000F, G=g, BM=c.BM,
            BN=c.BN, BK=bk, SPLIT_K=split, GROUP_M=c.group_m, HAS_BIAS=bias is not None,
            INTERPRET=INTERPRET, num_warps=c.num_warps, num_stages=c.num_stages)
    return reduce_splits(part, bias, y, split).reshape(*lead, n)




# ---------------------------------------------------------------- ahead-of-time list
def _signature(dt: str, names: tuple, n_runtime: int) -> dict:
    """The first n_runtime names are pointers/ints, the rest constexprs."""
    types = {"x_ptr": f"*{dt}", "qw_ptr": "*i32", "s_ptr": f"*{dt}", "z_ptr": f"*{dt}",
             "bias_ptr": f"*{dt}", "y_ptr": f"*{dt}", "part_ptr": "*fp32", "count_ptr": "*i32"}
    return {a: types.get(a, "i32") if i < n_runtime else "constexpr" for i, a in enumerate(names)}


_GEMV_ARGS = ("x_ptr", "qw_ptr", "s_ptr", "z_ptr", "bias_ptr", "y_ptr", "part_ptr", "M", "N", "K",
              "stride_xm", "stride_ym", "nib", "n_split", "count_ptr", "G", "BN", "R", "SR", "MR", "SPLIT",
              "HAS_BIAS", "PREFETCH", "F16X2", "ASM", "STAGES", "FUSED_REDUCE", "PDL")
_GEMM_ARGS = _GEMV_ARGS[:12] + ("nib2", "G", "BM", "BN", "BK", "SPLIT_K", "GROUP_M", "HAS_BIAS", "INTERPRET")


def aot_configs(cc: int) -> list[AotConfig]:
    """Every configuration of this architecture's table (group 128 and, for the GEMM, 32), split and
    unsplit, each activation dtype the architecture has (no bf16 before sm_80)."""
    table = TABLES[arch_key(cc)]
    out = []
    for dt in ("fp16",) + (("bf16",) if cc >= 80 else ()):
        c = table.gemv
        # the rows per program w4a16_linear launches at each M up to gemv_max_m
        for mr, split, fused in sorted({(gemv_rows_per_program(c, m), split, fused)
                                        for m in range(1, table.gemv_max_m + 1)
                                        for split, fused in ((1, False), (4, False), (4, True))}):
            r, sr = gemv_tile(c, 5120, 128)
            out.append(AotConfig("w4a16_gemv_kernel", _signature(dt, _GEMV_ARGS, 15),
                                 dict(G=128, BN=c.BN, R=r, SR=sr, MR=mr, SPLIT=split > 1, HAS_BIAS=split == 1,
                                      PREFETCH=c.prefetch, F16X2=c.half2 and dt == "fp16", ASM=True,
                                      STAGES=c.num_stages, FUSED_REDUCE=fused, PDL=c.pdl),
                                 c.num_warps, c.num_stages,
                                 f"gemv {dt} rows{mr} split{split}{' fused reduce' * fused}"))
        for max_m, c in table.gemm:
            for g in (128, 32):
                split = 4 if c.waves > 1 else 1
                out.append(AotConfig("_w4a16_gemm_kernel", _signature(dt, _GEMM_ARGS, 13),
                                     dict(G=g, BM=c.BM, BN=c.BN, BK=block_k(c.BK, g, 4096),
                                          SPLIT_K=split, GROUP_M=c.group_m, HAS_BIAS=True,
                                          INTERPRET=False),
                                     c.num_warps, c.num_stages, f"gemm m<={max_m} {dt} g{g}"))
        reduce_sig = {"part_ptr": "*fp32", "bias_ptr": f"*{dt}", "y_ptr": f"*{dt}", "M": "i32",
                      "N": "i32", "stride_ym": "i32", "SPLIT_K": "constexpr", "BLOCK": "constexpr",
                      "HAS_BIAS": "constexpr"}
        out.append(AotConfig("splitk_reduce_kernel", reduce_sig,
                             dict(SPLIT_K=4, BLOCK=REDUCE_BLOCK, HAS_BIAS=True), 4, 1, f"reduce {dt}"))
    return out
