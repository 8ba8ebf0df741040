"""The MoE block's last step, routed sum + sigmoid(gate logit) * shared expert (moe/shared.py), against its twin
naive.shared_expert_add. CPU: the interpreter; GPU (-m gpu): compiled. Both compute r + g * s in fp32 from the same
inputs; the kernel may fuse the multiply-add (one rounding instead of two), hence 1e-6 relative, not equality, and
1e-3 absolute where r and g * s (each up to ~4e3 here, an fp32 ulp ~2.4e-4) cancel to near zero."""
import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.moe import naive as reference
from catengine.kernels.moe import shared


def _check(t, h, dtype, device):
    g = torch.Generator(device).manual_seed(t * 31 + h)
    routed = torch.randn(t, h, generator=g, device=device) * 100
    # the gate logit is a column of the merged router GEMM's output: a strided [T, 1] view
    logits = (torch.randn(t, 9, generator=g, device=device) * 4).to(dtype)
    sh = (torch.randn(t, h, generator=g, device=device) * 1000).to(dtype)
    out = shared.shared_expert_add(routed, logits[:, 8:], sh)
    ref = reference.shared_expert_add(routed, logits[:, 8:], sh)
    assert out.dtype == torch.float32 and out.shape == (t, h)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-3)
    # a wrong gate row or column offset is an O(1) error
    assert not torch.allclose(out, routed + torch.sigmoid(logits[:, :1].float()) * sh.float(), rtol=1e-3)


@pytest.mark.parametrize("t,h", [(1, 64), (3, 1100), (5, 2048)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_shared_add_matches_twin(t, h, dtype):
    _check(t, h, dtype, "cpu")


def test_shared_add_empty_and_contract():
    out = shared.shared_expert_add(torch.zeros(0, 8), torch.zeros(0, 1, dtype=torch.float16),
                                   torch.zeros(0, 8, dtype=torch.float16))
    assert out.shape == (0, 8)
    with pytest.raises(KernelContractError):
        shared.shared_expert_add(torch.zeros(2, 8, dtype=torch.float16), torch.zeros(2, 1), torch.zeros(2, 8))
    with pytest.raises(KernelContractError):
        shared.shared_expert_add(torch.zeros(2, 8), torch.zeros(2, 2), torch.zeros(2, 8))


@pytest.mark.gpu
@pytest.mark.parametrize("t,h", [(1, 2048), (32, 2048), (7, 3000)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_shared_add_matches_twin(t, h, dtype):
    _check(t, h, dtype, "cuda")
