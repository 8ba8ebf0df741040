"""W8A16 lm_head kernel against its twin (interpreter on CPU, compiled with -m gpu), and the quantiser.

Kernel vs twin: both multiply exact int8 values (exact in fp16/bf16) by the same rounded activations and
accumulate in fp32, then apply the same per-channel scale; only the summation order differs, so the
relative error is fp32 roundoff times sqrt(K)-ish growth: 1e-5 at these K (<= 5,120 on the GPU)."""
import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.w8a16 import gemv
from catengine.kernels.w8a16.naive import INT8_MAX, quantize_per_channel, w8a16_linear

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _rel(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    assert torch.isfinite(got).all()
    return ((got - want).norm() / want.norm()).item()


def _case(m, n, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    w[3] = 0.0                      # an all-zero row: scale clamped, values 0
    q, s = quantize_per_channel(w, dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    return x, q, s, w


def test_quantizer_is_symmetric_per_channel_and_within_half_a_step():
    x, q, s, w = _case(1, 40, 96, torch.float16)
    assert q.dtype == torch.int8 and s.dtype == torch.float16 and s.shape == (40,)
    assert q.abs().max() <= INT8_MAX and (q[3] == 0).all()
    assert (q.abs().amax(1)[torch.arange(40) != 3] >= INT8_MAX - 1).all()   # each row uses its full range
    err = (q.float() * s.float()[:, None] - w).abs()
    assert (err <= 0.5 * s.float()[:, None] * (1 + 1e-3)).all()            # rounding to the nearest step


@pytest.mark.parametrize("m", [1, 2, 3, 16, 17, 40, 70])
@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if DEV == "cuda" else []))
def test_kernel_matches_twin(m, dtype):
    # N, K not multiples of the blocks (masks); M from one row (the dot pads to 16) through each config to
    # several M blocks
    n, k = 300, 200
    x, q, s, _ = _case(m, n, k, dtype, seed=m)
    want = w8a16_linear(x, q, s)
    got = gemv.w8a16_linear(x.to(DEV), q.to(DEV), s.to(DEV))
    assert got.dtype == torch.float32 and got.shape == (m, n)
    assert _rel(got, want) < 1e-5


def test_kernel_takes_a_row_slice_and_empty_input():
    x, q, s, _ = _case(6, 130, 64, torch.float16, seed=4)
    wide = torch.zeros(6, 96, dtype=torch.float16)
    wide[:, :64] = x
    got = gemv.w8a16_linear(wide[:, :64].to(DEV), q.to(DEV), s.to(DEV))
    assert _rel(got, w8a16_linear(x, q, s)) < 1e-5
    assert gemv.w8a16_linear(x[:0].to(DEV), q.to(DEV), s.to(DEV)).shape == (0, 130)


def test_kernel_refuses_bad_inputs():
    x, q, s, _ = _case(2, 32, 64, torch.float16)
    with pytest.raises(KernelContractError, match="int8"):
        gemv.w8a16_linear(x, q.to(torch.int16), s)
    with pytest.raises(KernelContractError, match="fp16/bf16"):
        gemv.w8a16_linear(x.float(), q, s)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32, 256])
@pytest.mark.parametrize("n,k", [(248320, 5120), (248320, 2048)])
def test_gpu_lm_head_shapes(m, n, k):
    x, q, s, _ = _case(m, n, k, torch.float16, seed=m)
    x, q, s = x.cuda(), q.cuda(), s.cuda()
    assert _rel(gemv.w8a16_linear(x, q, s), w8a16_linear(x, q, s)) < 1e-5
