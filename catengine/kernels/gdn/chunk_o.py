"""Gated DeltaNet chunked prefill (the split form), stage 3: the output, all chunks in parallel (chunk x
value head x dv block), from the per-chunk start states and v_new that :mod:`.chunk_h` stored:
o = e^g (q S_chunk) + tril(q k^T * e^{g_i - g_j}) v_new, q and k l2-normalised by scaling the rows
and columns of the fp32 products (q, k go to the tensor cores as stored). The host side is in
:mod:`catengine.kernels.gdn.chunk`; same structure as flash-linear-attention's chunk_fwd_o.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .chunk_wy import chunk_of


@triton.jit
def gdn_chunk_o_kernel(q, k, vn, hb, g, kn, o, qsl, cu_chunks, c_lo, B, HV, R, scale, stride_q_t, stride_q_h,
                       stride_k_t, stride_k_h, stride_g_t, stride_o_t, stride_o_h, K: tl.constexpr,
                       V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr):
    i_c, i_h, i_v = tl.program_id(0) + c_lo, tl.program_id(1), tl.program_id(2)
    i_hk = i_h // R
    t, eos = chunk_of(qsl, cu_chunks, B, i_c)
    if t >= eos:
        return
    DT = hb.dtype.element_ty
    o_t = tl.arange(0, 64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_t = (t + o_t) < eos
    o_tt = (t + o_t).to(tl.int64)
    # [64, BK], [BK, 64]
    b_q = tl.load(q + o_tt[:, None] * stride_q_t + i_hk * stride_q_h + o_k[None, :],
                  mask=m_t[:, None] & m_k[None, :], other=0.)
    b_k = tl.load(k + o_tt[None, :] * stride_k_t + i_hk * stride_k_h + o_k[:, None],
                  mask=m_k[:, None] & m_t[None, :], other=0.)
    # [BK, BV], [64, BV]
    b_h = tl.load(hb + (i_c.to(tl.int64) * HV + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :],
                  mask=m_k[:, None] & m_v[None, :], other=0.)
    b_v = tl.load(vn + (o_tt * HV + i_h)[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.)
    # [64]
    b_g = tl.cumsum(tl.load(g + o_tt * stride_g_t + i_h, mask=m_t, other=0.), 0)
    # the norms scale rows and columns of the fp32 products, not the operands (k's from the WY kernel)
    b_sq = b_g * 0 + scale
    if USE_L2NORM:
        b_sq = b_sq * tl.rsqrt(tl.sum(b_q.to(tl.float32) * b_q.to(tl.float32), 1) + 1e-6)
    b_sk = tl.load(kn + o_tt * HV + i_h, mask=m_t, other=0.)
    # [64, 64]: causal q k^T * decay; above the diagonal the exponent is > 0: clamped, then masked
    b_a = tl.dot(b_q, b_k) * b_sk[None, :]
    b_a = tl.where(o_t[:, None] >= o_t[None, :], b_a * tl.exp(tl.minimum(b_g[:, None] - b_g[None, :], 0.)), 0.)
    b_o = tl.dot(b_q, b_h) * tl.exp(b_g)[:, None] + tl.dot(b_a.to(DT), b_v)
    b_o = b_o * b_sq[:, None]
    tl.store(o + o_tt[:, None] * stride_o_t + i_h * stride_o_h + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])
