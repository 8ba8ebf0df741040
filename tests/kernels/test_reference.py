"""The torch twins themselves, checked against independent formulations (they are the oracle for the kernels)."""
import pytest
import torch
import torch.nn.functional as F

from catengine.kernels import reference as R
from catengine.kernels.packing import QuantizedWeight, dequantize, pack_int4_along_k, unpack_int4_along_k


def test_e5m2_bytes_match_torch_on_all_fp16_patterns():
    x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    ours = R.fp16_to_e5m2(x)
    theirs = x.to(torch.float8_e5m2).view(torch.uint8)
    assert torch.equal(ours, theirs)


def test_e5m2_widening_is_exact():
    b = torch.arange(256, dtype=torch.uint8)
    ours = R.e5m2_to_fp16(b)
    theirs = b.view(torch.float8_e5m2).to(torch.float16)
    finite = ~theirs.isnan()
    assert torch.equal(ours[finite].view(torch.int16), theirs[finite].view(torch.int16))
    assert ours[~finite].isnan().all()


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


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.uint8])
def test_paged_attention_equals_dense_causal_sdpa(kv_dtype):
    g = torch.Generator().manual_seed(2)
    nh, nkv, d, bs = 4, 2, 16, 4
    ctx, new = [5, 0, 11], [3, 4, 1]
    num_blocks = 16
    kc = torch.zeros(num_blocks, bs, nkv, d, dtype=kv_dtype)
    vc = torch.zeros_like(kc)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, qs, expected = [], [], []
    for c, n in zip(ctx, new):
        total = c + n
        table = [perm.pop() for _ in range((total + bs - 1) // bs)]
        tables.append(table + [0] * (4 - len(table)))
        k, v = torch.randn(total, nkv, d, generator=g), torch.randn(total, nkv, d, generator=g)
        if kv_dtype == torch.uint8:  # the oracle sees the values the cache can hold
            k, v = (R.e5m2_to_fp16(R.fp16_to_e5m2(t.half())).float() for t in (k, v))
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(total)])
        R.store_kv(k, v, kc, vc, slots)
        q = torch.randn(n, nh, d, generator=g)
        qs.append(q)
        full_q = torch.cat([torch.zeros(c, nh, d), q])
        ref = F.scaled_dot_product_attention(full_q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1),
                                             v.repeat_interleave(2, 1).transpose(0, 1), is_causal=True, scale=0.25)
        expected.append(ref.transpose(0, 1)[c:])
    qsl = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32)
    out = R.paged_attention(torch.cat(qs), kc, vc, torch.tensor(tables, dtype=torch.int32),
                            torch.tensor([c + n for c, n in zip(ctx, new)], dtype=torch.int32), qsl, 0.25, 4, 12)
    torch.testing.assert_close(out, torch.cat(expected), rtol=1e-5, atol=1e-5)


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


def test_int4_packing_round_trips_and_dequantizes():
    g = torch.Generator().manual_seed(4)
    q = torch.randint(0, 16, (2, 64, 24), generator=g)
    packed = pack_int4_along_k(q)
    assert packed.shape == (2, 8, 24) and packed.dtype == torch.int32
    assert torch.equal(unpack_int4_along_k(packed), q.to(torch.int32))
    s, z = torch.rand(2, 2, 24, generator=g), torch.randint(0, 16, (2, 2, 24), generator=g).float()
    w = dequantize(QuantizedWeight(packed, s, z, 32))
    torch.testing.assert_close(w, (q - z.repeat_interleave(32, 1)) * s.repeat_interleave(32, 1))


def test_moe_matches_a_per_token_loop():
    g = torch.Generator().manual_seed(5)
    T, H, I, E, k = 5, 8, 6, 4, 2
    x = torch.randn(T, H, generator=g)
    w13, w2 = torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g)
    weights, ids = R.moe_route(torch.randn(T, E, generator=g), k)
    out = R.fused_moe(x, w13, w2, weights, ids)
    for t in range(T):
        ref = sum(weights[t, j] * (w2[e] @ (F.silu(w13[e, :I] @ x[t]) * (w13[e, I:] @ x[t])))
                  for j, e in enumerate(ids[t].tolist()))
        torch.testing.assert_close(out[t], ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(T))


def test_sampler_greedy_and_kept_set():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 4.9]])
    ones = torch.ones(2)
    greedy = R.sample_tokens(logits, torch.zeros(2), torch.zeros(2, dtype=torch.int32), ones, torch.zeros(2),
                             torch.tensor([1, 2]), torch.tensor([0, 0]))
    assert greedy.tolist() == [1, 0]
    for step in range(50):  # top_k = 2 only ever returns the two best tokens
        t = R.sample_tokens(logits, ones, torch.tensor([2, 2], dtype=torch.int32), ones, torch.zeros(2),
                            torch.tensor([7, 7]), torch.tensor([step, step]))
        assert t[0].item() in (1, 3) and t[1].item() in (0, 3)
