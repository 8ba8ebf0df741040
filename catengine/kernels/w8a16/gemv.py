"""W8A16 GEMV / skinny GEMM for the lm_head rows (twin: ``w8a16.naive.w8a16_linear``).

One program per (BM rows, BN output channels): it streams its [BN, K] int8 slab once, converts it to the
activation dtype in registers (int8 values are exact in fp16 and bf16) and multiplies on the tensor cores
with fp32 accumulation; the per-channel scale multiplies the finished dot product. The M blocks are the
fastest grid axis, so for M > BM the programs sharing a weight slab run side by side and its second read
hits L2. For one or two rows the dot's 16-row minimum would pad the MMA with zeros; the FMA form
(``DOT=False``: a [BN, BK] weight tile times each row, reduced along K) skips that.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import KernelContractError
from ..common.aot import AotConfig

BN, BK = 128, 128
FMA_MAX_ROWS = 2     # rows handled by the FMA form (see the module docstring)


@triton.jit
def w8a16_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_ym, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, DOT: tl.constexpr):
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
        if DOT:
            b_acc += tl.dot(b_x, tl.trans(b_w.to(b_x.dtype)))
        else:
            b_wf = b_w.to(tl.float32)
            for i in tl.static_range(BM):
                # row i of x against the tile: [BN]
                b_xi = tl.sum(tl.where(tl.arange(0, BM)[:, None] == i, b_x, 0.), 0).to(tl.float32)
                b_row = tl.sum(b_wf * b_xi[None, :], 1)
                b_acc += tl.where(tl.arange(0, BM)[:, None] == i, b_row[None, :], 0.)
    b_s = tl.load(s_ptr + o_n, mask=m_n, other=0.).to(tl.float32)
    p_y = y_ptr + o_m.to(tl.int64)[:, None] * stride_ym + o_n[None, :]
    tl.store(p_y, b_acc * b_s[None, :], mask=m_m[:, None] & m_n[None, :])


def block_m(m: int) -> int:
    """Rows per program: the FMA form's 1-2, else the dot's 16 up to 64 (the weight is read once per 64)."""
    return triton.next_power_of_2(m) if m <= FMA_MAX_ROWS else min(64, max(16, triton.next_power_of_2(m)))


def w8a16_linear(x, qweight, scales):
    """Triton twin of :func:`catengine.kernels.w8a16.naive.w8a16_linear` (same signature)."""
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
    bm = block_m(m)
    w8a16_kernel[(triton.cdiv(m, bm), triton.cdiv(n, BN))](x, qweight, scales, y, m, n, k, x.stride(0), y.stride(0),
                                                          BM=bm, BN=BN, BK=BK, DOT=m > FMA_MAX_ROWS,
                                                          num_warps=4 if bm <= 16 else 8, num_stages=3)
    return y


_ARGS = "x_ptr w_ptr s_ptr y_ptr M N K stride_xm stride_ym BM BN BK DOT"


def aot_configs(cc: int) -> list[AotConfig]:
    """Every block_m the launcher picks (1, 2, 16, 32, 64), each activation dtype the architecture has."""
    out = []
    for dt in ("fp16",) + (("bf16",) if cc >= 80 else ()):
        ty = {"x_ptr": f"*{dt}", "w_ptr": "*i8", "s_ptr": f"*{dt}", "y_ptr": "*fp32"}
        sig = {a: ty.get(a, "constexpr" if a in ("BM", "BN", "BK", "DOT") else "i32") for a in _ARGS.split()}
        for bm in (1, 2, 16, 32, 64):
            out.append(AotConfig("w8a16_kernel", sig, dict(BM=bm, BN=BN, BK=BK, DOT=bm > FMA_MAX_ROWS),
                                 4 if bm <= 16 else 8, 3, f"w8a16 {dt} BM{bm}", ("K", "stride_xm", "stride_ym")))
    return out
