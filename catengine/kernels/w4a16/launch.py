"""The per-architecture launch table of the W4A16 kernels (gemm.py's dispatch, moe/ reads its GEMV and GEMM rows) and
the tile arithmetic derived from it: split K, the GEMV's rows per tile and per thread, the GEMM's k tile.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...errors import ConfigError
from ..common.splitk import held_counters
from .gemm_mma import MmaTile
from .gemm_wgmma import WgmmaTile
from .packing import QuantizedWeight


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
    # (gemm_wgmma.py); ((max_m, (WgmmaTile, ...)), ...) ascending, each row's tiles the candidates of pick_tile
    wgmma: tuple = ()
    # sm_90, inside the mma rows: ((max_m, (WgmmaTile, ...)), ...) as ``wgmma``; a GEMM whose wgmma pick there splits K
    # runs on wgmma instead of mma (an empty tuple: never)
    wgmma_split: tuple = ()

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
# sm_90's mma and wgmma tiles are PDL launches, and the ops before them (norms, silu_mul, the split-K reduce) let
# them start (kernels/common/gdc.py): a chain of the GEMMs alone gained nothing (within 2%), the decode step of
# the 8-layer models with the triggers 0.3-3% (bench/NOTES.md, session 15).
# sm_90's 14-16 rows went from mma (MB 1 W 2) to wgmma R 2 BT 16: the four 27B linears summed 130 -> 123 us at 14
# rows and 139 -> 127 at 16, a tie at 13, mma ahead at 8-12 (bench/NOTES.md, session 18).
# sm_90's wgmma rows list candidate tiles (gemm_wgmma.pick_tile): each GEMM takes the first whose programs fit one
# wave of its resident programs, split K filling that wave. Session 19's sweep (every tile x split on the 27B linears,
# 24-64 rows; bench/NOTES.md) found the wave, not the tile, deciding: a 4-slot R 1 BT 32 for 17-32 rows, a 2-slot
# R 2 BT 64 for 33-64 where a split keeps 16 groups a program; the 27B's four linears 153 -> 137 us at 32 rows,
# 230 -> 204 at 48, 238 -> 216 at 64, the 35B-A3B's 43 -> 30 at 32 (H100).
# Session 20: a rolling wait inside each group (WgmmaTile.roll) frees A registers for one more resident program an SM
# at some cost to each program (qkv at 32 rows 30.5 -> 33.0 us with the same split), so the rolling tiles sit where
# the extra slot changes the launch: gate_up's 544 R 1 BT 32 programs fit 5 an SM (32 rows 59.4 -> 56.3 us), and at
# 33-64 rows R 1 BT 64 at 4 an SM splits o_proj / down 6 ways, R 2 BT 64 at 3 holds gate_up in one wave; the 27B's
# four linears 220 -> 201 us at 64 rows, 207 -> 185 at 48 (H100, alternated; the 35B-A3B's small linears, which a
# split would leave under 4 groups a program, keep R 1 BT 64).
# In the mma rows (8-13 of them), R 2 BT 16 with a roll beat the mma tile wherever its pick splits K (the 27B's qkv /
# o_proj / down at 12 rows 1.08 / 1.22 / 1.09x, the 35B-A3B's four linears at 8 rows 1.04-1.28x) and lost where it
# does not (gate_up, 544 programs unsplit: 0.80x), so the wgmma_split row takes it only for a split pick (session 20).
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
    ), mma=((13, MmaTile(1, 2, 4, pdl=True)),),
        wgmma_split=((7, ()), (13, (WgmmaTile(2, 16, 4, pdl=True, roll=1),))),
        wgmma=((16, (WgmmaTile(2, 16, 3, pdl=True),)),
               (32, (WgmmaTile(1, 32, 4, pdl=True), WgmmaTile(1, 32, 5, pdl=True, roll=2),
                     WgmmaTile(2, 32, 3, pdl=True))),
               (64, (WgmmaTile(1, 64, 4, pdl=True, min_groups=4, roll=1), WgmmaTile(2, 64, 2, pdl=True, min_groups=16),
                     WgmmaTile(1, 64, 3, pdl=True), WgmmaTile(2, 64, 3, pdl=True, roll=0),
                     WgmmaTile(2, 32, 3, pdl=True))))),
}


def with_gemm_pdl(table: ArchTable, pdl: bool) -> ArchTable:
    """``table`` with every mma and wgmma tile's programmatic dependent launch set to ``pdl`` (the GEMV's is its own
    field): how the PDL tests and bench/bench_pdl.py switch it."""
    def rows(entry):
        return tuple((b, tuple(replace(t, pdl=pdl) for t in ts)) for b, ts in entry)
    return replace(table, mma=tuple((b, replace(t, pdl=pdl)) for b, t in table.mma), wgmma=rows(table.wgmma),
                   wgmma_split=rows(table.wgmma_split))


def split_counters(weight: QuantizedWeight, needed: int, size: int):
    """The weight's arrival counters for the GEMV's in-kernel split-K reduce (``splitk.held_counters``: None
    when a call needs more or the first use is inside a graph capture; the caller then launches the reduce
    kernel)."""
    return held_counters(weight, "split_counters", weight.qweight.device, needed, size)


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
