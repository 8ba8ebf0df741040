"""Skinny dense linear: ``y = x @ w^T (+ bias)`` for few rows (1-32 at sm_90's table) and at most a few hundred output columns, in one
launch (twin: ``skinny.naive.skinny_linear``).

The projections AWQ leaves in fp16 (the 27B's GDN ``in_proj_ba``, 5120 -> 96; the 35B-A3B's router + shared-expert
gate, 2048 -> 257, and ``in_proj_ba``, 2048 -> 64) are 0.25-1 MB of weight. At decode sizes cuBLAS runs them as a
split-K GEMM plus a separate reduce launch, 6.9 us a GDN layer at 32 rows on the H100 (bench/NOTES.md, session 20),
where reading the weight once takes well under 1 us. Here each program does one K slice of a [BM, BN] tile on
``tl.dot`` (fp32), stores its partial, and the last split of the tile to arrive at an acq_rel counter sums every
split's partial in split order, adds the bias and writes y: a fixed order, so the same bits on every call whoever
came last; the counter is re-armed to zero, so a CUDA graph replays the launch as it is. The counters belong to the
weight (``models/linear.py:SkinnyCounters``, sized by ``skinny_counters``).

Only the sm_90 row has a table: on sm_70 Triton lowers ``tl.dot`` to FMA, and sm_80 is unmeasured; both keep cuBLAS.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ...errors import KernelContractError
from ..common.aot import AotConfig
from ..common.arch import INTERPRET, arch_key, device_key
from ..common.splitk import pick_split, whole_split
from ..w4a16.gemm import mma

MAX_SPLIT = 16           # K splits of one tile at most: the last program's reduce issues this many loads unrolled
ROW_BLOCKS = (16, 32, 64)   # BM: tl.dot's 16-row minimum up to the table's max_m


@dataclass(frozen=True)
class SkinnyTable:
    max_m: int      # rows at most
    max_n: int      # output columns at most
    bn: int         # columns a program
    bk: int         # k a step; a split is whole steps
    k_min: int      # K below this: cuBLAS (too few k steps to split)
    warps: int
    stages: int


# 32 columns a program and a split toward one program an SM (42 programs on the 27B's in_proj_ba: 3 column tiles x 14
# splits; 72 on the 35B-A3B's router), 8 KB of weight a 128-deep step, 3 steps in flight; K under 3 steps (384) is too
# little to split. Rows stop at 32: on the H200 the kernel beat cuBLAS at 1-32 rows on the model shapes but lost at 64
# (bench/bench_skinny.py; bench/NOTES.md, session 22)
TABLES = {
    "sm70": None,
    "sm80": None,
    "sm90": SkinnyTable(max_m=32, max_n=512, bn=32, bk=128, k_min=384, warps=4, stages=3),
}


@triton.jit
def _store_y(b_y, bias_ptr, y_ptr, o_m, o_n, m_n, m_mn, stride_ym, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        # [BN]
        b_y += tl.load(bias_ptr + o_n, mask=m_n, other=0).to(tl.float32)[None, :]
    tl.store(y_ptr + o_m[:, None] * stride_ym + o_n[None, :], b_y.to(y_ptr.dtype.element_ty), mask=m_mn)


@triton.jit
def skinny_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                  n_split, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MAX_SPLIT: tl.constexpr,
                  SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, INTERPRET: tl.constexpr):
    """Program (column tile i_n, K split i_s, row tile i_m): x [M, K] rows of stride_xm, w [N, K] rows of stride_wn.
    SPLIT (n_split > 1): fp32 partials to part_ptr [n_split, M, N] and one zeroed int32 at count_ptr per (row
    tile, column tile); unsplit, y directly. The launcher's split leaves no split empty."""
    i_n, i_s, i_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    o_k = tl.arange(0, BK)
    m_m, m_n = o_m < M, o_n < N
    m_mn = m_m[:, None] & m_n[None, :]
    # whole BK steps a split, so only K's last step is partial
    kb_per = tl.cdiv(tl.cdiv(K, BK), n_split)
    k_beg = i_s * kb_per * BK
    k_end = tl.minimum(k_beg + kb_per * BK, K)
    p_x = x_ptr + o_m[:, None] * stride_xm + o_k[None, :]
    p_w = w_ptr + o_n[None, :] * stride_wn + o_k[:, None]
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(k_beg, k_end, BK):
        m_k = k0 + o_k < K
        # [BM, BK]
        b_x = tl.load(p_x + k0, mask=m_m[:, None] & m_k[None, :], other=0.)
        # [BK, BN]
        b_w = tl.load(p_w + k0, mask=m_k[:, None] & m_n[None, :], other=0.)
        acc = mma(b_x, b_w, acc, INTERPRET)
    if not SPLIT:
        _store_y(acc, bias_ptr, y_ptr, o_m, o_n, m_n, m_mn, stride_ym, HAS_BIAS)
    else:
        o_p = o_m[:, None] * N + o_n[None, :]
        tl.store(part_ptr + i_s * M * N + o_p, acc, mask=m_mn)
        # every thread's partial stores before the release (the atomic is issued by one thread)
        tl.debug_barrier()
        p_count = count_ptr + i_m * tl.num_programs(0) + i_n
        arrived = tl.atomic_add(p_count, 1, sem="acq_rel", scope="gpu")
        if arrived == n_split - 1:
            b_y = tl.zeros([BM, BN], tl.float32)
            # unrolled, so every split's load is in flight at once; summed in split order whoever came last.
            # .cg: from L2, where the other programs' partials are, never a stale L1 line. The split mask is a
            # [BM, BN] tensor: the interpreter refuses a scalar bool in a mask
            for j in tl.static_range(MAX_SPLIT):
                # [BM, BN]
                b_y += tl.load(part_ptr + j * M * N + o_p, mask=m_mn & (j + 0 * o_p < n_split), other=0.,
                               cache_modifier=".cg")
            _store_y(b_y, bias_ptr, y_ptr, o_m, o_n, m_n, m_mn, stride_ym, HAS_BIAS)
            tl.atomic_xchg(p_count, 0, sem="relaxed", scope="gpu")


