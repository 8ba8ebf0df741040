"""W8A16 GEMV / skinny GEMM for the lm_head rows (twin: ``w8a16.naive.w8a16_linear``).

One program per (BM rows, BN output channels): it streams its [BN, K] int8 slab once, converts it to the
activation dtype in registers (int8 values are exact in fp16 and bf16) and multiplies on the tensor cores
with fp32 accumulation (rows past M are masked to zero: the dot's 16-row minimum pads one-row decodes); the
per-channel scale multiplies the finished dot product. The M blocks are the fastest grid axis, so for
M > BM the programs sharing a weight slab run side by side and its second read hits L2.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...errors import KernelContractError
from ..common.aot import AotConfig


@dataclass(frozen=True)
class W8A16Config:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int


# (most rows, config), first match; bench_lm_head.py --sweep times the candidates (bench/NOTES.md, thr).
# H200, first run: BM 16 / BN 128 / BK 128 / 4 warps / 3 stages reached 0.76 of copy bandwidth at M = 8 and
# BM 32 / 8 warps 0.58 at M = 32
CONFIGS: tuple[tuple[int | None, W8A16Config], ...] = (
    (16, W8A16Config(16, 128, 128, 4, 3)),
    (32, W8A16Config(32, 128, 128, 8, 3)),
    (None, W8A16Config(64, 128, 128, 8, 3)),
)


def pick(m: int) -> W8A16Config:
    return next(c for max_m, c in CONFIGS if max_m is None or m <= max_m)


@triton.jit
def w8a16_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_ym, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr):
    i_m, i_n = tl.program_id(0), tl.program_id(1)
    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    o_k = tl.arange(0, BK)
    m_m, m_n = o_m < M, o_n < N
    p_w = w_ptr + o_n.to(tl.int64)[:, None] * K + o_k[None, :]
    p_x = x_ptr + o_m.to(tl.int64)[:, None] * stride_xm + o_k[None, :]
    b_acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        m_k = k0 + o_k < K
        # [BN, BK] int8, [BM, BK] activations
        b_w = tl.load(p_w + k0, mask=m_n[:, None] & m_k[None, :], other=0)
        b_x = tl.load(p_x + k0, mask=m_m[:, None] & m_k[None, :], other=0.)
        b_acc += tl.dot(b_x, tl.trans(b_w.to(b_x.dtype)))
    b_s = tl.load(s_ptr + o_n, mask=m_n, other=0.).to(tl.float32)
    p_y = y_ptr + o_m.to(tl.int64)[:, None] * stride_ym + o_n[None, :]
    tl.store(p_y, b_acc * b_s[None, :], mask=m_m[:, None] & m_n[None, :])


def w8a16_linear(x, qweight, scales):
    """Triton twin of :func:`catengine.kernels.w8a16.naive.w8a16_linear` (same signature)."""
    return w8a16_linear_with(x, qweight, scales, None)


def w8a16_linear_with(x, qweight, scales, cfg: W8A16Config | None):
    """w8a16_linear with an explicit launch (None: :func:`pick`'s); the benchmark's sweep tries others."""
    if x.dim() != 2 or qweight.dim() != 2 or x.shape[1] != qweight.shape[1] or qweight.dtype != torch.int8 or \
            scales.shape != (qweight.shape[0],) or x.dtype not in (torch.float16, torch.bfloat16):
        raise KernelContractError(f"w8a16_linear: x [M, K] fp16/bf16, qweight [N, K] int8, scales [N]; got x "
                                  f"{x.dtype} {tuple(x.shape)}, qweight {qweight.dtype} {tuple(qweight.shape)}, "
                                  f"scales {tuple(scales.shape)}")
    m, k = x.shape
    n = qweight.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    qweight = qweight if qweight.is_contiguous() else qweight.contiguous()
    y = torch.empty((m, n), dtype=torch.float32, device=x.device)
    if m == 0:
        return y
    c = cfg or pick(m)
    w8a16_kernel[(triton.cdiv(m, c.bm), triton.cdiv(n, c.bn))](x, qweight, scales, y, m, n, k, x.stride(0),
                                                              y.stride(0), BM=c.bm, BN=c.bn, BK=c.bk,
                                                              num_warps=c.warps, num_stages=c.stages)
    return y


_ARGS = "x_ptr w_ptr s_ptr y_ptr M N K stride_xm stride_ym BM BN BK"


def aot_configs(cc: int) -> list[AotConfig]:
    """Every configuration of CONFIGS, each activation dtype the architecture has."""
    out = []
    for dt in ("fp16",) + (("bf16",) if cc >= 80 else ()):
        ty = {"x_ptr": f"*{dt}", "w_ptr": "*i8", "s_ptr": f"*{dt}", "y_ptr": "*fp32"}
        sig = {a: ty.get(a, "constexpr" if a in ("BM", "BN", "BK") else "i32") for a in _ARGS.split()}
        for _, c in CONFIGS:
            out.append(AotConfig("w8a16_kernel", sig, dict(BM=c.bm, BN=c.bn, BK=c.bk), c.warps, c.stages,
                                 f"w8a16 {dt} {c}", ("K", "stride_xm", "stride_ym")))
    return out
