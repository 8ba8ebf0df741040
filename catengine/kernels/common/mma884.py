"""The HMMA.884 building block: ``mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32`` from Gluon, for the sm_70
kernels of every family (issue 18; the fragment maps are in ../shared/design/SM70.md).

From Triton 3.3 on ``tl.dot`` compiles to FMA on sm_70, so Volta's tensor cores are reached only through inline
PTX with layouts we choose ourselves. m8n8k4 is a per-quad-pair instruction: the four quad-pairs of a warp
(lanes 4q..4q+3 and 4q+16..4q+19, q = (lane >> 2) & 3) each compute their own 8x8 block. Within a quad-pair,
with l = lane & 3 and h = lane >= 16:

    A row  = B col = l + 4h                       (each lane holds 4 k of its row / column)
    C row  = (l & 1) + (i & 2) + 4h               (i = 0..7, the lane's accumulator index)
    C col  = (i & 4) + (l & 2) + (i & 1)

The fragments live in one 5-D register tensor, the *fragment tile* of a (BM, BN) tile:

    [BM // 8, BN // 8, 2, 4, 8]  =  [mb, nb, h, l, i]

with a BlockedLayout whose lane bits 0-1 go to l, bit 2 to mb, bit 3 to nb, bit 4 to h (so quad-pair
q = (mb & 1) + 2 (nb & 1) and each quad-pair owns one 8x8 block), its warps to mb and nb, and 8 consecutive
registers to i. ``gl.inline_asm_elementwise`` with ``pack=8`` therefore hands each call one lane's 8
accumulators of one 8x8 block, and the same 8 register slots of A and B:

    accumulator [mb, nb, h, l, i] = C[8 mb + (l & 1) + (i & 2) + 4h, 8 nb + (i & 4) + (l & 2) + (i & 1)]
    A fragment  [mb, 1,  h, l, k] = A[8 mb + l + 4h, k0 + k]          (broadcast along nb: free, registers)
    B fragment  [1,  nb, h, l, k] = B[k0 + k, 8 nb + l + 4h]          (broadcast along mb)

One call issues two m8n8k4 (k = 0..3, then 4..7), so one ``mma884`` step covers k = 8 of the whole tile.
Kernels stage A as [BK // 8 * BM // 8, 2, 4, 8] = [(step, mb), h, l, k] and B likewise with nb in shared
memory (``a_smem_shape`` / ``b_smem_shape``), so that step j loads ``smem.slice(j * BM // 8, BM // 8)`` in
``a_layout`` / ``b_layout`` without any reshape, and store the accumulator through ``acc_rows_cols``.
"""
from __future__ import annotations

from dataclasses import dataclass

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ...errors import KernelContractError

# The CTA-wide barrier is ``gl.barrier`` in Triton 3.9 and ``gl.thread_barrier`` in 3.5/3.6, the versions V100
# users run (the H200's 3.6 refused gl.barrier at compile time); kernels call ``cta_barrier()``.
cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def cumsum(x, axis: gl.constexpr):
    """Inclusive prefix sum along ``axis``: ``gl.cumsum`` is newer than Triton 3.6 (3.5 and 3.6 lack it), while
    ``gl.associative_scan`` exists in 3.5, 3.6 and 3.9."""
    return gl.associative_scan(x, axis, _add)

# two m8n8k4 per call; early-clobber outputs (=&f) keep ptxas from giving D the registers of A, B or C,
# which the second instruction still reads
_MMA884_ASM = gl.constexpr("""
mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {$0,$1,$2,$3,$4,$5,$6,$7}, {$16,$17}, {$20,$21}, {$8,$9,$10,$11,$12,$13,$14,$15};
mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {$0,$1,$2,$3,$4,$5,$6,$7}, {$18,$19}, {$22,$23}, {$0,$1,$2,$3,$4,$5,$6,$7};
""")
_MMA884_CONSTRAINTS = gl.constexpr(",".join(["=&f"] * 8 + ["f"] * 8 + ["r"] * 8))