# ---------------------------------------------------------------- launch arithmetic
def row_block(m: int) -> int:
    """BM for m rows: the smallest row block that holds them (one row tile up to the last block)."""
    return next((bm for bm in ROW_BLOCKS if m <= bm), ROW_BLOCKS[-1])


def skinny_split(m: int, n: int, k: int, table: SkinnyTable, sms: int) -> int:
    """K splits for an [m, k] x [k, n] call: toward one program an SM over the output tiles, each split whole
    bk steps, at most MAX_SPLIT, none empty (splitk.pick_split)."""
    tiles = triton.cdiv(m, row_block(m)) * triton.cdiv(n, table.bn)
    return pick_split(tiles, triton.cdiv(k, table.bk), 1, sms, MAX_SPLIT)


def counters_needed(m: int, n: int, k: int, table: SkinnyTable, sms: int) -> int:
    """Arrival counters a call of m rows uses: one per (row tile, column tile) when it splits K, else none."""
    if skinny_split(m, n, k, table, sms) == 1:
        return 0
    return triton.cdiv(m, row_block(m)) * triton.cdiv(n, table.bn)


def counters_for(n: int, k: int, table: SkinnyTable, sms: int) -> int:
    """Arrival counters that serve a weight [n, k] at every row count the table takes."""
    return max(counters_needed(m, n, k, table, sms) for m in range(1, table.max_m + 1))


def check_skinny(x, w, bias, counters) -> None:
    """The op's contract, whichever path then runs: x [..., K], w [N, K], bias [N] contiguous, one dtype; counters
    int32 (or None). Raises KernelContractError naming what is off."""
    ok = (w.dim() == 2 and x.dim() >= 1 and x.shape[-1] == w.shape[1] and x.dtype == w.dtype
          and (bias is None or (bias.shape == (w.shape[0],) and bias.dtype == x.dtype and bias.is_contiguous()))
          and (counters is None or counters.dtype == torch.int32))
    if not ok:
        raise KernelContractError(
            f"skinny_linear: x [..., K], w [N, K], bias [N] contiguous, all one dtype, counters int32; got x "
            f"{x.dtype} {tuple(x.shape)}, w {w.dtype} {tuple(w.shape)}, bias "
            f"{None if bias is None else (bias.dtype, tuple(bias.shape), bias.stride())}, counters "
            f"{None if counters is None else counters.dtype}")


def skinny_applies(x, w) -> bool:
    """Whether the kernel takes x [..., K] @ w [N, K]^T on x's device: its row has a table (sm_90; the
    interpreter runs CPU tensors as sm_90), fp16/bf16, 1..max_m rows, N <= max_n, K >= k_min, w's rows unit
    stride. Else cuBLAS (F.linear) runs it."""
    table = TABLES[device_key(x.device)[0]]
    if table is None or not (x.is_cuda or INTERPRET) or x.dtype not in (torch.float16, torch.bfloat16):
        return False
    n, k = w.shape
    return (w.dtype == x.dtype and w.stride(1) == 1 and 0 < x.numel() // max(k, 1) <= table.max_m
            and n <= table.max_n and k >= table.k_min)


