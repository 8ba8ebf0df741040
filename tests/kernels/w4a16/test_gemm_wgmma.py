"""The sm_90 W4A16 GEMM on wgmma (w4a16/gemm_wgmma.py) against its twin, naive.w4a16_dequantize.

CPU: every configuration compiles for sm_90 with wgmma in its PTX, its only shared memory the x buffers (every
register relabelling of the A side is free: no shared-memory conversion, no shuffle) and no spills; none for sm_80 or
sm_70; the launcher's contract, split picking and the table's rows.
GPU (``-m gpu``, sm_90): groups 32/64/128, M and N tails, explicit and picked split K, bias, R 1/2/4, BT 16-64 (the
real 27B K through the table's wgmma rows: test_gemm_mma.py's test_gpu_gemm_mma_real_k_through_the_table).
"""
import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.common.aot import compile_module

from .test_gemm_sm70 import _check
from .test_w4a16 import make_qweight

MODULE = "catengine.kernels.w4a16.gemm_wgmma"


def test_gemm_wgmma_compiles_with_only_the_x_buffers_shared():
    from catengine.kernels.w4a16.gemm_wgmma import AOT_TILES, UNBUILDABLE_UNSPLIT, tile_name
    from catengine.kernels.w4a16.launch import TABLES
    results = compile_module(MODULE, 90)
    left_out = sum((t.R, t.BT, g, t.roll) in UNBUILDABLE_UNSPLIT for t in AOT_TILES for g in (128, 32))
    assert len(results) == 4 * len(AOT_TILES) - left_out and left_out
    for r in results:
        t = next(t for t in AOT_TILES if r["name"].startswith(tile_name(t) + " g"))
        ks = 4 if " g128 " in r["name"] else 1
        # two x buffers of KS steps of BT x 32 fp16: anything more would be a layout conversion through shared memory
        assert r["gluon"] and r["wgmma"] and not r["stack"], r
        assert r["shared"] == 2 * ks * t.BT * 32 * 2, r
        # the programs an SM that tile_split fills must be resident at once: 64 K registers an SM, granted a warp at a
        # time in units of 8 a thread (group 128, the checkpoints' size; smaller groups take fewer registers)
        if " g128 " in r["name"]:
            assert 65536 // (128 * -(-r["registers"] // 8) * 8) >= t.slots, r
    table = {t for _, row in TABLES["sm90"].wgmma + TABLES["sm90"].wgmma_split for t in row}
    assert table <= set(AOT_TILES), table - set(AOT_TILES)


def test_gemm_wgmma_builds_for_sm90_only():
    from catengine.kernels.w4a16.gemm_wgmma import aot_configs
    assert aot_configs(70) == [] and aot_configs(80) == [] and aot_configs(90)


def test_gemm_wgmma_contract():
    from catengine.kernels.w4a16.gemm_wgmma import w4a16_gemm_wgmma
    w = make_qweight(256, 64, 32, torch.float16)
    with pytest.raises(KernelContractError):       # CPU: no Gluon interpreter, no wgmma
        w4a16_gemm_wgmma(torch.zeros(32, 256, dtype=torch.float16), w)


def test_split_fills_one_wave_of_resident_programs():
    from catengine.kernels.common.splitk import MAX_SPLIT_K
    from catengine.kernels.w4a16.gemm_wgmma import WgmmaTile, tile_split
    t = WgmmaTile(1, 32, 4)
    # 27B down at 32 rows: 80 column tiles of 64, 4 programs an SM on 132 SMs -> at most 528 programs: 6 splits
    assert tile_split(32, 5120, 17408, 128, t, 132) == 6
    assert tile_split(32, 14336, 5120, 128, t, 132) == 2          # qkv: 224 tiles, 448 programs
    assert tile_split(32, 34816, 5120, 128, t, 132) == 1          # gate_up: 544 tiles, past the wave already
    assert tile_split(32, 128, 128, 128, t, 132) == 1             # one group: never an empty split
    assert tile_split(32, 128, 1 << 20, 32, t, 132) == MAX_SPLIT_K
    # 48 groups toward 9 splits of 40 tiles (R 2 BT 32, 3 an SM): 9 would leave one empty, so 8 of 6 groups
    assert tile_split(32, 5120, 6144, 128, WgmmaTile(2, 32, 3), 132) == 8


