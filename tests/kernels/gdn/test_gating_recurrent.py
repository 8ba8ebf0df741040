"""The decode / verify step's GDN form: the gating computed inside the recurrent kernel (recurrent.gdn_gating_recurrent,
one launch) against its twin naive.gdn_gating_recurrent (gdn_gating then recurrent_gated_delta_rule), and bit for
bit against the two Triton launches it replaces: both forms compute g and beta with one jitted expression
(recurrent.gate), so fusing may not change a single bit of the output or the state. Interpreter on small heads;
compiled with -m gpu on the Qwen3.5-27B's heads with 16-bit states.
"""
import pytest
import torch

from catengine.kernels import ops
from catengine.kernels.gdn import naive as ref
from catengine.kernels.gdn.recurrent import gdn_gating, gdn_gating_recurrent, recurrent_gated_delta_rule

from .test_gated_delta_rule import _qsl, _rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(lens, hk, r, dk, dv, dtype, state_dtype, seed, device, num_slots=None):
    """Random decode / verify inputs; a and b are column views of one projection, as the model slices them."""
    gen = torch.Generator().manual_seed(seed)
    t, hv, nb = sum(lens), hk * r, len(lens)
    q = torch.randn(t, hk, dk, generator=gen).to(dtype)
    k = torch.randn(t, hk, dk, generator=gen).to(dtype)
    v = torch.randn(t, hv, dv, generator=gen).to(dtype)
    ba = (torch.randn(t, 2 * hv + 3, generator=gen) * 2).to(dtype)       # the in_proj_ba output: b, a, then padding
    b, a = ba[:, :hv], ba[:, hv:2 * hv]
    a_log = 3.0 * torch.rand(hv, generator=gen) - 1.5
    dt_bias = torch.rand(hv, generator=gen)
    num_slots = num_slots or nb + 3
    ssm = (torch.randn(num_slots, hv, dk, dv, generator=gen) * 0.5).to(state_dtype)
    slots = torch.randperm(num_slots, generator=gen)[:nb].to(torch.int32)
    has = torch.rand(nb, generator=gen) < 0.8
    out = [q, k, v, a_log, a, dt_bias, b, ssm, _qsl(lens), slots, has]
    return [x.to(device) for x in out]


def _two_launches(q, k, v, a_log, a, dt_bias, b, ssm, qsl, slots, has, scale, inter=None):
    g, beta = gdn_gating(a_log, a, dt_bias, b)
    return recurrent_gated_delta_rule(q, k, v, g, beta, ssm, qsl, slots, has, scale, intermediate_state_slots=inter)


@pytest.mark.parametrize("dtype,state_dtype,r", [(torch.float32, torch.float32, 2), (torch.float16, torch.float32, 1),
                                                 (torch.float16, torch.float16, 3)])
def test_fused_gating_decode_matches_twin_and_two_launches(dtype, state_dtype, r):
    args = _case([1, 1, 0, 1, 1], 1, r, 16, 32, dtype, state_dtype, seed=r, device=DEV)
    ssm = args[7]
    s_ref, s_two, s_one = ssm.cpu().clone(), ssm.clone(), ssm.clone()
    cpu = [x.cpu() for x in args]
    o_ref = ref.gdn_gating_recurrent(*cpu[:7], s_ref, *cpu[8:], 0.25)
    o_two = _two_launches(*args[:7], s_two, *args[8:], 0.25)
    o_one = gdn_gating_recurrent(*args[:7], s_one, *args[8:], 0.25)
    assert torch.equal(o_one, o_two) and torch.equal(s_one, s_two)
    # the twin: as test_gated_delta_rule's decode bounds (fp32 1e-4 of summation order; fp16 inputs 5e-3; a 16-bit
    # state: one storage ulp)
    assert _rel(o_one, o_ref) < (1e-4 if dtype == torch.float32 else 5e-3)
    assert _rel(s_one.float(), s_ref.float()) < (1e-5 if state_dtype == torch.float32 else 5e-4)


