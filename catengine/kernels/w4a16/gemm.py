"""Triton W4A16 linear: ``y = x @ dequant(W) (+ bias)`` for the canonical K-packed layout (packing.py).

Two kernels here, picked by M from a per-architecture table (and the tensor-core kernels below):

- ``w4a16_gemv_kernel`` (decode, M <= table's gemv_max_m; in :mod:`catengine.kernels.w4a16.gemv`,
  which describes its tiles and weight math): m_rows activation rows per program share each
  dequantised tile, packed half2 math in inline PTX for fp16 and fp32 mantissa-trick math for bf16
  and the interpreter, split-K so that even N = 5120 puts enough programs on the chip. On the H200
  (bench_gemm.py --gemv-m1 / --gemv-pick) the plain loop beat both a one-tile-ahead register
  prefetch (double registers, fewer warps) and Triton's cp.async pipelining (``tl.range(num_stages=
  3..4)``, 1.5-2.5x slower); the table holds the best of the tiles tried (64 x 512, 4 warps). On
  sm_90 each GEMV is a programmatic dependent launch (``pdl``): it fetches its first tile while the
  kernel before it runs out, which took the four 27B shapes at M = 1 from 93.3 to 75.7 us (graphs of
  8 or more back-to-back calls; bench/NOTES.md). At M = 2 two rows per program beat one (106 against
  127 us summed) and the GEMM; at M = 4 the GEMM wins by ~4%, hence gemv_max_m 2 on sm_90.
- ``_w4a16_gemm_kernel`` (M above that): ``tl.dot`` with the dequantised weight as the *first*
  operand (``acc[BN, BM] = W^T x^T``), so that on sm_90 the computed operand may sit in registers
  (wgmma takes only A from registers) while x streams into shared memory; a small M then costs a
  narrow wgmma N instead of a 64-row M tile. Dequant works on pairs: ``(w >> 4j) & 0x000F000F |
  0x64006400`` holds nibbles j and j+4 as the fp16 values ``1024 + q`` (``128 + q`` in bf16).

On sm_80/90, fp16 GEMMs of gemv_max_m < M <= the row's ``mma`` bound go to ``w4a16_gemm_mma`` (gemm_mma.py:
Gluon, mma.sync m16n8k16 with the weight dequantised in registers as the A operand): on the H100 it beat this
module's tl.dot GEMM 1.2-1.5x at M = 4-16 and lost above 24 rows (bench/NOTES.md), hence the bound. On sm_90 the
rows above it up to the ``wgmma`` bound go to ``w4a16_gemm_wgmma`` (gemm_wgmma.py: the same registers as wgmma's A
operand, x from shared memory): 1.3x the mma kernel at 24 rows and 1.3x tl.dot at 32 on the H100. Inside the mma
rows, the ``wgmma_split`` row sends a GEMM to wgmma when its pick there splits K (a long K over few columns).
On the sm_70 row, fp16 GEMMs from ``hmma_min_m`` rows on go to ``w4a16_gemm_sm70`` (gemm_sm70.py: Gluon,
HMMA.884), since Triton >= 3.3 lowers ``tl.dot`` to FMA there; ``_w4a16_gemm_kernel`` stays for sm_80/90, for
what the HMMA kernel does not tile, and as its twin in the interpreter (which runs no Gluon).

Split-K programs write fp32 partials that ``splitk_reduce_kernel`` sums in a fixed order (results
do not depend on scheduling) while adding the bias and casting. A GEMV row with ``fused_reduce`` skips
that launch: the last program of each tile to arrive at an acq_rel counter (``split_counters``, owned
by the weight) sums the partials in the same fixed order. The sm_90 row uses it (see the table's
comment); the sm_70 and sm_80 rows keep the reduce launch, as nothing timed it there.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import ConfigError, KernelContractError
from ..common.aot import AotConfig
from ..common.arch import INTERPRET, arch_key, device_key
from ..common.splitk import (REDUCE_BLOCK, pick_split, reduce_splits, split_partials,  # noqa: F401 (aot)
                             splitk_reduce_kernel)
from .packing import QuantizedWeight
from .gemv import w4a16_gemv_kernel
from .gemm_sm70 import w4a16_gemm_sm70
from .gemm_mma import MmaTile, mma_applies, pick_mma_tile, w4a16_gemm_mma
from .gemm_wgmma import WgmmaTile, pick_tile, w4a16_gemm_wgmma, wgmma_applies
from .launch import TABLES, ArchTable, block_k, gemv_rows_per_program, gemv_tile, split_counters


# ---------------------------------------------------------------- dequantisation helpers
@triton.jit
def _pair(b_q, J: tl.constexpr, b_zc, b_s, nib2, DT: tl.constexpr, F32_MATH: tl.constexpr):
    """Nibbles J and J+4 of b_q [BN, R] dequantised to DT: [BN, R, 2]."""
    if DT == tl.bfloat16:
        MAGIC: tl.constexpr = 0x43004300   # bf16 128.0 in both halves
    else:
        MAGIC: tl.constexpr = 0x64006400   # fp16 1024.0 in both halves
    b_v = ((b_q >> (4 * J)) & nib2) | MAGIC
    if F32_MATH:
        # a bf16's bits are the top half of the equal fp32
        b_p = tl.join((b_v << 16).to(tl.float32, bitcast=True), (b_v & -65536).to(tl.float32, bitcast=True))
    else:
        # the two halves of one int32, so the math below runs on b_v's register as a packed pair
        b_p = tl.join(b_v.to(tl.int16), (b_v >> 16).to(tl.int16)).to(DT, bitcast=True)
    # (magic + q) - (magic + z) is exact; one rounding in the product, as a dequantised fp16 weight has
    return ((b_p - b_zc[:, :, None]) * b_s[:, :, None]).to(DT)


@triton.jit
def dequant_tile(b_q, b_s, b_z, nib2, DT: tl.constexpr, INTERPRET: tl.constexpr):
    """K-packed int32 [BN, R] with scales/zeros [BN, R] (any float dtype) -> W^T [BN, 8R] in DT.

    join() adds an innermost dimension held by one thread, so every int32's eight values stay in
    its thread; the nesting makes the flattened index 4*c1 + 2*c2 + c3 equal the nibble index.
    nib2 is 0x000F000F passed at run time (see fma_tile). The interpreter stores bf16 as raw
    uint16 and cannot do arithmetic on it, so there (INTERPRET) bf16 math runs in fp32; the result
    is the same, one rounding."""
    F32_MATH: tl.constexpr = INTERPRET and DT == tl.bfloat16
    if DT == tl.bfloat16:
        b_zc = b_z + 128.0
    else:
        b_zc = b_z + 1024.0
    if not F32_MATH:
        b_zc = b_zc.to(DT)
        b_s = b_s.to(DT)
    else:
        b_s = b_s.to(tl.float32)
    w04 = _pair(b_q, 0, b_zc, b_s, nib2, DT, F32_MATH)
    w15 = _pair(b_q, 1, b_zc, b_s, nib2, DT, F32_MATH)
    w26 = _pair(b_q, 2, b_zc, b_s, nib2, DT, F32_MATH)
    w37 = _pair(b_q, 3, b_zc, b_s, nib2, DT, F32_MATH)
    b_w = tl.join(tl.join(w04, w26), tl.join(w15, w37))
    return tl.reshape(b_w, (b_q.shape[0], b_q.shape[1] * 8))


@triton.jit
def mma(b_a, b_b, acc, INTERPRET: tl.constexpr):
    """tl.dot(b_a, b_b, acc); the interpreter multiplies bf16's raw bits, so there it goes via fp32."""
    if INTERPRET and b_a.dtype == tl.bfloat16:
        return tl.dot(b_a.to(tl.float32), b_b.to(tl.float32), acc)
    return tl.dot(b_a, b_b, acc)


