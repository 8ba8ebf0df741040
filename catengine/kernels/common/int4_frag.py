"""The int4 side of the sm_70 W4A16 kernels (w4a16/gemm_sm70.py, moe/fused_sm70.py): how the packed codes travel
from global memory through shared memory into the B fragment of the HMMA.884 block (common/mma884.py). One int32
of the canonical K-packed layout holds the eight k of one column that a fragment lane needs per k = 8 step, so
the codes' tiles are the B fragment's layout without its k dim: [(step, nb), 2, 4] = [(step, nb), h, l].
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .mma884 import b_layout


@gluon.constexpr_function
def code_layout(WM, WN):
    """One k = 8 step of codes, [BN // 8, 2, 4] int32: the B fragment's layout without its k dim."""
    return gl.SliceLayout(3, b_layout(WM, WN))


@gluon.constexpr_function
def code_stage_layout(num_warps):
    """Global -> register layout of the codes' [(step, nb), 2, 4] staging: 4 consecutive columns per lane."""
    return gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[16, 2, 1], warps_per_cta=[num_warps, 1, 1],
                            order=[2, 1, 0])


@gluon.constexpr_function
def code_smem_layout():
    """Unswizzled staging of the codes, read one int32 per fragment column and k = 8 step."""
    return gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0])


@gluon.jit
def index3(ROWS: gl.constexpr, L: gl.constexpr):
    """(d, h, l) index tensors of a [ROWS, 2, 4] tile in layout L."""
    d = gl.arange(0, ROWS, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))
    h = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))
    ll = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    return gl.expand_dims(gl.expand_dims(d, 1), 2), gl.expand_dims(gl.expand_dims(h, 0), 2), \
        gl.expand_dims(gl.expand_dims(ll, 0), 1)


__all__ = ["code_layout", "code_stage_layout", "code_smem_layout", "index3"]
