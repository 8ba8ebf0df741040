"""The HMMA.884 building block (common/mma884.py) and its proof kernel, the fp16 GEMM of common/gemm884.py.

CPU: every configuration compiles ahead of time for sm_70 with ``mma.sync.aligned.m8n8k4`` in its PTX, within the
V100's 96 KB of shared memory and without sm_80+ instructions, and for sm_90. GPU (``-m gpu``; the H200 emulates
m8n8k4, so the shapes are few and small): the Gluon GEMM against its twin ``a.float() @ b.float()``.
"""
import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.common.aot import SM70_FORBIDDEN_PTX, SM70_SHARED_LIMIT, compile_module
from catengine.kernels.common.mma884 import tile_check

MODULE = "catengine.kernels.common.gemm884"


@pytest.mark.parametrize("cc", [70, 90])
def test_gemm884_compiles_to_mma884(cc):
    """Every configuration is a Gluon build whose PTX issues m8n8k4. Triton 3.9's cuobjdump/nvdisasm refuse sm_70
    cubins ("SM70 is deprecated"), so the PTX is the evidence of HMMA.884 here (SM70.md)."""
    from catengine.kernels.common.gemm884 import SM70_AOT
    results = compile_module(MODULE, cc)
    assert len(results) == len(SM70_AOT)
    for r in results:
        assert r["gluon"], r
        assert r["mma884"], f"{r}: no mma.sync.aligned.m8n8k4 in the PTX"
        if cc == 70:
            assert r["shared"] <= SM70_SHARED_LIMIT, r
            assert r["forbidden"] == [], f"{r} emits {SM70_FORBIDDEN_PTX} instructions sm_70 lacks"
            # None where no disassembler takes sm_70 cubins (Triton 3.9), else the SASS must hold HMMA.884
            assert r["sass_hmma884"] in (None, True), r


def test_aot_flags_plain_triton_kernels_as_no_mma884():
    """The flag is not always True: a tl.dot kernel built for sm_70 is a Triton (not Gluon) build and issues FMA."""
    results = compile_module("tests.kernels.common.aot_dot_probe", 70)
    assert results and all(not r["gluon"] and not r["mma884"] for r in results), results


@pytest.mark.parametrize("tile", [(64, 64, 32, 2, 2), (128, 128, 32, 2, 2), (16, 16, 8, 1, 1), (128, 256, 64, 2, 4)])
def test_tile_check_accepts_whole_quad_pair_squares(tile):
    tile_check(*tile)


@pytest.mark.parametrize("tile", [(48, 64, 32, 1, 1), (16, 64, 32, 2, 1), (64, 64, 12, 1, 1), (64, 16, 32, 2, 2)])
def test_tile_check_rejects_partial_tiles(tile):
    with pytest.raises(ValueError):
        tile_check(*tile)


def test_gemm884_contract_errors():
    from catengine.kernels.common.gemm884 import gemm884
    a = torch.zeros(4, 8, dtype=torch.float16)
    with pytest.raises(KernelContractError):
        gemm884(a, torch.zeros(8, 4, dtype=torch.float32))
    with pytest.raises(KernelContractError):
        gemm884(a, torch.zeros(9, 4, dtype=torch.float16))
    with pytest.raises(KernelContractError):   # CPU tensors: Gluon has no interpreter
        gemm884(a, torch.zeros(8, 4, dtype=torch.float16))


