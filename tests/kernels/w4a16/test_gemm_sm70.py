"""The sm_70 W4A16 GEMM on HMMA.884 (w4a16/gemm_sm70.py) against its twin, naive.w4a16_linear.

CPU: every configuration compiles for sm_70 with m8n8k4 in its PTX (and for sm_90); the launcher's contract.
GPU (``-m gpu``; the H200 emulates m8n8k4, so few and small shapes): all group sizes, M and N tails, split K.
"""
import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.common.aot import SM70_SHARED_LIMIT, compile_module
from catengine.kernels.w4a16 import naive as reference

from .test_w4a16 import make_qweight

MODULE = "catengine.kernels.w4a16.gemm_sm70"


@pytest.mark.parametrize("cc", [70, 90])
def test_gemm_sm70_compiles_to_mma884(cc):
    from catengine.kernels.w4a16.gemm_sm70 import SM70_TABLE
    results = compile_module(MODULE, cc)
    gemms = [r for r in results if r["kernel"] == "w4a16_gemm_sm70_kernel"]
    assert len(gemms) == 4 * len(SM70_TABLE) and len(results) == len(gemms) + 1
    for r in gemms:
        assert r["gluon"] and r["mma884"], r
    for r in results:
        if cc == 70:
            assert r["shared"] <= SM70_SHARED_LIMIT and not r["forbidden"], r
            assert r["sass_hmma884"] in (None, r["mma884"]), r


def test_gemm_sm70_contract():
    from catengine.kernels.w4a16.gemm_sm70 import w4a16_gemm_sm70
    w = make_qweight(128, 64, 32, torch.float16)
    with pytest.raises(KernelContractError):       # bf16 does not exist on sm_70
        w4a16_gemm_sm70(torch.zeros(4, 128, dtype=torch.bfloat16), w)
    with pytest.raises(KernelContractError):       # CPU: no Gluon interpreter
        w4a16_gemm_sm70(torch.zeros(4, 128, dtype=torch.float16), w)


def test_pick_split_k_fills_one_wave():
    from catengine.kernels.common.mma884 import Tile884
    from catengine.kernels.w4a16.gemm_sm70 import MAX_SPLIT_K, pick_split_k
    c = Tile884(64, 128, 32, 2, 2)
    assert pick_split_k(8, 1024, 5120, c, 80) == MAX_SPLIT_K      # 8 tiles on 80 SMs
    assert pick_split_k(4096, 5120, 5120, c, 80) == 1              # thousands of tiles
    assert pick_split_k(8, 128, 64, c, 80) == 2                    # never more splits than k tiles
    # 27B gate_up at decode: 136 tiles of 16 x 128 -> 3 splits (408 programs, ~4 per SM of 80), none empty
    d = Tile884(16, 128, 32, 1, 4)
    assert pick_split_k(8, 17408, 5120, d, 80) == 3
    assert pick_split_k(8, 5120, 96, d, 80) == 3                     # 3 k tiles: one each, not 8 with 5 empty
    # k tiles of 64 hold twice the bytes in flight: half the programs per SM (2 splits, 272 programs: one round)
    assert pick_split_k(32, 17408, 5120, Tile884(32, 128, 64, 1, 4), 80) == 2
    assert pick_split_k(8, 1024, 5120, Tile884(16, 128, 64, 1, 4), 80) == MAX_SPLIT_K


def test_sm70_tile_cuts_bk_to_the_group():
    """The decode rows' k tiles of 64 need groups >= 64 (one scale row per k tile): a group of 32 takes BK 32 on the
    same tile; prefill rows are BK 32 whatever the group."""
    from catengine.kernels.w4a16.gemm_sm70 import SM70_TABLE, sm70_tile
    assert [c.BK for _, c in SM70_TABLE] == [64, 64, 32, 32]
    for m in (8, 16, 32):
        assert sm70_tile(m, 128).BK == 64 and sm70_tile(m, 64).BK == 64 and sm70_tile(m, 32).BK == 32
        assert sm70_tile(m, 32).BM == sm70_tile(m, 128).BM == (16 if m <= 16 else 32)
    assert sm70_tile(64, 128).BK == sm70_tile(200, 32).BK == 32


# ----------------------------------------------------------------------------- GPU
def _check(y, x, w, bias):
    """The dequantised weight is the twin's (``w4a16_dequantize``) bit for bit ((1024 + q) - (1024 + z) is exact in
    fp16, times s rounds once, as (q - z) * s in fp32 rounded to fp16 does), the products are exact in fp32 and the
    sums fp32. What is
    left is the fp16 rounding of the output (<= 2^-11 per element, ~2^-12 of the norm) and, with split K, one
    more fp32 rounding per partial: every element within 2^-10 of max|ref| and the error norm within 1e-3 of the
    output norm (4x the expected 2.4e-4). A wrong fragment map, nibble or group gives O(1) errors."""
    # the twin's own dequantisation in the weight's dtype (rounded once), products and sums in fp32, no output rounding
    want = x.float() @ reference.w4a16_dequantize(w).float()
    if bias is not None:
        want = want + bias.float()
    err = y.float() - want
    assert torch.isfinite(y).all() and y.dtype == torch.float16
    assert err.abs().max() <= 2.0 ** -10 * want.abs().max(), (err.abs().max(), want.abs().max())
    assert err.norm() <= 1e-3 * want.norm(), err.norm() / want.norm()


