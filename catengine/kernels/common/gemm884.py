"""Plain fp16 GEMM ``c[M, N] = a[M, K] @ b[K, N]`` on the HMMA.884 building block (common/mma884.py): fp32
accumulation, fp16 out, masked M, N and K tails. It is the proof of the block on sm_70 (and, emulated, on the
H200); its torch twin is ``a.float() @ b.float()``.

sm_70 has no ``cp.async``, so the pipeline is the Volta one: the next tile's global loads are issued into
registers before the tensor cores consume the current tile from shared memory (one shared buffer per operand,
the membar pass puts the barriers between the stores and the fragment loads).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from catengine.errors import KernelContractError
from catengine.kernels.common.aot import AotConfig
from catengine.kernels.common.mma884 import (Tile884, a_layout, a_smem_shape, acc_rows_cols, b_layout, b_smem_shape,
                                             frag_layout, mma884, pick_tile, smem_layout, stage_index,
                                             stage_layout_a, stage_layout_b)


# sm_70 tiles: within 96 KB of shared memory (A + B staging is 2 * BK * (BM + BN) bytes) and 255 registers
# (BM * BN / (32 * num_warps) fp32 accumulators per lane: 128 here)
SM70_TABLE = (
    (64, Tile884(64, 64, 32, 2, 2)),
    (None, Tile884(128, 128, 32, 2, 2)),
)
# every configuration the AOT build checks (the table plus a wide 8-warp tile)
SM70_AOT = tuple(c for _, c in SM70_TABLE) + (Tile884(128, 256, 32, 2, 4),)


@gluon.jit
def gemm884_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, WM: gl.constexpr, WN: gl.constexpr):
    i_m = gl.program_id(0)
    i_n = gl.program_id(1)
    NW: gl.constexpr = WM * WN
    LA: gl.constexpr = stage_layout_a(NW)
    LB: gl.constexpr = stage_layout_b(NW)
    LF: gl.constexpr = frag_layout(WM, WN)
    MB: gl.constexpr = BM // 8
    NB: gl.constexpr = BN // 8

    # A staging [(step, mb), h, l, k]: row 8 mb + 4 h + l, k 8 step + k (the A fragment map of mma884.py)
    da, ha, la, ka = stage_index(BK // 8 * MB, LA)
    o_am = i_m * BM + 8 * (da % MB) + 4 * ha + la
    o_ak = 8 * (da // MB) + ka
    m_am = o_am < M
    p_a = a_ptr + o_am * stride_am + o_ak * stride_ak
    # B staging [(step, nb), h, l, k]: column 8 nb + 4 h + l, k 8 step + k
    db, hb, lb, kb = stage_index(BK // 8 * NB, LB)
    o_bn = i_n * BN + 8 * (db % NB) + 4 * hb + lb
    o_bk = 8 * (db // NB) + kb
    m_bn = o_bn < N
    p_b = b_ptr + o_bk * stride_bk + o_bn * stride_bn

    s_a = gl.allocate_shared_memory(gl.float16, a_smem_shape(BM, BK), smem_layout())
    s_b = gl.allocate_shared_memory(gl.float16, b_smem_shape(BK, BN), smem_layout())
    acc = gl.zeros([BM // 8, BN // 8, 2, 4, 8], gl.float32, layout=LF)

    # [BK//8 * BM//8, 2, 4, 8]
    b_a = gl.load(p_a, mask=m_am & (o_ak < K), other=0.0)
    # [BK//8 * BN//8, 2, 4, 8]
    b_b = gl.load(p_b, mask=m_bn & (o_bk < K), other=0.0)
    for k0 in range(0, K, BK):
        s_a.store(b_a)
        s_b.store(b_b)
        # the next tile's loads are in flight while the tensor cores work on this one (masked past K)
        k1 = k0 + BK
        b_a = gl.load(p_a + k1 * stride_ak, mask=m_am & (o_ak + k1 < K), other=0.0)
        b_b = gl.load(p_b + k1 * stride_bk, mask=m_bn & (o_bk + k1 < K), other=0.0)
        for j in gl.static_range(BK // 8):
            # [BM//8, 2, 4, 8] and [BN//8, 2, 4, 8] in the fragment maps
            f_a = s_a.slice(j * MB, MB).load(a_layout(WM, WN))
            f_b = s_b.slice(j * NB, NB).load(b_layout(WM, WN))
            acc = mma884(acc, gl.expand_dims(f_a, 1), gl.expand_dims(f_b, 0))

    rows, cols = acc_rows_cols(BM, BN, WM, WN)
    o_cm = i_m * BM + rows
    o_cn = i_n * BN + cols
    p_c = c_ptr + o_cm * stride_cm + o_cn * stride_cn
    gl.store(p_c, acc.to(gl.float16), mask=(o_cm < M) & (o_cn < N))


def gemm884(a: torch.Tensor, b: torch.Tensor, config: Tile884 | None = None) -> torch.Tensor:
    """c = a @ b on the tensor cores' m8n8k4 (fp16 in, fp32 accumulate, fp16 out). CUDA only: the Triton
    interpreter runs no Gluon and no inline PTX."""
    if a.dtype != torch.float16 or b.dtype != torch.float16:
        raise KernelContractError(f"gemm884 takes fp16 operands, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise KernelContractError(f"gemm884 needs a [M, K] and b [K, N], got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.device.type != "cuda" or b.device != a.device:
        raise KernelContractError(f"gemm884 runs on one CUDA device (Gluon has no interpreter), got {a.device}, "
                                  f"{b.device}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=torch.float16, device=a.device)
    if M == 0 or N == 0:
        return c
    cfg = config or pick_tile(SM70_TABLE, M)
    cfg.check()
    grid = (triton_cdiv(M, cfg.BM), triton_cdiv(N, cfg.BN))
    gemm884_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                         c.stride(1), BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, WM=cfg.WM, WN=cfg.WN,
                         num_warps=cfg.num_warps)
    return c


def triton_cdiv(x: int, y: int) -> int:
    return -(-x // y)


_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
        "stride_am": "i32", "stride_ak": "constexpr", "stride_bk": "i32", "stride_bn": "constexpr",
        "stride_cm": "i32", "stride_cn": "constexpr", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr",
        "WM": "constexpr", "WN": "constexpr"}


def aot_configs(cc: int) -> list[AotConfig]:
    """Every tile of the sm_70 table (and a wide one), for contiguous operands: Triton specialises unit strides
    to constants at run time, so the AOT build does the same."""
    out = []
    for c in SM70_AOT:
        c.check()
        out.append(AotConfig("gemm884_kernel", dict(_SIG),
                             dict(stride_ak=1, stride_bn=1, stride_cn=1, BM=c.BM, BN=c.BN, BK=c.BK, WM=c.WM, WN=c.WN),
                             c.num_warps, 1, f"gemm884 {c.BM}x{c.BN}x{c.BK} w{c.WM}x{c.WN}",
                             divisible_by_16=("N", "K", "stride_am", "stride_bk", "stride_cm")))
    return out
