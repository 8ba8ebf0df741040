"""The sm_80/90 sorted MoE on mma.sync m16n8k16 (moe/fused_mma.py) against its twin, moe.naive.fused_moe.

CPU: the launcher's contract and which path fused_moe takes (its AOT builds are in tests/kernels/test_aot.py).
GPU (``-m gpu``): Qwen3.6-35B-A3B's MoE (E 256, top-8, H 2048, I 512) at 5-128 tokens, AWQ and compressed-tensors
experts, tails (H and I not multiples of the column tiles, few experts, top-3), token blocks of 16 and 32, the fp16
sum past 65,504, expert parallelism, and the whole fused_moe on the device's row.
Tolerance: test_fused_moe_sm70's (the same numerics: weights dequantised as the twin's, exact products, fp32 sums,
silu(gate) * up rounded to fp16 once, fp32 weighted rows and sum).
"""
import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.moe import fused as moe
from catengine.kernels.moe import fused_mma
from catengine.kernels.moe import naive as reference
from catengine.kernels.w4a16.gemm_mma import MmaTile

from .test_fused_moe import TOL, make_dense, make_experts, rel_err, routing
from .test_fused_moe_sm70 import gpu_check


def _moe(e=6, hid=64, inter=64, group=32, t=20, k=2):
    w13 = make_experts(e, hid, 2 * inter, group, torch.float16)
    w2 = make_experts(e, inter, hid, group, torch.float16, seed=1)
    x = torch.randn(t, hid, generator=torch.Generator().manual_seed(2)).half()
    tw, ids = routing(t, e, k, seed=3)
    return x, w13, w2, tw, ids


def test_fused_moe_mma_contract():
    x, w13, w2, tw, ids = _moe()
    assert not fused_mma.mma_moe_applies(x, w13, w2)                     # CPU
    with pytest.raises(KernelContractError, match="CUDA"):
        fused_mma.fused_moe_mma(x, w13, w2, tw, ids, MmaTile())
    with pytest.raises(KernelContractError):                             # dense experts stay on tl.dot
        fused_mma.fused_moe_mma(x, make_dense(6, 128, 64, torch.float16), make_dense(6, 64, 64, torch.float16), tw,
                                ids, MmaTile())


def test_mma_rows_between_decode_and_bound(monkeypatch):
    """sm_80/90 send W4A16 fp16 MoE with row_max < T * top_k <= the mma bound to fused_moe_mma (compiled runs
    only); the sm_70 row never does."""
    calls = []
    monkeypatch.setattr(moe, "INTERPRET", False)
    monkeypatch.setattr(moe, "mma_moe_applies", lambda *a: True)
    monkeypatch.setattr(moe, "fused_moe_mma", lambda *a: calls.append(a[-1]) or reference.fused_moe(*a[:5]))
    monkeypatch.setattr(moe, "moe_decode", lambda *a: calls.append("decode") or reference.fused_moe(*a[:5]))
    e, hid, inter = 6, 128, 128
    w13 = make_experts(e, hid, 2 * inter, 32, torch.float16)
    w2 = make_experts(e, inter, hid, 32, torch.float16, seed=1)
    for key in ("sm80", "sm90"):
        monkeypatch.setattr(moe, "device_key", lambda dev, key=key: (key, 132))
        table = moe.TABLES[key]
        top = table.mma[-1][0]
        for t, want in ((table.row_max // 2, "decode"), (table.row_max // 2 + 1, "mma"), (top // 2, "mma")):
            calls.clear()
            x = torch.randn(t, hid).half()
            tw, ids = routing(t, e, 2, seed=t)
            moe.fused_moe(x, w13, w2, tw, ids)
            assert calls and (calls[0] == "decode") == (want == "decode"), (key, t, calls)
    assert not moe.TABLES["sm70"].mma


# ----------------------------------------------------------------------------- GPU
def _gpu_check(t, e, k, hid, inter, group, symmetric, tile, seed=0, scale_down=1.0, x_scale=1.0):
    return gpu_check(t, e, k, hid, inter, group, symmetric, None, seed, scale_down, x_scale,
                     fn=lambda *a: fused_mma.fused_moe_mma(*a, tile))


@pytest.mark.gpu
@pytest.mark.parametrize("t,group,symmetric,tile", [
    (5, 128, False, (1, 4)),        # 40 rows on 256 experts: most blocks one row
    (32, 32, True, (1, 4)),         # compressed-tensors group 32
    (64, 64, True, (1, 2)),
    (128, 128, False, (2, 4)),      # token blocks of 32
], ids=str)
def test_gpu_35b_a3b_mma(t, group, symmetric, tile):
    _gpu_check(t, 256, 8, 2048, 512, group, symmetric, MmaTile(*tile), seed=t)


@pytest.mark.gpu
@pytest.mark.parametrize("t,e,k,hid,inter,group,tile", [
    (37, 10, 8, 160, 96, 32, (1, 4)),     # H 160, I 96: partial column tiles in both passes
    (130, 37, 4, 192, 128, 64, (2, 2)),   # 37 experts, ~14 rows each, some empty
    (9, 5, 3, 384, 256, 128, (1, 1)),     # top-3, K of 3 groups of 128
], ids=str)
def test_gpu_tails_mma(t, e, k, hid, inter, group, tile):
    _gpu_check(t, e, k, hid, inter, group, False, MmaTile(*tile), seed=e)


@pytest.mark.gpu
def test_gpu_fp16_sum_past_65504_mma():
    ref = _gpu_check(20, 6, 2, 64, 64, 32, False, MmaTile(1, 1), scale_down=120.0, x_scale=30.0)
    assert ref.abs().max() > 65504


@pytest.mark.gpu
@pytest.mark.parametrize("t", [8, 64])
def test_gpu_35b_a3b_mma_expert_parallel(t):
    from .test_fused_moe import expert_parallel_gpu
    expert_parallel_gpu(lambda *a: fused_mma.fused_moe_mma(*a, MmaTile()), t, torch.float16, True)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [2, 16, 100])
def test_gpu_fused_moe_takes_mma(monkeypatch, t):
    """The whole fused_moe on the device's row: the decode kernels at 16 rows, fused_moe_mma above."""
    from catengine.kernels import ops
    calls = []
    real = moe.fused_moe_mma
    monkeypatch.setattr(moe, "fused_moe_mma", lambda *a: calls.append(1) or real(*a))
    w13 = make_experts(256, 2048, 1024, 128, torch.float16, device="cuda", seed=t)
    w2 = make_experts(256, 512, 2048, 128, torch.float16, device="cuda", seed=t + 1)
    x = torch.randn(t, 2048, generator=torch.Generator("cuda").manual_seed(t), device="cuda").half()
    tw, ids = ops.moe_route(torch.randn(t, 256, device="cuda").half(), 8, True)
    y = ops.fused_moe(x, w13, w2, tw, ids)
    key, _ = moe.device_key(x.device)
    assert bool(calls) == (moe.TABLES[key].row_max < t * 8 <= moe.TABLES[key].mma[-1][0])
    assert rel_err(y, reference.fused_moe(x, w13, w2, tw, ids)) < TOL[torch.float16]