# ---------------------------------------------------------------- kernels
@triton.jit
def _w4a16_gemm_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, part_ptr, M, N, K, stride_xm,
                       stride_ym, nib2, G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
                       HAS_BIAS: tl.constexpr, INTERPRET: tl.constexpr):
    DT: tl.constexpr = x_ptr.dtype.element_ty
    i_t, i_s = tl.program_id(0), tl.program_id(1)
    # programs that run together share GROUP_M row tiles, so each weight tile is fetched once per group
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    i_g = i_t // (GROUP_M * n_n)
    m_first = i_g * GROUP_M
    g_m = tl.minimum(n_m - m_first, GROUP_M)
    i_m = m_first + (i_t % (GROUP_M * n_n)) % g_m
    i_n = (i_t % (GROUP_M * n_n)) // g_m
    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    m_m, m_n = o_m < M, o_n < N
    o_r = tl.arange(0, BK // 8)
    o_k = tl.arange(0, BK)
    n_kb = K // BK
    kb_per = tl.cdiv(n_kb, SPLIT_K)
    kb_end = tl.minimum(kb_per * (i_s + 1), n_kb)
    acc = tl.zeros([BN, BM], tl.float32)
    for kb in range(kb_per * i_s, kb_end):
        k0 = kb * BK
        # [BN, BK // 8]
        b_q = tl.load(qw_ptr + (k0 // 8 + o_r)[None, :] * N + o_n[:, None], mask=m_n[:, None], other=0)
        # [BN, BK // 8]: one scale row per tile, read in b_q's shape so that it lands in b_q's
        # layout (a [BN] vector would need a shared-memory layout conversion every iteration)
        p_sz = (k0 // G) * N + o_n[:, None] + 0 * o_r[None, :]
        b_s = tl.load(s_ptr + p_sz, mask=m_n[:, None], other=0)
        b_z = tl.load(z_ptr + p_sz, mask=m_n[:, None], other=0).to(tl.float32)
        b_w = dequant_tile(b_q, b_s, b_z, nib2, DT, INTERPRET)
        # [BK, BM]
        b_x = tl.load(x_ptr + o_m[None, :] * stride_xm + (k0 + o_k)[:, None], mask=m_m[None, :], other=0)
        acc = mma(b_w, b_x, acc, INTERPRET)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + o_n, mask=m_n, other=0).to(tl.float32)[:, None]
        tl.store(y_ptr + o_m[None, :] * stride_ym + o_n[:, None], acc.to(DT), mask=m_n[:, None] & m_m[None, :])
    else:
        tl.store(part_ptr + (i_s * M + o_m[None, :]) * N + o_n[:, None], acc, mask=m_n[:, None] & m_m[None, :])


# ---------------------------------------------------------------- entry point
def check_input(x, weight: QuantizedWeight) -> None:
    """ConfigError unless x is fp16/bf16 with the weight's input features (every W4A16 entry point)."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ConfigError(f"w4a16_linear runs fp16/bf16 activations on CUDA, got {x.dtype}; "
                          "load the model with dtype float16 or bfloat16")
    if x.shape[-1] != weight.in_features:
        raise KernelContractError(f"w4a16_linear: x has {x.shape[-1]} input features, the weight {weight.in_features}")


def hmma_applies(table: ArchTable, m: int, x2, weight: QuantizedWeight) -> bool:
    """Whether the HMMA.884 kernel (gemm_sm70.py) takes this GEMM: the table's row asks for it from this M on,
    fp16 activations, a group it tiles (32/64/128), and a compiled run (the interpreter has no Gluon; the tl.dot
    kernel is its twin there)."""
    return (table.hmma_min_m is not None and m >= table.hmma_min_m and not INTERPRET
            and x2.dtype == torch.float16 and weight.dtype == torch.float16 and weight.group_size in (32, 64, 128)
            and weight.in_features % weight.group_size == 0 and weight.qweight.dim() == 2)


def mma_tile(table: ArchTable, m: int, x2, weight: QuantizedWeight) -> MmaTile | None:
    """The gemm_mma tile for m rows when the row's mma bounds take m and the kernel takes the operands (fp16,
    16-byte rows, groups 32-128; compiled runs only: the interpreter has no Gluon, tl.dot is its twin there)."""
    if INTERPRET or not mma_applies(x2, weight):
        return None
    return pick_mma_tile(table.mma, m)


def wgmma_tile(table: ArchTable, m: int, x2, weight: QuantizedWeight) -> tuple[WgmmaTile, ...] | None:
    """The gemm_wgmma candidate tiles (gemm_wgmma.pick_tile chooses per shape) for m rows past the mma rows when the
    row's wgmma bounds take m and the kernel takes the operands (mma_tile's conditions and N % 16 == 0)."""
    if INTERPRET or not wgmma_applies(x2, weight) or (table.mma and m <= table.mma[-1][0]):
        return None
    return pick_mma_tile(table.wgmma, m)


def split_wgmma_tile(table: ArchTable, m: int, x2, weight: QuantizedWeight, sms: int) -> tuple[WgmmaTile, int] | None:
    """(tile, split) in the mma rows when the table's ``wgmma_split`` row takes m and its wgmma pick splits K (a long
    K over few columns, where wgmma's extra programs beat the mma tile); else None (the mma tile runs)."""
    if not (tiles := pick_mma_tile(table.wgmma_split, m)) or INTERPRET or not wgmma_applies(x2, weight):
        return None
    tile, split = pick_tile(tiles, m, weight.out_features, weight.in_features, weight.group_size, sms)
    return (tile, split) if split > 1 else None


def fused_w4a16_linear(x, weight: QuantizedWeight, bias=None):
    """Triton twin of :func:`catengine.kernels.w4a16.naive.w4a16_linear`."""
    check_input(x, weight)
    k, n = weight.in_features, weight.out_features
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    qw, sc, zr = weight.qweight.contiguous(), weight.scales.contiguous(), weight.zeros.contiguous()
    key, sms = device_key(x.device)
    table = TABLES[key]
    g = weight.group_size
    b_arg = bias if bias is not None else y
    if m <= table.gemv_max_m:
        c = table.gemv
        r, sr = gemv_tile(c, k, g)
        # half2 math needs PTX (not the interpreter) and fp16; x is read as 8-byte words
        f16x2 = c.half2 and x.dtype == torch.float16 and not INTERPRET
        pdl = c.pdl and not INTERPRET
        if f16x2 and (x2.stride(0) % 4 or x2.data_ptr() % 8):
            # a fresh copy: contiguous() may return the same misaligned view (a single row)
            x2 = torch.empty((m, k), dtype=x2.dtype, device=x2.device).copy_(x2)
        mr = gemv_rows_per_program(c, m)
        tiles = triton.cdiv(n, c.BN) * triton.cdiv(m, mr)
        split = pick_split(tiles, k // (8 * r), c.waves, sms)
        part = split_partials(split, y)
        grid = (triton.cdiv(n, c.BN), split, triton.cdiv(m, mr))
        counters = (split_counters(weight, grid[0] * grid[2], grid[0] * max(4, table.gemv_max_m))
                    if split > 1 and c.fused_reduce else None)
        w4a16_gemv_kernel[grid](
            x2, qw, sc, zr, b_arg, y, part, m, n, k, x2.stride(0), y.stride(0), 15, split,
            part if counters is None else counters, G=g, BN=c.BN, R=r, SR=sr, MR=mr, SPLIT=split > 1,
            HAS_BIAS=bias is not None, PREFETCH=c.prefetch, F16X2=f16x2, ASM=not INTERPRET, STAGES=c.num_stages,
            FUSED_REDUCE=counters is not None, PDL=pdl, num_warps=c.num_warps, num_stages=c.num_stages,
            **({"launch_pdl": True} if pdl else {}))
        if counters is not None:
            return y.reshape(*lead, n)
    elif hmma_applies(table, m, x2, weight):
        return w4a16_gemm_sm70(x2, weight, bias).reshape(*lead, n)
    elif (pick := split_wgmma_tile(table, m, x2, weight, sms)) is not None:
        return w4a16_gemm_wgmma(x2, weight, bias, *pick).reshape(*lead, n)
    elif (tile := mma_tile(table, m, x2, weight)) is not None:
        return w4a16_gemm_mma(x2, weight, bias, tile).reshape(*lead, n)
    elif (tile := wgmma_tile(table, m, x2, weight)) is not None:
        return w4a16_gemm_wgmma(x2, weight, bias, tile).reshape(*lead, n)
    else:
        c = next(cfg for max_m, cfg in table.gemm if m <= max_m)
        bk = block_k(c.BK, g, k)
        tiles = triton.cdiv(m, c.BM) * triton.cdiv(n, c.BN)
        split = pick_split(tiles, k // bk, c.waves, sms) if c.waves > 1 else 1
        part = split_partials(split, y)
        _w4a16_gemm_kernel[(tiles, split)](
            x2, qw, sc, zr, b_arg, y, part, m, n, k, x2.stride(0), y.stride(0), 0x000F000F, G=g, BM=c.BM,
            BN=c.BN, BK=bk, SPLIT_K=split, GROUP_M=c.group_m, HAS_BIAS=bias is not None,
            INTERPRET=INTERPRET, num_warps=c.num_warps, num_stages=c.num_stages)
    return reduce_splits(part, bias, y, split).reshape(*lead, n)




# ---------------------------------------------------------------- ahead-of-time list
def _signature(dt: str, names: tuple, n_runtime: int) -> dict:
    """The first n_runtime names are pointers/ints, the rest constexprs."""
    types = {"x_ptr": f"*{dt}", "qw_ptr": "*i32", "s_ptr": f"*{dt}", "z_ptr": f"*{dt}",
             "bias_ptr": f"*{dt}", "y_ptr": f"*{dt}", "part_ptr": "*fp32", "count_ptr": "*i32"}
    return {a: types.get(a, "i32") if i < n_runtime else "constexpr" for i, a in enumerate(names)}


_GEMV_ARGS = ("x_ptr", "qw_ptr", "s_ptr", "z_ptr", "bias_ptr", "y_ptr", "part_ptr", "M", "N", "K",
              "stride_xm", "stride_ym", "nib", "n_split", "count_ptr", "G", "BN", "R", "SR", "MR", "SPLIT",
              "HAS_BIAS", "PREFETCH", "F16X2", "ASM", "STAGES", "FUSED_REDUCE", "PDL")
_GEMM_ARGS = _GEMV_ARGS[:12] + ("nib2", "G", "BM", "BN", "BK", "SPLIT_K", "GROUP_M", "HAS_BIAS", "INTERPRET")


def aot_configs(cc: int) -> list[AotConfig]:
    """Every configuration of this architecture's table (group 128 and, for the GEMM, 32), split and
    unsplit, each activation dtype the architecture has (no bf16 before sm_80)."""
    table = TABLES[arch_key(cc)]
    out = []
    for dt in ("fp16",) + (("bf16",) if cc >= 80 else ()):
        c = table.gemv
        # the rows per program w4a16_linear launches at each M up to gemv_max_m
        for mr, split, fused in sorted({(gemv_rows_per_program(c, m), split, fused)
                                        for m in range(1, table.gemv_max_m + 1)
                                        for split, fused in ((1, False), (4, False), (4, True))}):
            r, sr = gemv_tile(c, 5120, 128)
            out.append(AotConfig("w4a16_gemv_kernel", _signature(dt, _GEMV_ARGS, 15),
                                 dict(G=128, BN=c.BN, R=r, SR=sr, MR=mr, SPLIT=split > 1, HAS_BIAS=split == 1,
                                      PREFETCH=c.prefetch, F16X2=c.half2 and dt == "fp16", ASM=True,
                                      STAGES=c.num_stages, FUSED_REDUCE=fused, PDL=c.pdl),
                                 c.num_warps, c.num_stages,
                                 f"gemv {dt} rows{mr} split{split}{' fused reduce' * fused}"))
        for max_m, c in table.gemm:
            for g in (128, 32):
                split = 4 if c.waves > 1 else 1
                out.append(AotConfig("_w4a16_gemm_kernel", _signature(dt, _GEMM_ARGS, 13),
                                     dict(G=g, BM=c.BM, BN=c.BN, BK=block_k(c.BK, g, 4096),
                                          SPLIT_K=split, GROUP_M=c.group_m, HAS_BIAS=True,
                                          INTERPRET=False),
                                     c.num_warps, c.num_stages, f"gemm m<={max_m} {dt} g{g}"))
        reduce_sig = {"part_ptr": "*fp32", "bias_ptr": f"*{dt}", "y_ptr": f"*{dt}", "M": "i32",
                      "N": "i32", "stride_ym": "i32", "SPLIT_K": "constexpr", "BLOCK": "constexpr",
                      "HAS_BIAS": "constexpr", "TRIGGER": "constexpr"}
        out.append(AotConfig("splitk_reduce_kernel", reduce_sig,
                             dict(SPLIT_K=4, BLOCK=REDUCE_BLOCK, HAS_BIAS=True, TRIGGER=cc >= 90), 4, 1,
                             f"reduce {dt}"))
    return out