# ---------------------------------------------------------------- the op
def skinny_linear(x, w, bias=None, counters=None):
    """Triton twin of :func:`catengine.kernels.skinny.naive.skinny_linear`: the kernel where ``skinny_applies``,
    else cuBLAS; also cuBLAS where the call splits K and ``counters`` are missing or short (the weight's first
    call came inside a CUDA graph capture, where none may be allocated)."""
    check_skinny(x, w, bias, counters)
    if not skinny_applies(x, w):
        return F.linear(x, w, bias)
    key, sms = device_key(x.device)
    table = TABLES[key]
    n, k = w.shape
    needed = counters_needed(x.numel() // k, n, k, table, sms)
    if needed > (0 if counters is None else counters.numel()):
        return F.linear(x, w, bias)
    return skinny_linear_with(x, w, bias, counters, table)


def skinny_counters(w):
    """Triton twin of :func:`catengine.kernels.skinny.naive.skinny_counters`."""
    key, sms = device_key(w.device)
    table = TABLES[key]
    if table is None or not (w.is_cuda or INTERPRET) or w.dim() != 2:
        return 0
    n, k = w.shape
    if n > table.max_n or k < table.k_min:
        return 0
    return counters_for(n, k, table, sms)


def skinny_linear_with(x, w, bias, counters, table: SkinnyTable, split: int | None = None):
    """The kernel on ``table``'s tiles, split K ``split`` ways (None: ``skinny_split``'s); the tests and the
    benchmark's sweep pass their own. Needs fp16/bf16 and, when split, ``counters`` with a zeroed int32 per (row
    tile, column tile), which it leaves zero. Any row count runs (row tiles of 64 past 64 rows): the table's max_m
    bounds only where the dispatch sends calls."""
    check_skinny(x, w, bias, counters)
    n, k = w.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if x.dtype not in (torch.float16, torch.bfloat16) or w.stride(1) != 1:
        raise KernelContractError(f"skinny_linear_with: fp16/bf16 and w rows of unit stride; got {x.dtype}, "
                                  f"w stride {w.stride()}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*x.shape[:-1], n)
    n_kb = triton.cdiv(k, table.bk)
    if split is None:
        split = skinny_split(m, n, k, table, device_key(x.device)[1])
    elif split != whole_split(split, n_kb, MAX_SPLIT):
        raise KernelContractError(f"skinny_linear_with: split {split} of {n_kb} k steps leaves a split empty or "
                                  f"passes MAX_SPLIT {MAX_SPLIT}")
    bm = row_block(m)
    grid = (triton.cdiv(n, table.bn), split, triton.cdiv(m, bm))
    part = count = y
    if split > 1:
        if counters is None or counters.numel() < grid[0] * grid[2]:
            raise KernelContractError(f"skinny_linear_with: {split} splits need {grid[0] * grid[2]} zeroed int32 "
                                      f"counters; got {None if counters is None else counters.numel()}")
        part, count = torch.empty((split, m, n), dtype=torch.float32, device=x.device), counters
    skinny_kernel[grid](x2, w, bias if bias is not None else y, y, part, count, m, n, k, x2.stride(0), w.stride(0),
                        y.stride(0), split, BM=bm, BN=table.bn, BK=table.bk, MAX_SPLIT=MAX_SPLIT, SPLIT=split > 1,
                        HAS_BIAS=bias is not None, INTERPRET=INTERPRET, num_warps=table.warps, num_stages=table.stages)
    return y.reshape(*x.shape[:-1], n)


# ---------------------------------------------------------------- ahead-of-time list
_ARGS = ("x_ptr w_ptr bias_ptr y_ptr part_ptr count_ptr M N K stride_xm stride_wn stride_ym n_split "
         "BM BN BK MAX_SPLIT SPLIT HAS_BIAS INTERPRET").split()


def aot_configs(cc: int) -> list[AotConfig]:
    """Each row block, split and unsplit (n_split the constant 1 as launched), with and without bias, fp16 and bf16;
    none where the row has no table (sm_70, sm_80)."""
    table = TABLES[arch_key(cc)]
    if table is None:
        return []
    out = []
    for dt in ("fp16", "bf16"):
        types = {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "bias_ptr": f"*{dt}", "y_ptr": f"*{dt}", "part_ptr": "*fp32",
                 "count_ptr": "*i32"}
        sig = {a: types.get(a, "i32") if i < _ARGS.index("BM") else "constexpr" for i, a in enumerate(_ARGS)}
        for bm in ROW_BLOCKS:
            for split, bias in ((1, False), (4, False), (4, True)):
                out.append(AotConfig("skinny_kernel", sig, dict(BM=bm, BN=table.bn, BK=table.bk, MAX_SPLIT=MAX_SPLIT,
                                                                SPLIT=split > 1, HAS_BIAS=bias, INTERPRET=False),
                                     table.warps, table.stages, f"skinny {dt} BM {bm} split {split}{' bias' * bias}",
                                     divisible_by_16=("K", "stride_xm", "stride_wn"),
                                     ones=("n_split",) if split == 1 else ()))
    return out
