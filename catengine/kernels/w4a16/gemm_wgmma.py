"""W4A16 for 17-64 rows on sm_90 tensor cores: ``y = x @ dequant(W) (+ bias)``, Gluon with ``wgmma`` (the warpgroup
MMA), for the canonical K-packed layout (packing.py), fp16 activations.

At 64 rows a 4-bit weight byte feeds 256 flops, about the H100's ratio of fp16 tensor-core peak to memory bandwidth;
mma.sync (gemm_mma.py) issues at half of wgmma's rate, so past ~24 rows only wgmma keeps up with the weight stream.
The weight is wgmma's A operand, taken from registers: 64 output columns per instruction and warpgroup, R of them per
program, dequantised in registers exactly as gemm_mma.py does (a lane's 8 k slots over two k = 16 steps get one
canonical int32's 8 consecutive k, as half2 (k, k+4) from lop3 / sub.f16x2 / mul.f16x2). x is the B operand (BT
tokens), read by the hardware from shared memory, where each program stores it once per quantisation group with k
in the same slot order (``int4_frag.permute_k``, four prmt per 16 bytes): one x tile in shared memory serves all 64 R
columns, where mma.sync's register B fragments served 16.

- rows: MMA row 64 b + 16 w + 8 h + g (rep b, warp w, half h, lane row g) is output column 2R (8 w + g) + 2 b + h of
  the tile, so a lane reads its 2R adjacent columns' codes, scales and zeros in one load per packed row.
- pipeline: the next group's codes, scales, zeros and x are loaded into registers while this group's wgmmas run
  (asynchronously, each group's KS = G / 32 of them chained); x goes to the other of two shared buffers once it
  arrives, and one wait + barrier per group frees the buffer this group read. A tile's ``roll`` also waits inside the
  group (at most ROLL steps in flight), trading some overlap for the registers of one more resident program.
Tensors of the A side are [4 w, R b, 8 g, 4 t, 2 j, 2 hi, 2 h, 2 e]: the fragment's logical k is 16 j + 8 hi + 2 t + e,
its physical k within the 32 is 8 t + 2 j + hi + 4 e.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from ...errors import KernelContractError
from ..common.aot import AotConfig
from ..common.arch import cuda_device, device_key, pdl_supported
from ..common.gdc import gdc_launch_dependents, gdc_wait
from ..common.int4_frag import permute_k
from ..common.mma884 import cta_barrier
from ..common.splitk import reduce_splits, split_partials, whole_split
from .gemm_mma import (dequant_rows_asm, mma_applies, pick_slot, register_a_operands, store_tile,
                       tile_index)
from .packing import QuantizedWeight


# ---------------------------------------------------------------- layouts
@gluon.constexpr_function
def frag_layout(R):
    """[4 w, R b, 8 g, 4 t, 2 j, 2 hi, 2 h, 2 e] fp16: a lane's 16 R A values in the order wgmma takes its registers
    (half2 register 4 j + 2 hi + h of rep b, e the half)."""
    return gl.BlockedLayout(size_per_thread=[1, R, 1, 1, 2, 2, 2, 2], threads_per_warp=[1, 1, 8, 4, 1, 1, 1, 1],
                            warps_per_cta=[4, 1, 1, 1, 1, 1, 1, 1], order=[7, 6, 5, 4, 1, 3, 2, 0])


@gluon.constexpr_function
def code_layout(R, KS):
    """[4 w, 8 g, 4 t, KS, 2 R] int32: a lane's codes of one group, its 2 R adjacent columns (one load) per k = 32 step."""
    return gl.BlockedLayout(size_per_thread=[1, 1, 1, KS, 2 * R], threads_per_warp=[1, 8, 4, 1, 1],
                            warps_per_cta=[4, 1, 1, 1, 1], order=[4, 3, 2, 1, 0])


@gluon.constexpr_function
def scale_layout(R):
    """[4 w, 8 g, 4 t, 2 R]: one group's scales (or zeros) of a lane's columns, the same for the 4 lanes t."""
    return gl.BlockedLayout(size_per_thread=[1, 1, 1, 2 * R], threads_per_warp=[1, 8, 4, 1],
                            warps_per_cta=[4, 1, 1, 1], order=[3, 2, 1, 0])


@gluon.constexpr_function
def x_layout(BT, KS):
    """[BT, KS, 4 t, 8] fp16 x of one group: 16 bytes (8 consecutive k) per lane, tokens across lanes and warps."""
    return gl.BlockedLayout(size_per_thread=[1, 1, 1, 8], threads_per_warp=[8, 1, 4, 1], warps_per_cta=[4, 1, 1, 1],
                            order=[3, 2, 1, 0])