def test_pick_tile_takes_the_first_tile_that_fits_a_wave():
    """The 27B's and 35B-A3B's linears through the sm_90 table rows, as measured best in sessions 19-20 (bench/NOTES.md):
    (R, BT, roll, split)."""
    from catengine.kernels.w4a16.gemm_wgmma import WgmmaTile, pick_tile
    from catengine.kernels.w4a16.launch import TABLES
    rows = dict(TABLES["sm90"].wgmma)
    shapes = {"qkv": (5120, 14336), "o_proj": (6144, 5120), "gate_up": (5120, 34816), "down": (17408, 5120),
              "35B out": (4096, 2048), "35B shared gate_up": (2048, 1024)}

    def picked(m, bound):
        return {name: (t.R, t.BT, t.roll, s) for name, (k, n) in shapes.items()
                for t, s in [pick_tile(rows[bound], m, n, k, 128, 132)]}
    # gate_up's 544 R 1 BT 32 programs pass 4 an SM's wave and fit the rolling loop's 5
    assert picked(32, 32) == {"qkv": (1, 32, -1, 2), "o_proj": (1, 32, -1, 6), "gate_up": (1, 32, 2, 1),
                              "down": (1, 32, -1, 6), "35B out": (1, 32, -1, 16), "35B shared gate_up": (1, 32, -1, 16)}
    # the rolling R 1 BT 64 (4 an SM) splits o_proj and down 6 ways where R 1 BT 64 stopped at 4; gate_up fits only
    # the rolling R 2 BT 64's 3 an SM; the 35B-A3B's small linears would keep under 4 groups a program: R 1 BT 64
    assert picked(64, 64) == {"qkv": (1, 64, 1, 2), "o_proj": (1, 64, 1, 6), "gate_up": (2, 64, 0, 1),
                              "down": (1, 64, 1, 6), "35B out": (1, 64, -1, 11), "35B shared gate_up": (1, 64, -1, 16)}
    assert pick_tile((WgmmaTile(1, 32, 4), WgmmaTile(2, 32, 3)), 32, 20480, 5120, 128, 132)[0] == WgmmaTile(2, 32, 3)


def test_a_tile_that_cannot_build_unsplit_never_launches_unsplit():
    """Triton 3.6's ptxas dies building R 1 BT 32 for group 128 with n_split the constant 1: pick_tile passes over it
    (qkv-like 320 tiles would take it unsplit) and the launcher swaps an explicit one for R 2 BT 32."""
    from catengine.kernels.w4a16.gemm_wgmma import WgmmaTile, buildable, buildable_tile, pick_tile
    r1 = WgmmaTile(1, 32, 4, pdl=True)
    assert not buildable(r1, 128, 1) and buildable(r1, 128, 2) and buildable(r1, 64, 1) and buildable(r1, 32, 1)
    assert buildable_tile(r1, 128, 1) == WgmmaTile(2, 32, 3, pdl=True)
    assert buildable_tile(r1, 128, 2) is r1 and buildable_tile(r1, 64, 1) is r1
    t, split = pick_tile((r1, WgmmaTile(2, 32, 3, pdl=True)), 32, 20480, 5120, 128, 132)
    assert (t.R, split) == (2, 2)
    assert pick_tile((r1, WgmmaTile(2, 32, 3, pdl=True)), 32, 20480, 5120, 64, 132) == (r1, 1)


def test_rows_take_wgmma_past_the_mma_rows(monkeypatch):
    """sm_90 sends fp16 M past the mma rows up to the wgmma rows' last bound to gemm_wgmma (compiled runs only);
    sm_80 and sm_70 have no wgmma rows; bf16 and larger M keep tl.dot."""
    from catengine.kernels.w4a16 import gemm
    w = make_qweight(256, 64, 64, torch.float16)
    x = torch.zeros(256, 256, dtype=torch.float16)
    table = gemm.TABLES["sm90"]
    low, top = table.mma[-1][0] + 1, table.wgmma[-1][0]
    assert gemm.wgmma_tile(table, low, x[:low], w) is None                # the interpreter runs this test
    monkeypatch.setattr(gemm, "INTERPRET", False)
    assert gemm.wgmma_tile(table, low, x[:low], w) is not None
    assert gemm.wgmma_tile(table, top, x[:top], w) is not None
    assert gemm.wgmma_tile(table, low - 1, x[:low - 1], w) is None        # the mma rows keep theirs
    assert gemm.wgmma_tile(table, top + 1, x[:top + 1], w) is None
    assert gemm.wgmma_tile(table, top, x[:top].bfloat16(), w) is None
    assert gemm.wgmma_tile(table, top, x[:top], make_qweight(256, 72, 64, torch.float16)) is None    # N % 16
    assert not gemm.TABLES["sm80"].wgmma and not gemm.TABLES["sm70"].wgmma