@pytest.mark.gpu
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m,k,n,split", [(3, 256, 200, None), (5, 512, 328, 2), (8, 256, 200, 1),
                                         (13, 512, 328, None), (24, 384, 256, 2), (50, 256, 136, None),
                                         (77, 512, 384, 4), (130, 384, 136, None)],
                         ids=lambda v: str(v))
def test_gpu_gemm_sm70_matches_twin(group, m, k, n, split):
    """Every tile of the table (M 3, 5, 8 and 13: 16 x 128, 24: 32 x 128, both BK 64 at groups 64 / 128 and 32 at 32; 50:
    64 x 128, 77 and 130: 128 x 128), M and N not multiples of any tile (N 200 = 1.56 tiles of 128), explicit and
    picked split K. The lop3 dequantisation
    reorders k in the B slots and permute_k the x staging: a mismatch between the two is an O(1) error here."""
    from catengine.kernels.w4a16.gemm_sm70 import w4a16_gemm_sm70
    w = make_qweight(k, n, group, torch.float16, device="cuda", seed=group + m)
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, generator=gen, device="cuda").half()
    bias = torch.randn(n, generator=gen, device="cuda").half() if m != 8 else None
    _check(w4a16_gemm_sm70(x, w, bias, split_k=split), x, w, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [8, 32])
def test_gpu_gemm_sm70_decode_real_shape(m):
    """The 27B gate_up's K at decode M on the decode tiles (BK 64) with the picked split, asymmetric zeros."""
    from catengine.kernels.w4a16.gemm_sm70 import w4a16_gemm_sm70
    w = make_qweight(5120, 1024, 128, torch.float16, device="cuda", seed=5 + m)
    x = torch.randn(m, 5120, generator=torch.Generator(device="cuda").manual_seed(m), device="cuda").half()
    _check(w4a16_gemm_sm70(x, w), x, w, None)


@pytest.mark.gpu
def test_gpu_gemm_sm70_symmetric_real_k():
    """A real K (27B: 5120) with symmetric zeros (8) on the table's own tile and split."""
    from catengine.kernels.w4a16.gemm_sm70 import w4a16_gemm_sm70
    w = make_qweight(5120, 256, 128, torch.float16, symmetric=True, device="cuda", seed=3)
    x = torch.randn(96, 5120, generator=torch.Generator(device="cuda").manual_seed(4), device="cuda").half()
    _check(w4a16_gemm_sm70(x, w), x, w, None)


def test_sm70_row_picks_hmma_from_m2(monkeypatch):
    """The sm_70 row sends fp16 GEMMs with M >= 2 (M = 1 is the GEMV's) and groups 32/64/128 to the HMMA.884
    kernel, compiled runs only: the interpreter (CI) keeps the tl.dot twin, and sm_80/90 never take it."""
    from catengine.kernels.w4a16 import gemm
    w = make_qweight(256, 64, 64, torch.float16)
    x = torch.zeros(8, 256, dtype=torch.float16)
    assert not gemm.hmma_applies(gemm.TABLES["sm70"], 8, x, w)          # the interpreter runs this test
    monkeypatch.setattr(gemm, "INTERPRET", False)
    assert gemm.hmma_applies(gemm.TABLES["sm70"], 8, x, w)
    assert gemm.hmma_applies(gemm.TABLES["sm70"], 2, x[:2], w)
    assert not gemm.hmma_applies(gemm.TABLES["sm70"], 1, x[:1], w)
    assert not gemm.hmma_applies(gemm.TABLES["sm70"], 8, x.bfloat16(), w)
    for key in ("sm80", "sm90"):
        assert not gemm.hmma_applies(gemm.TABLES[key], 64, x, w)
    w16 = make_qweight(256, 64, 16, torch.float16)
    assert not gemm.hmma_applies(gemm.TABLES["sm70"], 8, x, w16)


@pytest.mark.gpu
def test_gpu_sm70_row_runs_hmma(monkeypatch):
    """fused_w4a16_linear on the sm_70 row (as a V100 would pick it) reaches the HMMA kernel and matches the twin."""
    from catengine.kernels.w4a16 import gemm
    calls = []
    real = gemm.w4a16_gemm_sm70
    monkeypatch.setattr(gemm, "w4a16_gemm_sm70", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(gemm, "device_key", lambda device: ("sm70", 80))
    w = make_qweight(1024, 320, 128, torch.float16, device="cuda", seed=9)
    x = torch.randn(2, 12, 1024, generator=torch.Generator(device="cuda").manual_seed(9), device="cuda").half()
    bias = torch.randn(320, generator=torch.Generator(device="cuda").manual_seed(10), device="cuda").half()
    y = gemm.fused_w4a16_linear(x, w, bias)
    assert calls and y.shape == (2, 12, 320)
    _check(y.reshape(24, 320), x.reshape(24, 1024), w, bias)
