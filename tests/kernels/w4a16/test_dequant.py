"""The dequantise kernel behind large-M W4A16 linears is bit-identical to its twin; the op picks it
from the arch table's row threshold and then matches the reference linear."""
from __future__ import annotations

import pytest
import torch

from catengine.kernels.w4a16 import dequant as w4a16_dequant
from catengine.kernels.w4a16 import naive as reference
from catengine.kernels.w4a16.packing import QuantizedWeight, pack_int4_along_k

DEVICE = "cpu"   # the Triton interpreter runs on CPU tensors (tests/conftest.py); the gpu tests use "cuda"


def _weight(k, n, group, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=g)
    s = (torch.rand(k // group, n, generator=g) + 0.5) * 0.01
    z = torch.randint(0, 16, (k // group, n), generator=g).float()
    return QuantizedWeight(pack_int4_along_k(q).to(device), s.to(device, dtype), z.to(device, dtype), group)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("k,n", [(128, 200), (256, 8), (384, 129)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_dequantize_is_bit_identical(group, k, n, dtype):
    w = _weight(k, n, group, dtype, DEVICE)
    got = w4a16_dequant.dequantize(w)
    want = reference.w4a16_dequantize(w)
    assert got.dtype == dtype and got.shape == (k, n)
    assert torch.equal(got, want)


def test_linear_switches_path_at_the_threshold(monkeypatch):
    w = _weight(256, 96, 64, torch.float16, DEVICE, seed=1)
    bias = torch.randn(96, dtype=torch.float16).to(DEVICE)
    calls = []
    real = w4a16_dequant.dequantize
    monkeypatch.setattr(w4a16_dequant, "dequantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(w4a16_dequant, "DEQUANT_MIN_M", {k: 8 for k in w4a16_dequant.DEQUANT_MIN_M})
    for m, dequant in ((3, False), (8, True), (21, True)):
        x = torch.randn(m, 256, dtype=torch.float16).to(DEVICE)
        calls.clear()
        got = w4a16_dequant.w4a16_linear(x, w, bias)
        want = reference.w4a16_linear(x, w, bias)
        assert bool(calls) == dequant
        assert got.shape == (m, 96) and got.dtype == torch.float16
        # fp16 output of an fp32-accumulated dot: the two paths round the same sums differently
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("k,n", [(5120, 34816), (17408, 5120), (6144, 5120)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_real_shapes_on_gpu(k, n, dtype):
    w = _weight(k, n, 128, dtype, "cuda", seed=2)
    assert torch.equal(w4a16_dequant.dequantize(w), reference.w4a16_dequantize(w))
    x = torch.randn(2048, k, dtype=dtype, device="cuda")
    got = w4a16_dequant.w4a16_linear(x, w)
    want = reference.w4a16_linear(x, w)
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3)