@gluon.constexpr_function
def acc_layout(BT):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])


@gluon.constexpr_function
def a_layout(BT):
    return gl.DotOperandLayout(operand_index=0, parent=acc_layout(BT), k_width=2)


@gluon.constexpr_function
def x_smem_layout():
    """[BT, 32] fp16, one k = 32 step of x: 64-byte rows, the 64-byte swizzle wgmma reads K-major."""
    return gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)


# ---------------------------------------------------------------- register math
# one rep's two rows (h) of one k = 32 step, pack 16: $0..$7 the half2 A registers 4 j + 2 hi + h; $8..$23 the code (an
# int32 per element: $8 row 0, $10 row 1); $24..$31 1024 + zero and $32..$39 the scale, half2 (register r is row r % 2)
_DEQUANT_ASM = gl.constexpr(dequant_rows_asm("$8", "$10", "$24", "$25", "$32", "$33"))
_DEQUANT_CONSTRAINTS = gl.constexpr(",".join(["=r"] * 8 + ["r"] * 16 + ["r"] * 8 + ["r"] * 8))


@gluon.constexpr_function
def _keep(L, rank, dims):
    """L sliced down to the dims in ``dims`` (every other dim removed, highest first)."""
    for i in reversed(range(rank)):
        if i not in dims:
            L = gl.SliceLayout(i, L)
    return L


@gluon.jit
def _spread(v, R: gl.constexpr):
    """[4 w, 8 g, 4 t, 2 R] per-column values (column 2 b + h) -> [4, R, 8, 4, 2, 2, 2, 2] in frag_layout, row h's
    value in every element of its half (a register relabelling, then a broadcast: an inline-asm input must not keep
    a size-1 dim)."""
    L: gl.constexpr = frag_layout(R)
    v = gl.permute(gl.reshape(v, [4, 8, 4, R, 2]), [0, 3, 1, 2, 4])       # [4 w, R b, 8 g, 4 t, 2 h]
    v = gl.convert_layout(v, _keep(L, 8, (0, 1, 2, 3, 6)))
    v = gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 4), 5), 7)         # [4, R, 8, 4, 1, 1, 2, 1]
    v, _ = gl.broadcast(v, gl.full([4, R, 8, 4, 2, 2, 2, 2], 0, v.dtype, layout=L))
    return v


@gluon.jit
def dequant_a(q, zb, s, R: gl.constexpr, BT: gl.constexpr):
    """One k = 32 step: codes q, 1024 + zeros zb and scales s, each [4 w, 8 g, 4 t, 2 R] -> wgmma's A [64 R, 32] fp16
    (row 64 b + 16 w + 8 h + g, logical k 16 j + 8 hi + 2 t + e) in its register operand layout."""
    a = gl.inline_asm_elementwise(_DEQUANT_ASM, _DEQUANT_CONSTRAINTS, [_spread(q, R), _spread(zb, R), _spread(s, R)],
                                  dtype=gl.float16, is_pure=True, pack=16)
    a = gl.reshape(gl.permute(a, [1, 0, 6, 2, 4, 5, 3, 7]), [64 * R, 32])
    return gl.convert_layout(a, a_layout(BT))


@gluon.jit
def x_steps(xv, BT: gl.constexpr, KS: gl.constexpr):
    """x [BT, KS, 4 t, 8] fp16 (8 consecutive k per lane) -> [BT, 32, KS]: k of each k = 32 step in the A slot order
    (logical k 16 j + 8 hi + 2 t + e holds physical k 8 t + 2 j + hi + 4 e)."""
    xv = gl.reshape(permute_k(xv), [BT, KS, 4, 2, 2, 2])                  # slot 2 p + e is k p + 4 e, p = 2 j + hi
    return gl.reshape(gl.permute(xv, [0, 3, 4, 2, 5, 1]), [BT, 32, KS])


@gluon.jit
def store_x(x_smem, buf, xv, BT: gl.constexpr, KS: gl.constexpr):
    """x_steps' [BT, 32, KS] into buffer ``buf`` ([KS BT, 32]: KS tiles of [BT, 32]) in one store: one shared write
    for Triton's barrier analysis, where a store per tile drew a CTA barrier between tiles."""
    x_smem.index(buf).store(gl.reshape(gl.permute(xv, [2, 0, 1]), [KS * BT, 32]))