def test_fused_gating_verify_with_intermediate_slots():
    """Three sequences verify 3, 4 and 2 tokens; each token's state goes to its own slot (-1: not kept)."""
    args = _case([3, 4, 2], 1, 2, 16, 16, torch.float32, torch.float32, seed=11, device=DEV, num_slots=16)
    args[9] = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
    inter = torch.tensor([[3, 4, 5, -1], [6, -1, 7, 8], [9, 10, -1, -1]], dtype=torch.int32, device=DEV)
    ssm = args[7]
    s_ref, s_two, s_one = ssm.cpu().clone(), ssm.clone(), ssm.clone()
    cpu = [x.cpu() for x in args]
    o_ref = ref.gdn_gating_recurrent(*cpu[:7], s_ref, *cpu[8:], 0.25, intermediate_state_slots=inter.cpu())
    o_two = _two_launches(*args[:7], s_two, *args[8:], 0.25, inter)
    o_one = gdn_gating_recurrent(*args[:7], s_one, *args[8:], 0.25, intermediate_state_slots=inter)
    assert torch.equal(o_one, o_two) and torch.equal(s_one, s_two)
    assert _rel(o_one, o_ref) < 1e-5 and _rel(s_one, s_ref) < 1e-5


def test_ops_dispatch_takes_the_twin_on_cpu():
    args = _case([1, 1], 1, 1, 16, 16, torch.float32, torch.float32, seed=2, device="cpu")
    s1, s2 = args[7].clone(), args[7].clone()
    o1 = ops.gdn_gating_recurrent(*args[:7], s1, *args[8:], 0.25)
    o2 = ref.gdn_gating_recurrent(*args[:7], s2, *args[8:], 0.25)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_fused_gating_real_shape_bitwise(state_dtype):
    """The 27B's GDN heads (Hk 16, Hv 48, dk = dv = 128), bf16 activations, 61 decode rows and 3 verify rows with
    intermediate slots: the one launch gives the two launches' bits."""
    lens = [1] * 61 + [4, 4, 3]
    args = _case(lens, 16, 3, 128, 128, torch.bfloat16, state_dtype, seed=5, device="cuda", num_slots=300)
    inter = torch.full((len(lens), 4), -1, dtype=torch.int32)
    inter[61:] = torch.arange(100, 112, dtype=torch.int32).view(3, 4)
    inter = inter.cuda()
    s_two, s_one = args[7].clone(), args[7].clone()
    o_two = _two_launches(*args[:7], s_two, *args[8:], 0.088, inter)
    o_one = gdn_gating_recurrent(*args[:7], s_one, *args[8:], 0.088, intermediate_state_slots=inter)
    assert torch.equal(o_one, o_two) and torch.equal(s_one, s_two)


def test_fused_gating_errors_name_its_own_arguments():
    """A wrong shape is reported by the names the caller passed: a and b (not the g and beta they stand in for), and
    A_log / dt_bias of the wrong length are refused before the kernel would read past them."""
    args = _case([1, 2], 2, 2, 16, 16, torch.float32, torch.float32, 0, DEV)
    q, k, v, a_log, a, dt_bias, b, ssm, qsl, slots, has = args
    with pytest.raises(ValueError, match=r"a and b \[T, Hv\].* a \(3, 3\), b \(3, 4\)"):
        gdn_gating_recurrent(q, k, v, a_log, a[:, :3], dt_bias, b, ssm, qsl, slots, has, 0.25)
    with pytest.raises(ValueError, match=r"A_log and dt_bias must be \[Hv\] = \[4\].*A_log \(3,\)"):
        gdn_gating_recurrent(q, k, v, a_log[:3], a, dt_bias, b, ssm, qsl, slots, has, 0.25)
    g, beta = gdn_gating(a_log, a, dt_bias, b)
    with pytest.raises(ValueError, match=r"g and beta \[T, Hv\]"):
        recurrent_gated_delta_rule(q, k, v, g[:, :3], beta, ssm, qsl, slots, has, 0.25)
