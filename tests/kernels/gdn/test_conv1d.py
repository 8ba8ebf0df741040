"""causal_conv1d / causal_conv1d_update (Triton) against the reference twins: interpreter on tiny shapes,
compiled on the real Qwen3.5 shape with -m gpu.

Tolerances: the kernel and the twin both accumulate the Kc products in fp32 and round once to the
output dtype, in a different order, so outputs may differ by one unit in the last place of that
dtype (fp16 ~1e-3, bf16 ~8e-3 relative); the conv state is a copy of inputs and must match exactly.
"""
import pytest
import torch

from catengine.kernels.gdn import naive as ref
from catengine.kernels.gdn.conv1d import causal_conv1d, causal_conv1d_update

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _qsl(lens, device="cpu"):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _case(lens, c, kc, dtype, gen, num_slots=12, strided=False):
    t = sum(lens)
    if strided:  # x as a column slice of a wider projection output
        x = torch.randn(t, c + 24, generator=gen).to(dtype)[:, 8:8 + c]
    else:
        x = torch.randn(t, c, generator=gen).to(dtype)
    weight = torch.randn(c, kc, generator=gen).to(dtype)
    states = torch.randn(num_slots, kc - 1, c, generator=gen).to(dtype)
    slots = torch.randperm(num_slots, generator=gen)[:len(lens)].to(torch.int32)
    has = torch.rand(len(lens), generator=gen) < 0.6
    return x, weight, states, slots, has


def _close(got, want, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kc,activation,strided", [(4, "silu", False), (4, None, True), (2, "silu", False),
                                                   (3, "silu", True), (5, "silu", False)])
def test_causal_conv1d_matches_reference(dtype, kc, activation, strided):
    gen = torch.Generator().manual_seed(kc * 10 + (activation is None) + 3 * strided)
    lens = [1, 2, 3, 0, 5, 64, 300]  # an empty sequence must keep its state
    x, w, states, slots, has = _case(lens, 40, kc, dtype, gen, strided=strided)
    qsl = _qsl(lens)
    st_ref = states.clone()
    out_ref = ref.causal_conv1d(x, w, st_ref, qsl, slots, has, activation)
    st = states.clone().to(DEV)
    out = causal_conv1d(x.to(DEV), w.to(DEV), st, qsl.to(DEV), slots.to(DEV), has.to(DEV), activation)
    assert out.dtype == dtype and out.shape == x.shape
    _close(out, out_ref, dtype)
    assert torch.equal(st.cpu(), st_ref), "new conv states are copies of inputs and must match exactly"
    assert not torch.equal(st_ref, states), "the case must write states"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kc,strided", [(4, False), (3, True)])
def test_causal_conv1d_update_matches_reference(dtype, kc, strided):
    gen = torch.Generator().manual_seed(kc)
    # C = 300: more than one channel block; strided: x as the model passes it, a column slice
    x, w, states, slots, _ = _case([1] * 6, 300, kc, dtype, gen, strided=strided)
    assert x.is_contiguous() != strided
    st_ref = states.clone()
    out_ref = ref.causal_conv1d_update(x, w, st_ref, slots)
    st = states.clone().to(DEV)
    out = causal_conv1d_update(x.to(DEV), w.to(DEV), st, slots.to(DEV))
    _close(out, out_ref, dtype)
    assert torch.equal(st.cpu(), st_ref)


def test_chunked_prefill_then_decode_equals_one_pass():
    """Prefill in two pieces, then three decode steps, equals one conv over the whole sequence:
    the state handed from call to call is exactly the conv's memory."""
    gen = torch.Generator().manual_seed(7)
    c, kc, n = 24, 4, 45
    x = torch.randn(n, c, generator=gen)
    w = torch.randn(c, kc, generator=gen)
    want = ref.causal_conv1d(x, w, torch.zeros(1, kc - 1, c), _qsl([n]), torch.zeros(1, dtype=torch.int32),
                             torch.zeros(1, dtype=torch.bool))
    st = torch.randn(3, kc - 1, c).to(DEV)  # garbage in slot 2: has_initial_state=False must ignore it
    slot = torch.tensor([2], dtype=torch.int32, device=DEV)
    xd = x.to(DEV)
    o1 = causal_conv1d(xd[:2], w.to(DEV), st, _qsl([2], DEV), slot, torch.tensor([False], device=DEV))
    o2 = causal_conv1d(xd[2:n - 3], w.to(DEV), st, _qsl([n - 5], DEV), slot, torch.tensor([True], device=DEV))
    steps = [causal_conv1d_update(xd[i:i + 1], w.to(DEV), st, slot) for i in range(n - 3, n)]
    got = torch.cat([o1, o2] + steps).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_causal_conv1d_gpu_real_shape(dtype):
    """Qwen3.5-27B conv_dim = 2 * 16 * 128 + 48 * 128 = 10240, Kc = 4, a ragged batch with a long sequence."""
    gen = torch.Generator().manual_seed(1)
    lens = [1, 3, 4000, 9000, 17]
    x, w, states, slots, has = _case(lens, 10240, 4, dtype, gen, num_slots=8)
    qsl = _qsl(lens)
    x, w, qsl, slots, has = x.cuda(), w.cuda(), qsl.cuda(), slots.cuda(), has.cuda()
    st_ref, st = states.cuda(), states.cuda()
    out_ref = ref.causal_conv1d(x, w, st_ref, qsl, slots, has)
    out = causal_conv1d(x, w, st, qsl, slots, has)
    _close(out, out_ref, dtype)
    assert torch.equal(st, st_ref)
    xd = torch.randn(4, 10240, generator=gen).to(dtype).cuda()
    sl = torch.randperm(8, generator=gen)[:4].to(torch.int32).cuda()
    out_ref = ref.causal_conv1d_update(xd, w, st_ref, sl)
    out = causal_conv1d_update(xd, w, st, sl)
    _close(out, out_ref, dtype)
    assert torch.equal(st, st_ref)