def test_mma_rows_take_wgmma_where_its_pick_splits(monkeypatch):
    """sm_90's wgmma_split row: in the mma rows from 8 on, a GEMM whose wgmma pick splits K (long K, few columns) runs
    on wgmma, one it would not split (the 27B gate_up: 272 R 2 BT 16 tiles leave no room for a second split) keeps mma;
    none below 8 rows, on sm_80, in the interpreter or for bf16."""
    from catengine.kernels.w4a16 import gemm
    table = gemm.TABLES["sm90"]
    o_proj, gate_up = make_qweight(6144, 5120, 128, torch.float16), make_qweight(5120, 34816, 128, torch.float16)
    x = {k: torch.zeros(16, k, dtype=torch.float16) for k in (5120, 6144)}
    assert gemm.split_wgmma_tile(table, 8, x[6144][:8], o_proj, 132) is None           # the interpreter runs this test
    monkeypatch.setattr(gemm, "INTERPRET", False)
    tile, split = gemm.split_wgmma_tile(table, 8, x[6144][:8], o_proj, 132)
    assert (tile.R, tile.BT, tile.roll, split) == (2, 16, 1, 12)
    assert gemm.split_wgmma_tile(table, 13, x[6144][:13], o_proj, 132) is not None
    assert gemm.split_wgmma_tile(table, 8, x[5120][:8], gate_up, 132) is None
    assert gemm.split_wgmma_tile(table, 7, x[6144][:7], o_proj, 132) is None
    assert gemm.split_wgmma_tile(table, 8, x[6144][:8].bfloat16(), o_proj, 132) is None
    assert gemm.split_wgmma_tile(gemm.TABLES["sm80"], 8, x[6144][:8], o_proj, 132) is None


# ----------------------------------------------------------------------------- GPU
def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m,k,n,split,tile", [(17, 256, 208, 1, (2, 32)), (32, 512, 336, None, (2, 32)),
                                              (40, 384, 256, 2, (2, 64)), (64, 256, 144, None, (2, 64)),
                                              (9, 512, 528, 4, (1, 16)), (50, 384, 1024, None, (4, 32)),
                                              (130, 256, 384, 3, (1, 64)), (33, 1024, 640, 1, (4, 64)), (24, 768, 256, None, (1, 32)),
                                              (64, 512, 256, 1, (1, 64)), (32, 512, 256, 1, (1, 32, 4)),
                                              # a rolling wait inside the group (roll: wgmma ops left in flight)
                                              (32, 512, 336, None, (1, 32, 5, True, 0, 2)),
                                              (17, 256, 208, 1, (1, 32, 5, True, 0, 2)),
                                              (40, 384, 256, 2, (2, 64, 3, True, 0, 0)),
                                              (64, 256, 400, 1, (2, 64, 3, True, 0, 0)),
                                              (9, 512, 528, 4, (2, 16, 4, True, 0, 1)),
                                              (64, 512, 256, 1, (1, 64, 4, True, 0, 1)),
                                              (50, 1024, 192, 5, (1, 64, 4, True, 4, 1)),
                                              (24, 768, 256, 3, (1, 32, 5, False, 0, 0))],
                         ids=lambda v: str(v))
def test_gpu_gemm_wgmma_matches_twin(group, m, k, n, split, tile):
    """M not a multiple of BT, N not a multiple of 64 R (208, 336, 144, 528), explicit and picked split K, several
    token tiles. A wrong pairing of codes and x, row map or group is an O(1)
    error here."""
    if not _sm90():
        pytest.skip("wgmma needs sm_90")
    from catengine.kernels.w4a16.gemm_wgmma import WgmmaTile, w4a16_gemm_wgmma
    w = make_qweight(k, n, group, torch.float16, device="cuda", seed=group + m)
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, generator=gen, device="cuda").half()
    bias = torch.randn(n, generator=gen, device="cuda").half() if m % 2 else None
    _check(w4a16_gemm_wgmma(x, w, bias, WgmmaTile(*tile), split_k=split), x, w, bias)