def tile_check(BM: int, BN: int, BK: int, WM: int, WN: int) -> None:
    """A (BM, BN, BK) tile on WM x WN warps is valid when every warp owns whole 16 x 16 quad-pair squares and BK
    is whole k = 8 steps; raises ValueError otherwise (callers turn it into their own error type)."""
    for name, v in (("BM", BM), ("BN", BN), ("BK", BK), ("WM", WM), ("WN", WN)):
        if v <= 0 or v & (v - 1):
            raise ValueError(f"{name}={v} must be a power of two")
    if BM % (16 * WM) or BN % (16 * WN) or BK % 8:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} on {WM}x{WN} warps: need BM % (16*WM) == 0, "
                         f"BN % (16*WN) == 0 and BK % 8 == 0")


@dataclass(frozen=True)
class Tile884:
    """A (BM, BN, BK) tile of an HMMA.884 kernel on WM x WN warps (WM * WN = num_warps)."""
    BM: int
    BN: int
    BK: int
    WM: int
    WN: int

    @property
    def num_warps(self) -> int:
        return self.WM * self.WN

    def check(self) -> None:
        """:func:`tile_check` as a kernel contract: a launcher handed a tile the block cannot run."""
        try:
            tile_check(self.BM, self.BN, self.BK, self.WM, self.WN)
        except ValueError as e:
            raise KernelContractError(str(e)) from None


def pick_tile(table: tuple[tuple[int | None, Tile884], ...], M: int) -> Tile884:
    """The tile of the first ``(max M, tile)`` row that takes M rows; the last row's bound is None."""
    for max_m, tile in table:
        if max_m is None or M <= max_m:
            return tile
    raise AssertionError("unreachable: the last row has no bound")


@gluon.constexpr_function
def frag_layout(WM, WN):
    """Layout of the [BM // 8, BN // 8, 2, 4, 8] fragment tile on WM x WN warps (module docstring)."""
    return gl.BlockedLayout(size_per_thread=[1, 1, 1, 1, 8], threads_per_warp=[2, 2, 2, 4, 1],
                            warps_per_cta=[WM, WN, 1, 1, 1], order=[4, 3, 0, 1, 2])


@gluon.constexpr_function
def a_layout(WM, WN):
    """Layout of one k = 8 step of A, [BM // 8, 2, 4, 8]; ``gl.expand_dims(a, 1)`` gives the A fragment."""
    return gl.SliceLayout(1, frag_layout(WM, WN))


@gluon.constexpr_function
def b_layout(WM, WN):
    """Layout of one k = 8 step of B, [BN // 8, 2, 4, 8]; ``gl.expand_dims(b, 0)`` gives the B fragment."""
    return gl.SliceLayout(0, frag_layout(WM, WN))


@gluon.constexpr_function
def a_smem_shape(BM, BK):
    """Shared-memory staging of an A tile [BM, BK]: [BK // 8 * BM // 8, 2, 4, 8] = [(step, mb), h, l, k]
    (step and mb share a dim: a shared layout covers the rank of the view that is loaded)."""
    return [BK // 8 * (BM // 8), 2, 4, 8]


@gluon.constexpr_function
def b_smem_shape(BK, BN):
    """Shared-memory staging of a B tile [BK, BN]: [BK // 8 * BN // 8, 2, 4, 8] = [(step, nb), h, l, k]."""
    return [BK // 8 * (BN // 8), 2, 4, 8]


@gluon.constexpr_function
def smem_layout():
    """Unswizzled row-major staging; step j is a slice along dim 0, read with 16-byte loads along k."""
    return gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[3, 2, 1, 0])


@gluon.jit
def mma884(acc, a, b):
    """acc [BM//8, BN//8, 2, 4, 8] fp32 += A fragment [BM//8, 1, 2, 4, 8] @ B fragment [1, BN//8, 2, 4, 8],
    all in ``frag_layout``: one k = 8 step of the tile, two m8n8k4 per lane group."""
    return gl.inline_asm_elementwise(_MMA884_ASM, _MMA884_CONSTRAINTS, [acc, a, b],
                                     dtype=gl.float32, is_pure=True, pack=8)


@gluon.jit
def frag_index(BM: gl.constexpr, BN: gl.constexpr, WM: gl.constexpr, WN: gl.constexpr):
    """(mb, nb, h, l, i) index tensors of the fragment tile, each broadcastable to its full shape."""
    L: gl.constexpr = frag_layout(WM, WN)
    mb = gl.arange(0, BM // 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, L)))))
    nb = gl.arange(0, BN // 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, L)))))
    h = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(4, L)))))
    ll = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(4, L)))))
    i = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, L)))))
    mb = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(mb, 1), 2), 3), 4)   # [BM//8, 1, 1, 1, 1]
    nb = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(nb, 0), 2), 3), 4)   # [1, BN//8, 1, 1, 1]
    h = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(h, 0), 1), 3), 4)     # [1, 1, 2, 1, 1]
    ll = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(ll, 0), 1), 2), 4)   # [1, 1, 1, 4, 1]
    i = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(i, 0), 1), 2), 3)     # [1, 1, 1, 1, 8]
    return mb, nb, h, ll, i


