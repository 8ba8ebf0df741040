"""The gated delta rule in pure torch: a chunked form for training (a few batched matmuls per 64-token chunk, one
triangular solve per chunk for the UT transform) and the token-by-token recurrence it must equal (its twin).

Inputs are per value head: q, k ``[B, T, H, dk]`` (already L2-normalized, key heads repeated to value heads),
v ``[B, T, H, dv]``, g ``[B, T, H]`` (log decay, <= 0), beta ``[B, T, H]`` (write strength in (0, 1)). Output
``[B, T, H, dv]`` in float32. The recurrence, with q scaled by dk^-1/2:

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,    o_t = S_t^T q_t
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def recurrent_gated_delta_rule(q, k, v, g, beta):
    """The definition, one token at a time in float64 (slow; the reference for :func:`chunk_gated_delta_rule`)."""
    B, T, H, dk = q.shape
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    q = q * dk ** -0.5
    S = q.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kt, vt = k[:, t], v[:, t]
        pred = torch.einsum("bhkv,bhk->bhv", S, kt)
        S = S + torch.einsum("bhk,bhv->bhkv", kt, (vt - pred) * beta[:, t, :, None])
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(out, dim=1)


def chunk_gated_delta_rule(q, k, v, g, beta, chunk: int = 64):
    """Equal to :func:`recurrent_gated_delta_rule` up to rounding. Within a chunk the T sequential rank-1 updates
    are folded into (I + tril(diag(beta) K K^T * decay, -1))^-1 applied to beta V and to the decayed beta K (the
    UT transform), so the only sequential part is one state update per chunk."""
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    q, k, v = (x.transpose(1, 2).float() for x in (q, k, v))          # [B, H, T, d]
    g, beta = g.transpose(1, 2).float(), beta.transpose(1, 2).float()  # [B, H, T]
    q = q * dk ** -0.5
    pad = (-T) % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (T + pad) // chunk
    q, k, v = (x.reshape(B, H, n, chunk, -1) for x in (q, k, v))
    g, beta = g.reshape(B, H, n, chunk), beta.reshape(B, H, n, chunk)
    gc = g.cumsum(-1)                                                   # log decay from chunk start to t
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    # decay[i, j] = prod of exp(g) over (j, i]; masked above the diagonal before exp (it would overflow there)
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(upper, float("-inf")).exp()
    kb = k * beta[..., None]
    lower = (kb @ k.transpose(-1, -2)) * decay
    # unitriangular: the solve reads only the strict lower triangle and takes the diagonal as 1
    u = torch.linalg.solve_triangular(lower, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(lower, kb * gc.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay                            # causal within the chunk
    qg = q * gc.exp()[..., None]
    kd = k * (gc[..., -1:] - gc).exp()[..., None]
    chunk_decay = gc[..., -1].exp()[..., None, None]
    S = q.new_zeros(B, H, dk, dv)
    outs = []
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ S
        outs.append(qg[:, :, i] @ S + attn[:, :, i] @ v_new)
        S = S * chunk_decay[:, :, i] + kd[:, :, i].transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).reshape(B, H, n * chunk, dv)[:, :, :T]
    return o.transpose(1, 2)
