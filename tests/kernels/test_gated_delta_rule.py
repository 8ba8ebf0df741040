"""Gated DeltaNet kernels (Triton) against the reference twins: interpreter on tiny head dims, compiled on
the Qwen3.5-27B shape (Hk 16, Hv 48, dk = dv = 128) with -m gpu.

Tolerances (relative Frobenius error ||got - want|| / ||want||, per output and per state):
- fp32 inputs: every intermediate stays fp32, so only summation order differs: 1e-4.
- fp16 / bf16 inputs: like flash-linear-attention, the kernels keep w, u, the per-chunk states and
  v_new in the activation dtype and multiply in it (fp32 accumulation). Each is one rounding of
  relative size eps (fp16 4.9e-4, bf16 3.9e-3) feeding a sum of 64-128 terms, so the error stays
  near a few eps; the scan does not amplify it because exp(g) <= 1 and (I - beta k k^T) with
  |k| = 1, 0 < beta < 1 are contractions. Bounds: fp16 5e-3, bf16 2e-2.
"""
import dataclasses
import math

import pytest
import torch

from catengine.kernels import reference as ref
from catengine.kernels import gated_delta_rule as gdr
from catengine.kernels.gated_delta_rule import chunk_gated_delta_rule
from catengine.kernels.gdn_recurrent import gdn_gating, recurrent_gated_delta_rule

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def _rel(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    assert torch.isfinite(got).all()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _qsl(lens, device="cpu"):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _case(lens, hk, r, dk, dv, dtype, gen, num_slots=None, has_p=0.5, device="cpu", slow_decay=False):
    """Random inputs; g and beta come from the model's gating on random projections."""
    t, hv, b = sum(lens), hk * r, len(lens)
    q = torch.randn(t, hk, dk, generator=gen).to(dtype)
    k = torch.randn(t, hk, dk, generator=gen).to(dtype)
    v = torch.randn(t, hv, dv, generator=gen).to(dtype)
    # A = exp(A_log) in [0.2, 4.5], or [5e-5, 0.05] for long memories (g near 0)
    u = torch.rand(hv, generator=gen)
    a_log = -3.0 - 7.0 * u if slow_decay else 3.0 * u - 1.5
    g, beta = ref.gdn_gating(a_log, torch.randn(t, hv, generator=gen), torch.rand(hv, generator=gen),
                             torch.randn(t, hv, generator=gen))
    num_slots = num_slots or b + 3
    ssm = torch.randn(num_slots, hv, dk, dv, generator=gen) * 0.5
    slots = torch.randperm(num_slots, generator=gen)[:b].to(torch.int32)
    has = torch.rand(b, generator=gen) < has_p
    qsl = _qsl(lens)
    return [x.to(device) for x in (q, k, v, g, beta, ssm, qsl, slots, has)]


def test_gdn_gating_matches_reference():
    gen = torch.Generator().manual_seed(0)
    hv, t = 6, 37
    a_log, dt_bias = torch.randn(hv, generator=gen), torch.randn(hv, generator=gen)
    a = torch.randn(t, 2 * hv, generator=gen)[:, :hv] * 15  # softplus in all regimes (x < -9, |x| < 20, x > 20)
    b = torch.randn(t, 2 * hv, generator=gen)[:, hv:] * 8   # both as column slices of in_proj_ba's output
    g_ref, beta_ref = ref.gdn_gating(a_log, a, dt_bias, b)
    g, beta = gdn_gating(a_log.to(DEV), a.to(DEV), dt_bias.to(DEV), b.to(DEV))
    torch.testing.assert_close(g.cpu(), g_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(beta.cpu(), beta_ref, rtol=1e-5, atol=1e-6)


# lens, Hk, Hv/Hk, dk, dv, dtype, P(initial state)
CHUNK_CASES = {
    "ragged_1_to_300_gqa2": ([1, 17, 64, 65, 300], 1, 2, 16, 32, torch.float32, 0.6),
    "fp16_no_init_empty_seq": ([3, 130, 0, 64], 1, 1, 32, 16, torch.float16, 0.0),
    "short_gqa3_padded_dims": ([1, 2, 5, 33], 1, 3, 20, 24, torch.float32, 1.0),
    # (the interpreter's tl.dot cannot take bf16: bf16 runs in the -m gpu tests)
    "fp16_two_key_heads": ([70, 9], 2, 2, 16, 16, torch.float16, 0.5),
}


@pytest.mark.parametrize("name", list(CHUNK_CASES))
def test_chunk_gated_delta_rule_matches_reference(name):
    lens, hk, r, dk, dv, dtype, has_p = CHUNK_CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    q, k, v, g, beta, ssm, qsl, slots, has = _case(lens, hk, r, dk, dv, dtype, gen, has_p=has_p)
    scale = dk ** -0.5
    ssm_ref = ssm.clone()
    o_ref = ref.chunk_gated_delta_rule(q, k, v, g, beta, ssm_ref, qsl, slots, has, scale)
    ssm_d = ssm.clone().to(DEV)
    o = chunk_gated_delta_rule(*(x.to(DEV) for x in (q, k, v, g, beta)), ssm_d, qsl.to(DEV), slots.to(DEV),
                               has.to(DEV), scale)
    assert o.dtype == dtype and o.shape == v.shape
    assert _rel(o, o_ref) < TOL[dtype]
    written = [int(s) for s, n in zip(slots, lens) if n > 0]
    assert _rel(ssm_d[written], ssm_ref[written]) < TOL[dtype]
    kept = [i for i in range(ssm.shape[0]) if i not in written]
    assert torch.equal(ssm_d[kept].cpu(), ssm[kept]), "slots of other (or empty) sequences must stay as they were"


def test_chunk_segments_hand_the_state_on():
    """The path that overlaps WY and scan cuts the chunks into windows; each scan launch continues
    from the state the previous one left in the slot. Forced here on tiny inputs (windows of 3
    chunks cut through the 7-chunk sequence and fall between the others)."""
    gen = torch.Generator().manual_seed(9)
    lens = [130, 1, 0, 200, 64]
    q, k, v, g, beta, ssm, qsl, slots, _ = _case(lens, 1, 2, 16, 16, torch.float32, gen)
    has = torch.tensor([True, False, True, False, True])  # the 200-token sequence, cut in two, starts at zero
    ssm_ref = ssm.clone()
    o_ref = ref.chunk_gated_delta_rule(q, k, v, g, beta, ssm_ref, qsl, slots, has, 0.25)
    table = dataclasses.replace(gdr._TABLE[80], overlap_max_programs=1 << 30, overlap_min_chunks=2,
                                overlap_segments=5)
    ssm_d = ssm.clone().to(DEV)
    o, steps = gdr.chunk_steps(*(x.to(DEV) for x in (q, k, v, g, beta)), ssm_d, qsl.to(DEV), slots.to(DEV),
                               has.to(DEV), 0.25, table=table)
    assert [name for name, _ in steps] == ["wy+scan overlapped"]
    for _, launch in steps:
        launch()
    assert _rel(o, o_ref) < 1e-4 and _rel(ssm_d, ssm_ref) < 1e-4


def test_chunk_without_l2norm_and_bad_chunk_size():
    gen = torch.Generator().manual_seed(5)
    q, k, v, g, beta, ssm, qsl, slots, has = _case([3, 40], 1, 2, 16, 16, torch.float32, gen)
    k = k / k.norm(dim=-1, keepdim=True) * 0.9  # keys of norm < 1 keep the un-normalised rule stable
    ssm_ref = ssm.clone()
    o_ref = ref.chunk_gated_delta_rule(q, k, v, g, beta, ssm_ref, qsl, slots, has, 0.3, use_qk_l2norm=False)
    ssm_d = ssm.clone().to(DEV)
    args = [x.to(DEV) for x in (q, k, v, g, beta)] + [ssm_d, qsl.to(DEV), slots.to(DEV), has.to(DEV), 0.3]
    o = chunk_gated_delta_rule(*args, use_qk_l2norm=False)
    assert _rel(o, o_ref) < 1e-4 and _rel(ssm_d, ssm_ref) < 1e-4
    with pytest.raises(ValueError, match="chunk_size=64"):
        chunk_gated_delta_rule(*args, chunk_size=32)


@pytest.mark.parametrize("dtype,r,l2norm", [(torch.float32, 2, True), (torch.float16, 1, True),
                                            (torch.float32, 3, False)])
def test_recurrent_decode_matches_reference(dtype, r, l2norm):
    gen = torch.Generator().manual_seed(r)
    lens = [1, 1, 0, 1, 1]
    q, k, v, g, beta, ssm, qsl, slots, has = _case(lens, 1, r, 16, 32, dtype, gen, has_p=0.7)
    if not l2norm:
        q, k = q * 0.2, k * 0.2
    ssm_ref = ssm.clone()
    o_ref = ref.recurrent_gated_delta_rule(q, k, v, g, beta, ssm_ref, qsl, slots, has, 0.25, l2norm)
    ssm_d = ssm.clone().to(DEV)
    o = recurrent_gated_delta_rule(*(x.to(DEV) for x in (q, k, v, g, beta)), ssm_d, qsl.to(DEV), slots.to(DEV),
                                   has.to(DEV), 0.25, l2norm)
    assert _rel(o, o_ref) < TOL[dtype]
    assert _rel(ssm_d, ssm_ref) < 1e-5  # the state is fp32 throughout; only the inputs are rounded


def test_recurrent_speculative_intermediate_slots():
    """Three sequences verify 3, 4 and 2 draft tokens; the state after each token goes to its own slot
    (-1: not saved), the final state to the sequence's slot, everything else is left alone."""
    gen = torch.Generator().manual_seed(11)
    lens = [3, 4, 2]
    q, k, v, g, beta, ssm, qsl, slots, has = _case(lens, 1, 2, 16, 16, torch.float32, gen, num_slots=16, has_p=1)
    slots = torch.tensor([0, 1, 2], dtype=torch.int32)
    inter = torch.tensor([[3, 4, 5, -1], [6, -1, 7, 8], [9, 10, -1, -1]], dtype=torch.int32)
    ssm_ref = ssm.clone()
    o_ref = ref.recurrent_gated_delta_rule(q, k, v, g, beta, ssm_ref, qsl, slots, has, 0.25,
                                           intermediate_state_slots=inter)
    ssm_d = ssm.clone().to(DEV)
    o = recurrent_gated_delta_rule(*(x.to(DEV) for x in (q, k, v, g, beta)), ssm_d, qsl.to(DEV), slots.to(DEV),
                                   has.to(DEV), 0.25, intermediate_state_slots=inter.to(DEV))
    assert _rel(o, o_ref) < 1e-5
    for s in range(16):
        assert _rel(ssm_d[s], ssm_ref[s]) < 1e-5, f"slot {s}"
    assert torch.equal(ssm_d[11:].cpu(), ssm[11:])


# ---------------------------------------------------------------- GPU, Qwen3.5-27B shape
def _gpu_chunk_check(lens, seed, slow_decay=False):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g, beta, ssm, qsl, slots, has = _case(lens, 16, 3, 128, 128, torch.bfloat16, gen, device="cuda",
                                                   slow_decay=slow_decay)
    scale = 128 ** -0.5
    ssm_ref = ssm.clone()
    # the oracle: the chunked twin in fp32 on the GPU (same bf16 inputs, fp32 math everywhere)
    o_ref = ref.chunk_gated_delta_rule(q, k, v, g, beta, ssm_ref, qsl, slots, has, scale)
    o = chunk_gated_delta_rule(q, k, v, g, beta, ssm, qsl, slots, has, scale)
    torch.cuda.synchronize()
    e_o, e_s = _rel(o, o_ref), _rel(ssm, ssm_ref)
    print(f"\nchunk lens={lens if len(lens) < 8 else len(lens)} slow_decay={slow_decay}: "
          f"rel err o {e_o:.2e} state {e_s:.2e}")
    assert e_o < TOL[torch.bfloat16] and e_s < TOL[torch.bfloat16]


@pytest.mark.gpu
def test_chunk_gpu_real_shape_ragged():
    _gpu_chunk_check([1, 63, 64, 65, 1000, 4096, 0, 7], seed=1)


@pytest.mark.gpu
@pytest.mark.parametrize("slow_decay", [False, True])
def test_chunk_gpu_real_shape_64k(slow_decay):
    _gpu_chunk_check([65536], seed=2, slow_decay=slow_decay)


@pytest.mark.gpu
def test_recurrent_gpu_real_shape():
    gen = torch.Generator().manual_seed(3)
    lens = [1] * 61 + [4, 4, 3]  # decode plus speculative verification of up to 4 tokens
    q, k, v, g, beta, ssm, qsl, slots, has = _case(lens, 16, 3, 128, 128, torch.bfloat16, gen, device="cuda",
                                                   num_slots=300, has_p=0.9)
    inter = torch.full((len(lens), 4), -1, dtype=torch.int32)
    inter[61:] = torch.arange(100, 112, dtype=torch.int32).view(3, 4)
    inter = inter.cuda()
    ssm_ref = ssm.clone()
    o_ref = ref.recurrent_gated_delta_rule(q, k, v, g, beta, ssm_ref, qsl, slots, has, 0.088,
                                           intermediate_state_slots=inter)
    o = recurrent_gated_delta_rule(q, k, v, g, beta, ssm, qsl, slots, has, 0.088, intermediate_state_slots=inter)
    # same fp32 math on the same bf16 inputs: outputs differ by bf16 rounding flips (<= 1 ulp, 3.9e-3)
    assert _rel(o, o_ref) < 4e-3 and _rel(ssm, ssm_ref) < 1e-5
    assert not math.isnan(o.float().sum().item())
