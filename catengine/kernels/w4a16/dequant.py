"""Large-M W4A16 linear: dequantise the weight once with a Triton kernel, then one cuBLAS fp16/bf16 GEMM.

Past a few thousand rows a W4A16 layer is compute bound and the 4-bit weight's bytes no longer matter;
what matters is the tensor-core rate. cuBLAS reaches it on every architecture (on sm_70 too, where
Triton's mma pipeline is weakest), while our fused Triton GEMM spends part of each K-tile moving the
dequantised weight into the MMA layout. Writing the dense weight costs ``K * N * 2`` bytes per call:
for Qwen3.5-27B's gate_up (5120 x 34816) 356 MB, about 0.1 ms at H200 bandwidth, against ~4 ms of
GEMM at M = 8192. The dense copy is a transient activation-sized buffer (the profiled step, which runs
``max_num_batched_tokens`` rows, includes it in the memory plan).

:func:`w4a16_linear` here is the one CUDA implementation of the ``w4a16_linear`` op (``ops.w4a16_linear``
calls it): rows >= the arch table's threshold go this way, the rest to
:func:`catengine.kernels.w4a16.gemm.fused_w4a16_linear` (GEMV / GEMM with the dequantisation fused in).
The dequantisation twin is ``w4a16.naive.w4a16_dequantize``; the result is bit-identical to it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import ConfigError, KernelContractError
from ..common.aot import AotConfig
from ..common.arch import arch_key, device_key
from .packing import QuantizedWeight
from . import gemm

# rows from which dequantise + cuBLAS beats the fused kernel. H200 (bench/bench_w4a16_prefill.py, 27B shapes):
# at M = 256 it is 0.55-0.58x cuBLAS fp16 against the fused 0.35-0.57x (qkv 3% behind), from 1024 rows
# 0.80-0.86x and from 2048 0.90-1.03x. sm_70/sm_80 are unmeasured: they keep the conservative 1024.
DEQUANT_MIN_M = {"sm70": 1024, "sm80": 1024, "sm90": 256}
BLOCK_N = 128


@triton.jit
def w4a16_dequant_kernel(qw_ptr, s_ptr, z_ptr, w_ptr, N, G: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (i_g, i_n): the G rows of quantisation group i_g (G // 8 packed rows) for BLOCK_N columns."""
    i_g, i_n = tl.program_id(0), tl.program_id(1)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    o_r = i_g * (G // 8) + tl.arange(0, G // 8)
    # [G // 8, BLOCK_N]
    b_q = tl.load(qw_ptr + o_r.to(tl.int64)[:, None] * N + o_n[None, :], mask=m_n[None, :], other=0)
    # [BLOCK_N] each: the group's scale and zero point
    b_s = tl.load(s_ptr + i_g.to(tl.int64) * N + o_n, mask=m_n, other=0).to(tl.float32)
    b_z = tl.load(z_ptr + i_g.to(tl.int64) * N + o_n, mask=m_n, other=0).to(tl.float32)
    o_i = tl.arange(0, 8)
    # [G // 8, 8, BLOCK_N] -> [G, BLOCK_N]: row 8r + i holds nibble i of packed row r
    b_nib = (b_q[:, None, :] >> (4 * o_i)[None, :, None]) & 0xF
    b_w = (b_nib.to(tl.float32) - b_z[None, None, :]) * b_s[None, None, :]
    b_w = tl.reshape(b_w, (G, BLOCK_N))
    o_k = i_g.to(tl.int64) * G + tl.arange(0, G)
    tl.store(w_ptr + o_k[:, None] * N + o_n[None, :], b_w.to(w_ptr.dtype.element_ty), mask=m_n[None, :])


def dequantize(weight: QuantizedWeight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Triton twin of :func:`catengine.kernels.w4a16.naive.w4a16_dequantize`: [K, N] dense weight (x @ w)."""
    if weight.qweight.dim() != 2:
        raise KernelContractError("w4a16 dequantize takes one weight matrix (no stacked experts)")
    g = weight.group_size
    if g % 8 or g & (g - 1):
        raise ConfigError(f"W4A16 group size {g} is not supported by the dequantise kernel; use 32, 64 or 128")
    k, n = weight.in_features, weight.out_features
    out = torch.empty((k, n), dtype=dtype or weight.dtype, device=weight.qweight.device)
    if k and n:
        w4a16_dequant_kernel[(k // g, triton.cdiv(n, BLOCK_N))](
            weight.qweight.contiguous(), weight.scales.contiguous(), weight.zeros.contiguous(), out, n,
            G=g, BLOCK_N=BLOCK_N, num_warps=4)
    return out


def w4a16_linear(x, weight: QuantizedWeight, bias=None):
    """Triton twin of :func:`catengine.kernels.w4a16.naive.w4a16_linear` for every M: dequantise + cuBLAS
    from ``DEQUANT_MIN_M`` rows, else the fused GEMV / GEMM kernels."""
    gemm.check_input(x, weight)
    rows = x.numel() // max(x.shape[-1], 1)
    key, _ = device_key(x.device)
    if rows < DEQUANT_MIN_M[key]:
        return gemm.fused_w4a16_linear(x, weight, bias)
    w = dequantize(weight, x.dtype)
    y = torch.matmul(x, w)
    return y if bias is None else y.add_(bias.to(y.dtype))




def aot_configs(cc: int) -> list[AotConfig]:
    """Every group size with the arch's model dtype (fp16 on sm_70, bf16 and fp16 on sm_80+)."""
    dtypes = ("fp16",) if arch_key(cc) == "sm70" else ("fp16", "bf16")
    out = []
    for dt in dtypes:
        for g in (32, 64, 128):
            sig = {"qw_ptr": "*i32", "s_ptr": f"*{dt}", "z_ptr": f"*{dt}", "w_ptr": f"*{dt}", "N": "i32",
                   "G": "constexpr", "BLOCK_N": "constexpr"}
            out.append(AotConfig("w4a16_dequant_kernel", sig, dict(G=g, BLOCK_N=BLOCK_N), 4, 1,
                                 f"dequant {dt} g{g}"))
    return out
