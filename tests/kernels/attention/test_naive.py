"""The attention twins themselves, checked against dense causal SDPA (they are the oracle for the kernels)."""
import pytest
import torch
import torch.nn.functional as F

from catengine.kernels.attention import naive as R
from catengine.kernels.common.e5m2 import e5m2_to_fp16, fp16_to_e5m2


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
            k, v = (e5m2_to_fp16(fp16_to_e5m2(t.half())).float() for t in (k, v))
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
