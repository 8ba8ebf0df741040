"""The MoE twins themselves, checked against a per-token loop (they are the oracle for the kernels)."""
import torch
import torch.nn.functional as F

from catengine.kernels.moe import naive as R


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
