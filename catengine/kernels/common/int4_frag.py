"""The int4 side of the sm_70 W4A16 kernels (w4a16/gemm_sm70.py, moe/fused_sm70.py): how the packed codes travel
from global memory through shared memory into the B fragment of the HMMA.884 block (common/mma884.py). One int32
of the canonical K-packed layout holds the eight k of one column that a fragment lane needs per k = 8 step, so
the codes' tiles are the B fragment's layout without its k dim: [(step, nb), 2, 4] = [(step, nb), h, l].

Dequantisation is TurboMind's SM70 trick, two values per instruction: ``(q >> 4j) & 0x000f000f | 0x64006400``
(one lop3) is the half2 ``(1024 + q[j], 1024 + q[j + 4])``, and one ``sub.f16x2`` of ``1024 + z`` and one
``mul.f16x2`` by the scale finish both (exact, then rounded once: the twin's ``(q - z) * s``). That pairs
nibble j with nibble j + 4, so a lane's eight fragment slots hold k in the order 0 4 1 5 2 6 3 7 (slot 2p + h
is k p + 4h). The sum over k does not care about the order as long as A uses the same one: ``permute_k``
reorders each eight-k run of the A staging the same way (four prmt), once per k tile before the shared store.
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


# $0..$3: the 8 fp16 outputs as half2 (slot 2p + h = k p + 4h); $4..$11: the code (int32, the same value
# broadcast over the 8 slots, only $4 is read); $12..$15: 1024 + zero and $16..$19: the scale, as half2
_DEQUANT_ASM = gl.constexpr("""
{
.reg .b32 t1, t2, t3;
shr.b32 t1, $4, 4;
shr.b32 t2, $4, 8;
shr.b32 t3, $4, 12;
lop3.b32 $0, $4, 0x000f000f, 0x64006400, 0xea;
lop3.b32 $1, t1, 0x000f000f, 0x64006400, 0xea;
lop3.b32 $2, t2, 0x000f000f, 0x64006400, 0xea;
lop3.b32 $3, t3, 0x000f000f, 0x64006400, 0xea;
sub.rn.f16x2 $0, $0, $12;
sub.rn.f16x2 $1, $1, $13;
sub.rn.f16x2 $2, $2, $14;
sub.rn.f16x2 $3, $3, $15;
mul.rn.f16x2 $0, $0, $16;
mul.rn.f16x2 $1, $1, $17;
mul.rn.f16x2 $2, $2, $18;
mul.rn.f16x2 $3, $3, $19;
}
""")
_DEQUANT_CONSTRAINTS = gl.constexpr(",".join(["=r"] * 4 + ["r"] * 8 + ["r"] * 8))
# $0..$3 out, $4..$7 in (k0k1, k2k3, k4k5, k6k7) -> (k0k4, k1k5, k2k6, k3k7); also w4a16/gemm_mma.py's x pairing
PAIR_K_ASM = gl.constexpr("""
prmt.b32 $0, $4, $6, 0x5410;
prmt.b32 $1, $4, $6, 0x7632;
prmt.b32 $2, $5, $7, 0x5410;
prmt.b32 $3, $5, $7, 0x7632;
""")
PAIR_K_CONSTRAINTS = gl.constexpr(",".join(["=r"] * 4 + ["r"] * 4))


@gluon.jit
def dequant_frag(q, zb, s):
    """[..., 8] fp16 B fragment slots from q (int32 codes), zb (fp16 1024 + zero) and s (fp16 scales), all three
    broadcast along the last dim (8 slots of one lane, one code): slot 2p + h is ``(q[k] - z) * s`` at k = p + 4h."""
    return gl.inline_asm_elementwise(_DEQUANT_ASM, _DEQUANT_CONSTRAINTS, [q, zb, s], dtype=gl.float16,
                                     is_pure=True, pack=8)


@gluon.jit
def permute_k(a):
    """[..., 8] fp16 with 8 consecutive k per lane along the last dim -> the same 8 in dequant_frag's slot order."""
    return gl.inline_asm_elementwise(PAIR_K_ASM, PAIR_K_CONSTRAINTS, [a], dtype=gl.float16, is_pure=True,
                                     pack=8)


@gluon.jit
def index3(ROWS: gl.constexpr, L: gl.constexpr):
    """(d, h, l) index tensors of a [ROWS, 2, 4] tile in layout L."""
    d = gl.arange(0, ROWS, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))
    h = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))
    ll = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    return gl.expand_dims(gl.expand_dims(d, 1), 2), gl.expand_dims(gl.expand_dims(h, 0), 2), \
        gl.expand_dims(gl.expand_dims(ll, 0), 1)


__all__ = ["PAIR_K_ASM", "PAIR_K_CONSTRAINTS", "code_layout", "code_stage_layout", "code_smem_layout", "dequant_frag",
           "index3", "permute_k"]