@gluon.jit
def acc_rows_cols(BM: gl.constexpr, BN: gl.constexpr, WM: gl.constexpr, WN: gl.constexpr):
    """Row and column, inside the (BM, BN) tile, of each accumulator of the fragment tile (C map above);
    broadcastable to [BM//8, BN//8, 2, 4, 8]."""
    mb, nb, h, ll, i = frag_index(BM, BN, WM, WN)
    rows = 8 * mb + (ll & 1) + (i & 2) + 4 * h
    cols = 8 * nb + (i & 4) + (ll & 2) + (i & 1)
    return rows, cols


# ---------------------------------------------------------------- global -> shared staging
@gluon.constexpr_function
def stage_layout_a(num_warps):
    """Global -> register layout of A's [(step, mb), 2, 4, 8] staging: 8 consecutive k per lane (16 bytes)."""
    return gl.BlockedLayout(size_per_thread=[1, 1, 1, 8], threads_per_warp=[4, 2, 4, 1],
                            warps_per_cta=[num_warps, 1, 1, 1], order=[3, 2, 1, 0])


@gluon.constexpr_function
def stage_layout_b(num_warps):
    """Global -> register layout of B's [(step, nb), 2, 4, 8] staging: 8 consecutive columns (h, l) per lane,
    since B [K, N] is contiguous along N."""
    return gl.BlockedLayout(size_per_thread=[1, 2, 4, 1], threads_per_warp=[4, 1, 1, 8],
                            warps_per_cta=[num_warps, 1, 1, 1], order=[2, 1, 3, 0])


@gluon.jit
def stage_index(ROWS: gl.constexpr, L: gl.constexpr):
    """(d, h, l, k) index tensors of a [ROWS, 2, 4, 8] staging tile in layout L."""
    d = gl.arange(0, ROWS, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, L))))
    h = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, L))))
    ll = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, L))))
    k = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L))))
    d = gl.expand_dims(gl.expand_dims(gl.expand_dims(d, 1), 2), 3)      # [ROWS, 1, 1, 1]
    h = gl.expand_dims(gl.expand_dims(gl.expand_dims(h, 0), 2), 3)      # [1, 2, 1, 1]
    ll = gl.expand_dims(gl.expand_dims(gl.expand_dims(ll, 0), 1), 3)    # [1, 1, 4, 1]
    k = gl.expand_dims(gl.expand_dims(gl.expand_dims(k, 0), 1), 2)      # [1, 1, 1, 8]
    return d, h, ll, k


__all__ = ["cta_barrier", "cumsum", "Tile884", "pick_tile", "tile_check", "frag_layout", "a_layout", "b_layout", "a_smem_shape", "b_smem_shape", "smem_layout",
           "mma884", "frag_index", "acc_rows_cols",
           "stage_layout_a", "stage_layout_b", "stage_index"]
