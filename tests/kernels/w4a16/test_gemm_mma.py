"""The sm_80/90 W4A16 GEMM on mma.sync m16n8k16 (w4a16/gemm_mma.py) against its twin, naive.w4a16_dequantize.

CPU: every configuration compiles for sm_80 and sm_90 with m16n8k16 in its PTX, without shared memory (the layouts
were chosen so that no conversion goes through it) or spills; the launcher's contract and table.
GPU (``-m gpu``): groups 32/64/128, M and N tails, explicit and picked split K, bias, the real 27B K.
"""
import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.common.aot import compile_module

from .test_gemm_sm70 import _check
from .test_w4a16 import make_qweight

MODULE = "catengine.kernels.w4a16.gemm_mma"


@pytest.mark.parametrize("cc", [80, 90])
def test_gemm_mma_compiles_without_shared_memory(cc):
    """Every tile (the PDL one on sm_90 only: griddepcontrol) without shared memory or stack."""
    from catengine.kernels.w4a16.gemm_mma import AOT_TILES, aot_tiles
    results = compile_module(MODULE, cc)
    gemms = [r for r in results if r["kernel"] == "w4a16_gemm_mma_kernel"]
    assert len(aot_tiles(cc)) == len(AOT_TILES) - (cc < 90) and len(gemms) == 4 * len(aot_tiles(cc))
    assert any(" pdl " in r["name"] for r in gemms) == (cc >= 90)
    for r in gemms:
        assert r["gluon"] and r["shared"] == 0 and not r["stack"], r
        assert r["mma16816"], r


def test_gemm_mma_has_no_sm70_build():
    from catengine.kernels.w4a16.gemm_mma import aot_configs
    assert aot_configs(70) == [] and aot_configs(80)


def test_gemm_mma_contract():
    from catengine.kernels.w4a16.gemm_mma import mma_applies, w4a16_gemm_mma
    w = make_qweight(256, 64, 32, torch.float16)
    x = torch.zeros(4, 256, dtype=torch.float16)
    assert mma_applies(x, w)
    assert not mma_applies(x.bfloat16(), w)
    assert not mma_applies(torch.zeros(4, 260, dtype=torch.float16)[:, :256], w)   # rows 520 bytes apart
    assert not mma_applies(x, make_qweight(256, 64, 16, torch.float16))
    with pytest.raises(KernelContractError):       # CPU: no Gluon interpreter
        w4a16_gemm_mma(x, w)


def test_pick_split_fills_the_chip():
    from catengine.kernels.common.splitk import MAX_SPLIT_K
    from catengine.kernels.w4a16.gemm_mma import MmaTile, tile_split as pick_split
    t = MmaTile(1, 4, 4)
    # 27B o_proj at M = 8: 20 column tiles of 256 on 132 SMs -> toward 528 programs, 48 groups: 24 splits of 2
    assert pick_split(8, 5120, 6144, 128, t, 132) == 24
    assert pick_split(8, 34816, 5120, 128, t, 132) == 4          # gate_up: 136 tiles, 40 groups -> 4 x 10
    assert pick_split(4096, 5120, 5120, 128, t, 132) == 1
    assert pick_split(8, 256, 128, 128, t, 132) == 1             # one group: never an empty split
    assert pick_split(8, 256, 1 << 20, 32, t, 132) == MAX_SPLIT_K


def test_rows_take_mma_between_gemv_and_bound(monkeypatch):
    """sm_80/90 send fp16 M above the GEMV's rows up to the table's last bound to gemm_mma (compiled runs only);
    bf16, group 16 and larger M keep the tl.dot GEMM."""
    from catengine.kernels.w4a16 import gemm
    w = make_qweight(256, 64, 64, torch.float16)
    x = torch.zeros(64, 256, dtype=torch.float16)
    assert gemm.mma_tile(gemm.TABLES["sm90"], 8, x[:8], w) is None          # the interpreter runs this test
    monkeypatch.setattr(gemm, "INTERPRET", False)
    for key in ("sm80", "sm90"):
        table = gemm.TABLES[key]
        top = table.mma[-1][0]
        assert gemm.mma_tile(table, 8, x[:8], w) is not None
        assert gemm.mma_tile(table, top + 1, torch.zeros(top + 1, 256, dtype=torch.float16), w) is None
        assert gemm.mma_tile(table, 8, x[:8].bfloat16(), w) is None
        assert gemm.mma_tile(table, 8, x[:8], make_qweight(256, 64, 16, torch.float16)) is None
    assert not gemm.TABLES["sm70"].mma


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m,k,n,split,tile", [(3, 256, 200, 1, (1, 4)), (8, 512, 328, None, (1, 4)),
                                              (16, 384, 256, 2, (1, 2)), (17, 256, 136, None, (2, 4)),
                                              (40, 512, 520, 4, (2, 4)), (64, 384, 1024, None, (4, 2))],
                         ids=lambda v: str(v))
def test_gpu_gemm_mma_matches_twin(group, m, k, n, split, tile):
    """M not a multiple of 16, N not a multiple of a tile (200, 328, 136, 520), explicit and picked split K, token
    blocks 1-4, 2 and 4 warps. A wrong pairing of codes and x, row map or group is an O(1) error here."""
    from catengine.kernels.w4a16.gemm_mma import MmaTile, w4a16_gemm_mma
    w = make_qweight(k, n, group, torch.float16, device="cuda", seed=group + m)
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, generator=gen, device="cuda").half()
    bias = torch.randn(n, generator=gen, device="cuda").half() if m % 2 else None
    _check(w4a16_gemm_mma(x, w, bias, MmaTile(*tile), split_k=split), x, w, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [4, 10, 16, 23, 32, 48, 64])
def test_gpu_gemm_mma_real_k_through_the_table(m):
    """The 27B gate_up's K through fused_w4a16_linear (the table's tile and split: mma.sync to 13 rows on sm_90 unless
    the wgmma_split row's pick splits K, as at 10 rows here, to 24 on sm_80, wgmma above on sm_90), asymmetric and
    symmetric."""
    from catengine.kernels.w4a16.gemm import fused_w4a16_linear
    for sym in (False, True):
        w = make_qweight(5120, 768, 128, torch.float16, symmetric=sym, device="cuda", seed=5 + m)
        x = torch.randn(m, 5120, generator=torch.Generator(device="cuda").manual_seed(m), device="cuda").half()
        _check(fused_w4a16_linear(x, w), x, w, None)
