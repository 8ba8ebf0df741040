"""Row statistics of an HMMA.884 fragment tile (common/mma884.py) for the online softmax of paged_sm70.py.

The fragment tile [BM//8, BN//8, 2, 4, 8] = [mb, nb, h, l, i] spreads a row over lanes and registers:

    row = 8 mb + 4 h + 2 (i >> 1 & 1) + (l & 1)        col = 8 nb + 4 (i >> 2) + 2 (l >> 1) + (i & 1)

so the row and column bits are interleaved inside the l and i dims. Splitting those dims into their bits,
[mb, nb, h, l2, l1, i4, i2, i1] (``frag_bits``: a reshape, no data moves, and the layout stays a BlockedLayout),
makes every bit its own dim, and a row statistic is four single-dim reductions over the column dims
(nb, l2, i4, i1), each of them a plain reduction of a blocked layout.

Why not reduce a [BM, BN] relabelling of the tile (a reshape + permute to rows x columns, the first version):
Triton 3.6 lowers a reduction over such a linear layout as if the reduced dim's lanes were contiguous. The
columns live on lane bits 1 and 3; 3.6 emitted ``shfl.bfly`` 2 and 4 (lane bit 2 is a row bit, mb), so every
row max / row sum mixed rows 8 apart and the outputs came out off by one factor per row (the H200 run of
session 9: got/want 0.43 in prefill, 1.13 in decode, the products exact). Triton 3.9 emits 2 and 8 for the
same IR. tests/kernels/attention/test_softmax_sm70.py checks the shuffles of these helpers in the PTX of every
Triton it runs under (so bench/aot_triton_versions.sh checks 3.5 and 3.6 on a CPU), and on the GPU the values.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..common.mma884 import acc_rows_cols


@gluon.jit
def frag_bits(x, BM: gl.constexpr, BN: gl.constexpr):
    """Fragment tile [BM//8, BN//8, 2, 4, 8] -> [mb, nb, h, l2, l1, i4, i2, i1] (l = 2 l2 + l1, i = 4 i4 + 2 i2
    + i1): row 8 mb + 4 h + 2 i2 + l1, column 8 nb + 4 i4 + 2 l2 + i1."""
    return gl.reshape(x, [BM // 8, BN // 8, 2, 2, 2, 2, 2, 2])


@gluon.jit
def frag_merge(x, BM: gl.constexpr, BN: gl.constexpr, LF: gl.constexpr):
    """Inverse of :func:`frag_bits`, in the fragment layout LF (the reshape gives it back; the conversion only
    names it)."""
    return gl.convert_layout(gl.reshape(x, [BM // 8, BN // 8, 2, 4, 8]), LF)


@gluon.jit
def row_max(x):
    """[mb, nb, h, l2, l1, i4, i2, i1] -> the row maxima [mb, h, l1, i2] (highest dim first, so the lower dims
    keep their numbers)."""
    return gl.max(gl.max(gl.max(gl.max(x, 7), 5), 3), 1)


@gluon.jit
def row_sum(x):
    """[mb, nb, h, l2, l1, i4, i2, i1] -> the row sums [mb, h, l1, i2]."""
    return gl.sum(gl.sum(gl.sum(gl.sum(x, 7), 5), 3), 1)


@gluon.jit
def rows_bcast(r):
    """Row vector [mb, h, l1, i2] -> [mb, 1, h, 1, l1, 1, i2, 1], broadcastable against a ``frag_bits`` tile of
    any width (its layout is the tile's: the slices of the reductions, undone in reverse)."""
    return gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(r, 1), 3), 5), 7)


@gluon.jit
def row_ids(BM: gl.constexpr, BN: gl.constexpr, WM: gl.constexpr, WN: gl.constexpr):
    """The tile row of each element of a row vector [mb, h, l1, i2] (8 mb + 4 h + l1 + 2 i2), through the same
    reductions as the statistics, so a row's index and its statistic sit in the same lanes."""
    rows, cols = acc_rows_cols(BM, BN, WM, WN)
    return row_max(frag_bits(rows + 0 * cols, BM, BN))


@gluon.jit
def p_to_a_stage(p, BM: gl.constexpr, BN: gl.constexpr):
    """P as [mb, nb, h, l2, l1, i4, i2, i1] -> the A staging shape [(step, mb), h, l, k] of a_smem_shape(BM, BN):
    row 8 mb + 4 h + l with l = 2 i2 + l1, key 8 step + k with step = nb and k = 4 i4 + 2 l2 + i1."""
    p = gl.permute(p, [1, 0, 2, 6, 4, 5, 3, 7])                    # nb, mb, h, i2, l1, i4, l2, i1
    return gl.reshape(p, [BN // 8 * (BM // 8), 2, 4, 8])


__all__ = ["frag_bits", "frag_merge", "row_max", "row_sum", "rows_bcast", "row_ids", "p_to_a_stage"]
