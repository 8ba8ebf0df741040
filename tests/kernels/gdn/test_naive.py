"""The GDN twins themselves, checked against independent formulations (they are the oracle for the kernels)."""
import pytest
import torch
import torch.nn.functional as F

from catengine.kernels.gdn import naive as R


@pytest.mark.parametrize("lens,chunk", [([1, 5, 64, 130], 64), ([3, 17], 4)])
def test_chunked_delta_rule_equals_recurrent(lens, chunk):
    g = torch.Generator().manual_seed(0)
    T, Hk, Hv, dk, dv = sum(lens), 2, 4, 16, 8
    q, k = torch.randn(T, Hk, dk, generator=g), torch.randn(T, Hk, dk, generator=g)
    v = torch.randn(T, Hv, dv, generator=g)
    gate = -torch.rand(T, Hv, generator=g)
    beta = torch.rand(T, Hv, generator=g)
    qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    slots = torch.arange(len(lens), dtype=torch.int32).flip(0)
    has = torch.arange(len(lens)) % 2 == 0
    s1 = torch.randn(len(lens), Hv, dk, dv, generator=g)
    s2 = s1.clone()
    o1 = R.chunk_gated_delta_rule(q, k, v, gate, beta, s1, qsl, slots, has, dk ** -0.5, chunk_size=chunk)
    o2 = R.recurrent_gated_delta_rule(q, k, v, gate, beta, s2, qsl, slots, has, dk ** -0.5)
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-5)


def test_recurrent_intermediate_states_are_the_prefix_states():
    g = torch.Generator().manual_seed(1)
    T, H, d = 3, 2, 8
    q, k, v = (torch.randn(T, H, d, generator=g) for _ in range(3))
    gate, beta = -torch.rand(T, H, generator=g), torch.rand(T, H, generator=g)
    states = torch.zeros(5, H, d, d)
    inter = torch.tensor([[2, 3, 4]], dtype=torch.int32)
    R.recurrent_gated_delta_rule(q, k, v, gate, beta, states, torch.tensor([0, T], dtype=torch.int32),
                                 torch.tensor([0], dtype=torch.int32), torch.tensor([False]), 0.3,
                                 intermediate_state_slots=inter)
    for j in range(T):  # the state after j+1 tokens equals a fresh run over the first j+1 tokens
        fresh = torch.zeros(1, H, d, d)
        R.recurrent_gated_delta_rule(q[: j + 1], k[: j + 1], v[: j + 1], gate[: j + 1], beta[: j + 1], fresh,
                                     torch.tensor([0, j + 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                                     torch.tensor([False]), 0.3)
        torch.testing.assert_close(states[2 + j], fresh[0])
    torch.testing.assert_close(states[0], states[4])


def test_causal_conv1d_continues_from_state():
    g = torch.Generator().manual_seed(3)
    C, Kc, L = 6, 4, 9
    x, w = torch.randn(L, C, generator=g), torch.randn(C, Kc, generator=g)
    full = F.silu(F.conv1d(x.t()[None], w[:, None, :], padding=Kc - 1, groups=C)[0, :, :L].t())
    states = torch.zeros(2, Kc - 1, C)
    out = torch.cat([
        R.causal_conv1d(x[:2], w, states, torch.tensor([0, 2]), torch.tensor([1]), torch.tensor([False])),
        R.causal_conv1d(x[2:7], w, states, torch.tensor([0, 5]), torch.tensor([1]), torch.tensor([True])),
        R.causal_conv1d_update(x[7:8], w, states, torch.tensor([1])),
        R.causal_conv1d_update(x[8:9], w, states, torch.tensor([1])),
    ])
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(states[1], x[-(Kc - 1):])