# ----------------------------------------------------------------------------- GPU
def _check(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """fp16 x fp16 products are exact in fp32 and the accumulation is fp32 (error ~ sqrt(K) 2^-24 |a||b|, far below
    the rest), so what separates the kernel from its twin is the rounding of the output to fp16: at most 2^-11 of
    each element, about 2^-12 of the output norm on average. Bounds: every element within 2^-10 of max|ref| (twice
    the largest rounding) and the error norm within 1e-3 of the output norm (4x the expected 2.4e-4). A wrong
    fragment map or a lost k step gives errors of the order of the output itself."""
    want = a.float() @ b.float()
    err = got.float() - want
    assert torch.isfinite(got).all()
    assert err.abs().max() <= 2.0 ** -10 * want.abs().max(), (err.abs().max(), want.abs().max())
    assert err.norm() <= 1e-3 * want.norm(), (err.norm() / want.norm())


@pytest.mark.gpu
@pytest.mark.parametrize("cfg_index", [0, 1, 2])
@pytest.mark.parametrize("mnk", [(64, 64, 32), (128, 256, 64), (1, 8, 8), (100, 72, 40), (257, 300, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_gemm884_matches_twin(cfg_index, mnk):
    """Whole tiles, and M, N, K tails (not multiples of any tile, K not of the k = 32 step nor of 8)."""
    from catengine.kernels.common.gemm884 import SM70_AOT, gemm884
    M, N, K = mnk
    gen = torch.Generator(device="cuda").manual_seed(M * 7 + N * 3 + K)
    a = torch.randn(M, K, generator=gen, device="cuda").half()
    b = torch.randn(K, N, generator=gen, device="cuda").half()
    got = gemm884(a, b, SM70_AOT[cfg_index])
    assert got.shape == (M, N) and got.dtype == torch.float16
    _check(got, a, b)


@pytest.mark.gpu
def test_gpu_gemm884_strided_operands():
    """Strides are run-time arguments: a transposed B (column-major) and a row-sliced A give the same product."""
    from catengine.kernels.common.gemm884 import gemm884
    gen = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(90, 200, generator=gen, device="cuda").half()[:, 8:144]
    b = torch.randn(80, 136, generator=gen, device="cuda").half().t()
    _check(gemm884(a, b), a, b)


@pytest.mark.gpu
def test_gpu_gemm884_default_table_real_shape():
    """A prefill-sized slice of a real projection (27B: K 5120), on the table's own pick."""
    from catengine.kernels.common.gemm884 import gemm884
    gen = torch.Generator(device="cuda").manual_seed(6)
    a = torch.randn(200, 5120, generator=gen, device="cuda").half()
    b = (torch.randn(5120, 384, generator=gen, device="cuda") * 0.02).half()
    _check(gemm884(a, b), a, b)


# ----------------------------------------------------------------------------- fragment maps, emulated
def _triton_bases(layout, shape):
    """(reg, lane, warp) bases of Triton's own linear layout of a Gluon layout; None on Triton < 3.6, whose
    GluonOpBuilder has no ``to_linear_layout``."""
    from triton._C.libtriton import gluon_ir, ir
    ctx = ir.context()
    ir.load_dialects(ctx)
    builder = gluon_ir.GluonOpBuilder(ctx)
    if not hasattr(builder, "to_linear_layout"):
        return None
    ll = builder.to_linear_layout(layout._to_ir(builder), shape)
    return [list(map(list, b)) for b in (ll.reg_bases, ll.lane_bases, ll.warp_bases)]


def _blocked_bases(layout, shape):
    """The same bases from the BlockedLayout's definition: along ``order`` (fastest dim first) the registers of
    size_per_thread, then the lanes, then the warps; a shape beyond the CTA tile repeats it in more registers, a
    shape below it broadcasts (those bases are 0)."""
    spt, tpw, wpc, order = layout.size_per_thread, layout.threads_per_warp, layout.warps_per_cta, layout.order

    def bases(counts, stride):
        out = []
        for d in order:
            n = 1
            while n < counts[d]:
                off = stride[d] * n
                out.append([off if e == d and off < shape[d] else 0 for e in range(len(shape))])
                n *= 2
        return out
    one = [1] * len(shape)
    lane_stride = list(spt)
    warp_stride = [spt[d] * tpw[d] for d in range(len(shape))]
    tile = [warp_stride[d] * wpc[d] for d in range(len(shape))]
    repeat = [max(1, shape[d] // tile[d]) for d in range(len(shape))]
    return [bases(spt, one) + bases(repeat, tile), bases(tpw, lane_stride), bases(wpc, warp_stride)]


@pytest.mark.parametrize("tile", [(16, 16, 1, 1), (64, 64, 2, 2), (128, 256, 2, 4)])
def test_blocked_bases_match_triton(tile):
    """The fallback of _lane_coords (Triton 3.5) is Triton's own layout where Triton can say (>= 3.6)."""
    from catengine.kernels.common.mma884 import frag_layout
    BM, BN, WM, WN = tile
    shape = [BM // 8, BN // 8, 2, 4, 8]
    own = _triton_bases(frag_layout(WM, WN), shape)
    if own is None:
        pytest.skip("this Triton has no to_linear_layout to compare with")
    assert own == _blocked_bases(frag_layout(WM, WN), shape)


def _lane_coords(BM, BN, WM, WN):
    """Triton's own linear layout of ``frag_layout`` (the BlockedLayout definition on Triton 3.5): coordinate
    [mb, nb, h, l, i] of every (warp, lane, register)."""
    from catengine.kernels.common.mma884 import frag_layout
    shape = [BM // 8, BN // 8, 2, 4, 8]
    reg_bases, lane_bases, warp_bases = (_triton_bases(frag_layout(WM, WN), shape)
                                         or _blocked_bases(frag_layout(WM, WN), shape))

    def coord(bases, idx):
        c = [0] * 5
        for bit, base in enumerate(bases):
            if idx >> bit & 1:
                c = [x ^ y for x, y in zip(c, base)]
        return c
    n_reg = 1 << len(reg_bases)
    return [[[[x ^ y ^ z for x, y, z in zip(coord(warp_bases, w), coord(lane_bases, t), coord(reg_bases, r))]
              for r in range(n_reg)] for t in range(32)] for w in range(WM * WN)]


@pytest.mark.parametrize("tile", [(16, 16, 1, 1), (64, 64, 2, 2), (128, 256, 2, 4)])
def test_fragment_maps_multiply_under_the_ptx_m8n8k4_semantics(tile):
    """What the kernels feed the asm, run through the PTX ISA's m8n8k4 definition (quad-pair q: lanes 4q..4q+3 and
    4q+16..4q+19; A row = B col = lane % 4 + 4 (lane >= 16); C row = (lane & 1) + (i & 2) + 4 (lane >= 16), C col =
    (i & 4) + (lane & 2) + (i & 1)), on the lane/register assignment Triton derives from ``frag_layout``, with the
    A/B/C maps of the module docstring (``acc_rows_cols``): one k = 8 step must give A @ B exactly (small integers)."""
    BM, BN, WM, WN = tile
    coords = _lane_coords(BM, BN, WM, WN)
    gen = torch.Generator().manual_seed(0)
    A = torch.randint(-3, 4, (BM, 8), generator=gen).double()
    B = torch.randint(-3, 4, (8, BN), generator=gen).double()
    C = torch.zeros(BM, BN, dtype=torch.float64)

    def c_pos(mb, nb, h, ll, i):
        return 8 * mb + (ll & 1) + (i & 2) + 4 * h, 8 * nb + (i & 4) + (ll & 2) + (i & 1)
    hit = torch.zeros(BM, BN, dtype=torch.int64)
    for w in range(WM * WN):
        for chunk in range(len(coords[w][0]) // 8):       # one inline-asm call (pack = 8) per 8 registers
            for q in range(4):
                lanes = [4 * q + j for j in range(4)] + [4 * q + 16 + j for j in range(4)]
                a_blk = torch.zeros(8, 8, dtype=torch.float64)
                b_blk = torch.zeros(8, 8, dtype=torch.float64)
                for t in lanes:
                    r_ptx = t % 4 + 4 * (t >= 16)
                    for kk in range(8):                    # the lane's register kk holds k = kk (both mma)
                        mb, nb, h, ll, k = coords[w][t][8 * chunk + kk]
                        assert k == kk
                        a_blk[r_ptx, kk] = A[8 * mb + ll + 4 * h, k]
                        b_blk[kk, r_ptx] = B[k, 8 * nb + ll + 4 * h]
                d_blk = a_blk @ b_blk
                for t in lanes:
                    for i in range(8):
                        row = (t & 1) + (i & 2) + 4 * (t >= 16)
                        col = (i & 4) + (t & 2) + (i & 1)
                        r, c = c_pos(*coords[w][t][8 * chunk + i])
                        C[r, c] = d_blk[row, col]
                        hit[r, c] += 1
    assert (hit == 1).all(), "every output element belongs to exactly one lane register"
    assert torch.equal(C, A @ B)
