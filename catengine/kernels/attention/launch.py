"""Launch tables of the paged attention kernels (:mod:`catengine.kernels.attention.paged`) and the helpers
that pick a row, the decode warps and the split count; split from ``paged.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import triton

_MIN_SPLIT_TILES = 4          # a decode split reads at least this many key tiles


@dataclass(frozen=True)
class AttnLaunch:
    block_m: int      # query rows (tokens x group heads) per program; decode: a lower bound
    block_n: int      # keys per inner step
    num_warps: int
    num_stages: int
    two_phase: bool = False  # unmasked loop over the keys all rows see, then a masked one: pays for
    #                          compute-bound prefill; a single masked loop halves the code (and
    #                          sm_70's FMA-lowered dots compile for minutes per copy)
    ctas_per_sm: int = 1     # resident programs per SM (registers, shared memory): decode sizes its
    #                          split count to fill exactly these slots, as a second partial wave
    #                          of programs would nearly double the time
    widen_asm: bool = False  # e5m2 caches: widen bytes to fp16 with inline PTX (one prmt or one and per
    #                          4 bytes instead of ~7 shift/mask/repack instructions); CUDA only, the
    #                          interpreter and other backends fall back to the shifts (same bits)


# (arch, head_dim) -> launch. sm_70: no cp.async (stages 1-2), 96 KB of shared memory, and dots
# lowered to FMA, which hold whole operand fragments in registers: 8 warps and short key tiles keep
# them under 255 registers (bigger tiles spill kilobytes per thread; checked with ptxas -v). The
# sm_80 row also serves sm_86/89 (99 KB of shared memory per block). sm_90: from the launch sweep
# of bench/bench_attention.py on an H200. Decode pipelines the page-table load one stage ahead of
# the K/V tiles it addresses, so num_stages 3-4 leave a single K/V buffer (the next tile's copy
# starts only after this tile's MMAs) and 5 double-buffers them: fp16 d256 N32 s5 reached 0.90 /
# 0.76 / 0.80 / 1.06 of copy bandwidth at 1x128K / 8x8K / 64x1K / 32x32K where N64 s3 reached 0.84 /
# 0.72 / 0.76 / 0.99. e5m2 widens bytes with prmt/and (widen_asm) on every row: d256 decode N64 s5
# then ran 1.50 / 1.64 / 1.69 / 1.78 / 1.91 / 1.88x the fp16 row at 1x32K / 1x128K / 8x8K / 8x32K /
# 32x32K / 64x8K, where N128 s3 with shifts ran 1.31 / 1.48 / 1.48 / 1.58 / 1.68 / 1.68x; e5m2
# prefill 1x8K 323 -> 350 TFLOP/s. sm_70/sm_80 take the widening unmeasured (same bits, fewer
# instructions; prmt exists on both).
PREFILL = {
    (70, 64): AttnLaunch(64, 32, 8, 1), (70, 128): AttnLaunch(64, 16, 8, 1), (70, 256): AttnLaunch(32, 16, 8, 1),
    (80, 64): AttnLaunch(64, 64, 4, 2, True), (80, 128): AttnLaunch(128, 64, 8, 2, True),
    (80, 256): AttnLaunch(64, 32, 8, 2, True),
    (90, 64): AttnLaunch(128, 64, 4, 3, True), (90, 128): AttnLaunch(128, 64, 8, 2, True),
    (90, 256): AttnLaunch(128, 64, 8, 2, True),
}
PREFILL = {key: replace(row, widen_asm=True) for key, row in PREFILL.items()}
DECODE = {
    (70, 64): AttnLaunch(16, 64, 8, 2), (70, 128): AttnLaunch(16, 32, 8, 2), (70, 256): AttnLaunch(16, 16, 8, 2),
    (80, 64): AttnLaunch(16, 64, 4, 2, False, 2), (80, 128): AttnLaunch(16, 64, 4, 2, False, 2),
    (80, 256): AttnLaunch(16, 64, 4, 2, False, 2),
    (90, 64): AttnLaunch(16, 128, 4, 3, False, 2), (90, 128): AttnLaunch(16, 64, 4, 3, False, 2),
    (90, 256): AttnLaunch(16, 32, 4, 5, False, 2),
}
DECODE_E5M2 = {key: replace(row, widen_asm=True) for key, row in DECODE.items()}
DECODE_E5M2[(90, 256)] = AttnLaunch(16, 64, 4, 5, False, 2, widen_asm=True)


def decode_warps(cfg: AttnLaunch, block_m: int) -> int:
    """Speculative rows (block_m above the table's) get proportionally more warps, up to 16."""
    return min(16, cfg.num_warps * block_m // cfg.block_m)


def table_launch(arch: int, d: int, decode: bool, fp8: bool) -> AttnLaunch:
    if not decode:
        return PREFILL[(arch, d)]
    return DECODE_E5M2.get((arch, d), DECODE[(arch, d)]) if fp8 else DECODE[(arch, d)]


def num_decode_splits(batch: int, nkv: int, max_seq_len: int, cfg: AttnLaunch, sms: int) -> int:
    """As many splits as fill the GPU's resident program slots in one wave, but no split shorter than
    _MIN_SPLIT_TILES key tiles."""
    tiles = triton.cdiv(max(max_seq_len, 1), cfg.block_n)
    want = max(1, cfg.ctas_per_sm * sms // max(batch * nkv, 1))
    return max(1, min(want, tiles // _MIN_SPLIT_TILES))