@gluon.jit
def w4a16_gemm_wgmma_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, part_ptr, M, N, K, stride_xm, stride_ym,
                            n_split, G: gl.constexpr, R: gl.constexpr, BT: gl.constexpr, SPLIT: gl.constexpr,
                            HAS_BIAS: gl.constexpr, PDL: gl.constexpr, ROLL: gl.constexpr):
    """x [M, K] fp16 (stride_xm); y [M, N] fp16, or (SPLIT) fp32 partials [n_split, M, N]. One warpgroup per program:
    64 R columns x BT tokens x one K split. The split count is a run-time value. PDL: as gemm_mma's (the first
    group's weights requested before the wait, x after it). ROLL >= 0: after each k = 32 step but the group's last,
    wait until at most ROLL wgmma ops are in flight, so ptxas can reuse the finished steps' A registers (R 1 BT 32
    110 -> 96 registers at ROLL 2, R 1 BT 64 149 -> 128 at 1, R 2 BT 64 232 -> 168 at 0: one more program an SM);
    -1: no wait before the group's end."""
    if PDL:
        gdc_launch_dependents()
    i_m, i_n, i_s = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    KS: gl.constexpr = G // 32
    LQ: gl.constexpr = code_layout(R, KS)
    LS: gl.constexpr = scale_layout(R)
    LX: gl.constexpr = x_layout(BT, KS)
    n_g = K // G
    g_per = gl.cdiv(n_g, n_split)
    k_begin = g_per * i_s * G
    k_end = gl.minimum(g_per * (i_s + 1), n_g) * G
    c0 = i_n * 64 * R

    # codes [4 w, 8 g, 4 t, KS, 2 R]: column c0 + 2 R (8 w + g) + c, packed row (k / 8) = 4 ks + t
    o_qn = c0 + 2 * R * (8 * tile_index(4, LQ, 5, 0) + tile_index(8, LQ, 5, 1)) + tile_index(2 * R, LQ, 5, 4)
    o_qr = 4 * tile_index(KS, LQ, 5, 3) + tile_index(4, LQ, 5, 2)
    m_q = (o_qn < N) & (o_qr >= 0)
    p_q = qw_ptr + o_qr * N + o_qn
    # scales / zeros [4 w, 8 g, 4 t, 2 R] of the same columns (the 4 lanes t read the same ones)
    o_sn = c0 + 2 * R * (8 * tile_index(4, LS, 4, 0) + tile_index(8, LS, 4, 1)) + tile_index(2 * R, LS, 4, 3) \
        + 0 * tile_index(4, LS, 4, 2)
    m_s = o_sn < N
    p_s = s_ptr + o_sn
    p_z = z_ptr + o_sn
    # x [BT, KS, 4 t, 8]: token i_m BT + m, k = 32 ks + 8 t + i
    o_xm = i_m * BT + tile_index(BT, LX, 4, 0)
    o_xk = 32 * tile_index(KS, LX, 4, 1) + 8 * tile_index(4, LX, 4, 2) + tile_index(8, LX, 4, 3)
    m_x = (o_xm < M) & (o_xk >= 0)
    p_x = x_ptr + o_xm * stride_xm + o_xk

    x_smem = gl.allocate_shared_memory(gl.float16, [2, KS * BT, 32], x_smem_layout())
    acc = gl.zeros([64 * R, BT], gl.float32, layout=acc_layout(BT))
    live = k_begin < k_end
    b_q = gl.load(p_q + (k_begin // 8) * N, mask=m_q & live, other=0)
    b_s = gl.load(p_s + (k_begin // G) * N, mask=m_s & live, other=0.0)
    b_z = gl.load(p_z + (k_begin // G) * N, mask=m_s & live, other=0.0)
    if PDL:
        gdc_wait()
    b_x = gl.load(p_x + k_begin, mask=m_x & live, other=0.0)
    store_x(x_smem, 0, x_steps(b_x, BT, KS), BT, KS)
    fence_async_shared()
    cta_barrier()
    buf = 0
    for k0 in range(k_begin, k_end, G):
        c_q, c_s, c_z = b_q, b_s, b_z
        # the next group's loads are in flight while this group's wgmmas run
        k1 = k0 + G
        nxt = k1 < k_end
        b_q = gl.load(p_q + (k1 // 8) * N, mask=m_q & nxt, other=0)
        b_s = gl.load(p_s + (k1 // G) * N, mask=m_s & nxt, other=0.0)
        b_z = gl.load(p_z + (k1 // G) * N, mask=m_s & nxt, other=0.0)
        b_x = gl.load(p_x + k1, mask=m_x & nxt, other=0.0)
        c_q = gl.permute(c_q, [0, 1, 2, 4, 3])                             # [4, 8, 4, 2 R, KS]
        c_z = c_z + 1024.0
        for ks in gl.static_range(KS):
            a = dequant_a(pick_slot(c_q, ks, KS), c_z, c_s, R, BT)
            acc = warpgroup_mma(a, x_smem.index(buf).slice(ks * BT, BT).permute((1, 0)), acc, is_async=True)
            if ROLL >= 0 and ks < KS - 1:
                acc = warpgroup_mma_wait(ROLL, deps=[acc])
        store_x(x_smem, 1 - buf, x_steps(b_x, BT, KS), BT, KS)
        fence_async_shared()
        # all of this group's wgmmas are done before the next group's x overwrites their buffer (keeping one group
        # in flight, codes staged by cp.async, measured 1.4x slower at 32 rows: bench/NOTES.md)
        acc = warpgroup_mma_wait(0, deps=[acc])
        cta_barrier()
        buf = 1 - buf

    # accumulator rows 64 b + 16 w + 8 h + g -> tile column 2 R (8 w + g) + 2 b + h
    acc = gl.reshape(gl.permute(gl.reshape(acc, [R, 4, 2, 8, BT]), [1, 3, 0, 2, 4]), [64 * R, BT])
    LO: gl.constexpr = acc.type.layout
    o_yn = c0 + gl.expand_dims(gl.arange(0, 64 * R, layout=gl.SliceLayout(1, LO)), 1)
    o_ym = i_m * BT + gl.expand_dims(gl.arange(0, BT, layout=gl.SliceLayout(0, LO)), 0)
    store_tile(acc, o_ym, o_yn, y_ptr, part_ptr, bias_ptr, M, N, stride_ym, i_s, SPLIT, HAS_BIAS)


# ---------------------------------------------------------------- launcher
@dataclass(frozen=True)
class WgmmaTile:
    """R m64 blocks per program (64 R columns), BT tokens per program (wgmma's N); ``slots``: the programs an SM holds
    at once, which split K fills (set by the build's registers at group 128: the AOT test checks each table tile's);
    ``min_groups``: a split leaving a program fewer quantisation groups disqualifies the tile (pick_tile);
    ``pdl``: a programmatic dependent launch; ``roll``: the kernel's ROLL (-1 none), fewer registers for one more
    slot, at some cost to each program (bench/NOTES.md, session 20)."""
    R: int = 2
    BT: int = 32
    slots: int = 3
    pdl: bool = False
    min_groups: int = 0
    roll: int = -1


# (R, BT, G, roll) whose unsplit build (n_split specialised to 1, as every split-1 launch is) kills Triton 3.6's ptxas
# (CUDA 12.8, SIGSEGV; found building every tile x group x split-1 variant; 3.9's builds it)
UNBUILDABLE_UNSPLIT = frozenset({(1, 32, 128, -1), (1, 32, 128, 0)})


def tile_programs(M: int, N: int, tile: WgmmaTile) -> int:
    return -(-N // (64 * tile.R)) * -(-M // tile.BT)


def tile_split(M: int, N: int, K: int, G: int, tile: WgmmaTile, sms: int) -> int:
    """The most whole-group splits of K whose programs still fit one wave of tile.slots per SM (at least 1, no empty
    split): a program beyond the wave runs after it, a wave left part empty leaves SMs idle (bench/NOTES.md,
    session 19)."""
    return whole_split(tile.slots * sms // tile_programs(M, N, tile), K // G)


def buildable(tile: WgmmaTile, G: int, split: int) -> bool:
    return split > 1 or (tile.R, tile.BT, G, tile.roll) not in UNBUILDABLE_UNSPLIT


def pick_tile(tiles: tuple[WgmmaTile, ...], M: int, N: int, K: int, G: int, sms: int) -> tuple[WgmmaTile, int]:
    """(tile, split) for one GEMM: the first of ``tiles`` whose programs fit one wave, buildable, its split leaving
    each program at least its min_groups; when none qualifies, the last tile unsplit."""
    for t in tiles:
        split = tile_split(M, N, K, G, t, sms)
        if (tile_programs(M, N, t) <= t.slots * sms and buildable(t, G, split)
                and (K // G) // split >= t.min_groups):
            return t, split
    return tiles[-1], 1


def buildable_tile(tile: WgmmaTile, G: int, split: int) -> WgmmaTile:
    """``tile``, or R 2 BT 32 (which builds for every group and split) where ``tile`` cannot build unsplit."""
    return tile if buildable(tile, G, split) else WgmmaTile(2, 32, 3, tile.pdl)


def wgmma_applies(x2: torch.Tensor, weight: QuantizedWeight) -> bool:
    """gemm_mma's operand conditions (fp16, groups 32-128, 16-byte x rows) and N a multiple of 16 (Triton 3.6's
    ptxas crashes on the build for other N); the caller checks sm_90."""
    return mma_applies(x2, weight) and weight.out_features % 16 == 0


def w4a16_gemm_wgmma(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None,
                     tile: WgmmaTile | tuple[WgmmaTile, ...] | None = None, split_k: int | None = None) -> torch.Tensor:
    """x [M, K] fp16 @ dequant(weight) [K, N] (+ bias [N]) -> [M, N] fp16 on wgmma (sm_90). ``tile``: one tile, or
    candidates for pick_tile (the launch table's row); ``split_k`` overrides the split (a tile that cannot build
    unsplit becomes R 2 BT 32 there)."""
    if not cuda_device(x.device) or torch.cuda.get_device_capability(x.device)[0] != 9:
        raise KernelContractError(f"w4a16_gemm_wgmma runs on sm_90 only (wgmma; Gluon has no interpreter), got {x.device}")
    M, K, N, G, y = register_a_operands("w4a16_gemm_wgmma", x, weight, wgmma_applies(x, weight),
                                        " and N a multiple of 16")
    if M == 0:
        return y
    _, sms = device_key(x.device)
    tile, split = pick_tile(tile if isinstance(tile, tuple) else (tile or WgmmaTile(),), M, N, K, G, sms)
    split = split_k or split
    if (safe := buildable_tile(tile, G, split)) is not tile:
        tile, split = safe, split_k or tile_split(M, N, K, G, safe, sms)
    part = split_partials(split, y)
    b = bias if bias is not None else weight.scales
    grid = (-(-M // tile.BT), -(-N // (64 * tile.R)), split)
    pdl = tile.pdl and pdl_supported(x.device)
    w4a16_gemm_wgmma_kernel[grid](x, weight.qweight, weight.scales, weight.zeros, b, y, part, M, N, K, x.stride(0),
                                  y.stride(0), split, G=G, R=tile.R, BT=tile.BT, SPLIT=split > 1,
                                  HAS_BIAS=bias is not None, PDL=pdl, ROLL=tile.roll, num_warps=4,
                                  **({"launch_pdl": True} if pdl else {}))
    return reduce_splits(part, bias, y, split)


_SIG = {"x_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "bias_ptr": "*fp16",
        "y_ptr": "*fp16", "part_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
        "stride_ym": "i32", "n_split": "i32", "G": "constexpr", "R": "constexpr", "BT": "constexpr",
        "SPLIT": "constexpr", "HAS_BIAS": "constexpr", "PDL": "constexpr", "ROLL": "constexpr"}
# the sm_90 table's tiles (as there: the test checks it) and two without PDL
AOT_TILES = (WgmmaTile(2, 32), WgmmaTile(1, 64), WgmmaTile(2, 16, pdl=True), WgmmaTile(1, 32, 4, pdl=True),
             WgmmaTile(1, 32, 5, pdl=True, roll=2), WgmmaTile(2, 32, pdl=True),
             WgmmaTile(1, 64, 4, pdl=True, min_groups=4, roll=1), WgmmaTile(2, 64, 2, pdl=True, min_groups=16),
             WgmmaTile(1, 64, pdl=True), WgmmaTile(2, 64, 3, pdl=True, roll=0), WgmmaTile(2, 16, 4, pdl=True, roll=1))


def tile_name(t: WgmmaTile) -> str:
    return f"w4a16 wgmma R{t.R} BT{t.BT}{' pdl' if t.pdl else ''}{f' roll{t.roll}' if t.roll >= 0 else ''}"


def aot_configs(cc: int) -> list[AotConfig]:
    """The tiles above at groups 128 and 32, split and unsplit (sm_90 only: wgmma); unsplit with n_split the constant 1
    as launched (AotConfig.ones: UNBUILDABLE_UNSPLIT's crash is only there), the unbuildable ones left out."""
    if cc != 90:
        return []
    out = []
    for t in AOT_TILES:
        for g in (128, 32):
            for split in (1, 4):
                if not buildable(t, g, split):
                    continue
                out.append(AotConfig("w4a16_gemm_wgmma_kernel", dict(_SIG),
                                     dict(G=g, R=t.R, BT=t.BT, SPLIT=split > 1, HAS_BIAS=split == 1, PDL=t.pdl,
                                          ROLL=t.roll), 4,
                                     1, f"{tile_name(t)} g{g} split{split}",
                                     divisible_by_16=("N", "K", "stride_xm", "stride_ym"),
                                     ones=("n_split",) if split == 1 else ()))
    return out
