"""W4A16 for decode-sized M on sm_80/sm_90 tensor cores: ``y = x @ dequant(W) (+ bias)``, Gluon with
``mma.sync.m16n8k16`` from inline PTX, for the canonical K-packed layout (packing.py), fp16 activations.

The weight is the MMA's A operand (16 output columns n per MMA row block) and x its B operand (8 tokens per
MMA column block), so M = 3..16 pads to 16 tokens, not to a 64-row tile. Nothing goes through shared memory:

- k order: the sum over k does not care how k is assigned to the MMA's k slots as long as A and B agree. Lane
  (g, t) of an m16n8k16 holds k slots {2t, 2t+1, 2t+8, 2t+9}; over two MMAs (k = 32) that is 8 slots, and we
  give them the physical k 8t .. 8t+7 of the 32: exactly one int32 of the canonical layout per MMA row. The
  dequantisation below yields that int32's values as half2 (k0,k4) (k1,k5) (k2,k6) (k3,k7), which become the
  lane's four A registers for that row in MMA order; x gets the same pairing from four ``prmt``.
- rows: the lane's two MMA rows g and g+8 of row block b are the adjacent columns n = 8g + 2b and 8g + 2b + 1,
  so a lane reads 8 adjacent columns' codes (and scales, zeros) at each packed row: 64 columns per warp.
- the codes of the next quantisation group (and its x) are loaded while this group's MMAs run (registers,
  one group ahead), and split K puts enough programs on the chip.

Per lane and int32 of weights: a quarter of a 16-byte load, 3 shifts, 4 ``lop3``, 4 ``sub.f16x2``, 4
``mul.f16x2`` (the twin's ``(q - z) * s`` with one rounding, as int4_frag.dequant_frag), 2 MMAs per 16 tokens.
Tensors are 5-D fragment tiles ``[4 W, MB, 8, 4, 8] = [(warp, b), token block, g, t, slot]`` in ``frag_layout``;
every layout orders t before g, so that lane = 4 g + t as the MMA numbers them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ...errors import KernelContractError
from ..common.aot import AotConfig
from ..common.arch import cuda_device, device_key, pdl_supported
from ..common.gdc import gdc_launch_dependents, gdc_wait
from ..common.int4_frag import PAIR_K_ASM, PAIR_K_CONSTRAINTS
from ..common.splitk import pick_split, reduce_splits, split_partials
from .packing import QuantizedWeight


# ---------------------------------------------------------------- layouts
@gluon.constexpr_function
def frag_layout(W):
    """[4 W, MB, 8, 4, 8]: dim 0 = 4 row blocks per warp (registers) x W warps, lanes g (dim 2) and t (dim 3),
    8 register slots (dim 4) fastest."""
    return gl.BlockedLayout(size_per_thread=[4, 1, 1, 1, 8], threads_per_warp=[1, 1, 8, 4, 1],
                            warps_per_cta=[W, 1, 1, 1, 1], order=[4, 0, 1, 3, 2])


@gluon.constexpr_function
def row_layout(W):
    """[4 W, 8, 4] per-lane values of one MMA row (a code, a scale): the fragment tile without MB and slots."""
    return gl.SliceLayout(1, gl.SliceLayout(4, frag_layout(W)))


@gluon.constexpr_function
def code_layout(W, KS):
    """[W, 8, 4, KS, 8]: a lane's codes of one group, its 8 adjacent columns (16-byte loads) and KS k = 32 steps
    in registers."""
    return gl.BlockedLayout(size_per_thread=[1, 1, 1, KS, 8], threads_per_warp=[1, 8, 4, 1, 1],
                            warps_per_cta=[W, 1, 1, 1, 1], order=[4, 3, 0, 2, 1])


@gluon.constexpr_function
def scale_layout(W):
    """[W, 8, 4, 8]: one group's scales (or zeros) of a lane's 8 columns; the same for the 4 lanes t."""
    return gl.BlockedLayout(size_per_thread=[1, 1, 1, 8], threads_per_warp=[1, 8, 4, 1],
                            warps_per_cta=[W, 1, 1, 1], order=[3, 0, 2, 1])


@gluon.constexpr_function
def x_layout(W, MB, KS):
    """[1, 2 MB, 8, 4, KS, 4] int32 view of x (two fp16 each): token block of 8 (dim 1), lane g's token, lane t's
    4 pairs (16 bytes) of each k = 32 step."""
    return gl.BlockedLayout(size_per_thread=[1, 2 * MB, 1, 1, KS, 4], threads_per_warp=[1, 1, 8, 4, 1, 1],
                            warps_per_cta=[W, 1, 1, 1, 1, 1], order=[5, 4, 1, 0, 3, 2])


@gluon.constexpr_function
def _others(L, rank, d):
    """L sliced down to its dim d (every other dim removed)."""
    for i in reversed(range(rank)):
        if i != d:
            L = gl.SliceLayout(i, L)
    return L


@gluon.jit
def tile_index(n: gl.constexpr, L: gl.constexpr, RANK: gl.constexpr, D: gl.constexpr):
    """arange(n) along dim D of a RANK-dim tensor in layout L, size 1 on every other dim."""
    v = gl.arange(0, n, layout=_others(L, RANK, D))
    for i in gl.static_range(RANK):
        if i != D:
            v = gl.expand_dims(v, i)
    return v


@gluon.jit
def _split_rows(v, W: gl.constexpr):
    """[W, 8, 4, ..., 8] (a lane's 8 adjacent columns e = 2 b + h last) -> rows h = 0 and h = 1, each
    [4 W, 8, 4, ...] with dim 0 = 4 w + b."""
    lo, hi = gl.split(gl.reshape(v, v.shape[:-1] + [4, 2]))
    return _merge_b(lo), _merge_b(hi)


@gluon.jit
def _merge_b(v):
    """[W, 8, 4, (KS,) 4] -> [4 W, 8, 4, (KS)]: the row block b moved next to the warp."""
    if len(v.shape) == 4:
        v = gl.permute(v, [0, 3, 1, 2])
        return gl.reshape(v, [v.shape[0] * 4, 8, 4])
    else:
        v = gl.permute(v, [0, 4, 1, 2, 3])
        return gl.reshape(v, [v.shape[0] * 4, 8, 4, v.shape[4]])


# ---------------------------------------------------------------- register math (inline PTX)
def dequant_rows_asm(q0: str, q1: str, z0: str, z1: str, s0: str, s1: str) -> str:
    """PTX dequantising two MMA rows' codes q0 / q1 into the 8 half2 A registers $0..$7 (row 0 in the even, row 1 in
    the odd ones; registers 2 i and 2 i + 1 hold the pair (k_i, k_i+4)), with 1024 + zero z0 / z1 and scales s0 / s1
    as half2 operands: lop3 / sub.f16x2 / mul.f16x2, the twin's ``(q - z) * s`` rounded once. The operand names are
    the caller's (its pack decides them); gemm_wgmma.py takes the same sequence."""
    src = [(q0, q1)] + [(f"t{i}", f"u{i}") for i in range(3)]
    lines = ["{", ".reg .b32 t0, t1, t2, u0, u1, u2;"]
    lines += [f"shr.b32 {r}{i}, {q}, {4 * (i + 1)};" for r, q in (("t", q0), ("u", q1)) for i in range(3)]
    lines += [f"lop3.b32 ${2 * i + h}, {src[i][h]}, 0x000f000f, 0x64006400, 0xea;" for i in range(4) for h in range(2)]
    lines += [f"sub.rn.f16x2 ${r}, ${r}, {(z0, z1)[r % 2]};" for r in range(8)]
    lines += [f"mul.rn.f16x2 ${r}, ${r}, {(s0, s1)[r % 2]};" for r in range(8)]
    return "\n" + "\n".join(lines + ["}"]) + "\n"


# $0..$7: the lane's A registers of one k = 32 step in MMA order (row g, row g+8 alternating); $8 / $16: the codes of rows
# g / g+8 (broadcast over 8 slots); $24 / $28: half2 1024 + zero of the two rows; $32 / $36: half2 scales
_DEQUANT_ASM = gl.constexpr(dequant_rows_asm("$8", "$16", "$24", "$28", "$32", "$36"))
_DEQUANT_CONSTRAINTS = gl.constexpr(",".join(["=r"] * 8 + ["r"] * 16 + ["r"] * 16))

# one k = 32 step of a 16 x 16 (rows x tokens) block: $0..$7 accumulators (token block j: $4j..$4j+3), $8..$15
# their inputs (tied), $16..$23 A (half h: $16+4h..), $24..$31 B (token block j, half h: $24+4j+2h, +1)
_MMA_ASM = gl.constexpr("""
mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0,$1,$2,$3}, {$16,$17,$18,$19}, {$24,$25}, {$8,$9,$10,$11};
mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0,$1,$2,$3}, {$20,$21,$22,$23}, {$26,$27}, {$0,$1,$2,$3};
mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$4,$5,$6,$7}, {$16,$17,$18,$19}, {$28,$29}, {$12,$13,$14,$15};
mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$4,$5,$6,$7}, {$20,$21,$22,$23}, {$30,$31}, {$4,$5,$6,$7};
""")
_MMA_CONSTRAINTS = gl.constexpr(",".join(["=f"] * 8 + [str(i) for i in range(8)] + ["r"] * 16))


@gluon.jit
def pick_slot(v, I: gl.constexpr, N: gl.constexpr):
    """v [..., N] (N = 1, 2 or 4, held in registers) -> v[..., I]."""
    if N == 1:
        return gl.reshape(v, v.shape[:-1])
    elif N == 2:
        a, b = gl.split(v)
        return b if I == 1 else a
    else:
        a, b = gl.split(gl.reshape(v, v.shape[:-1] + [2, 2]))
        return pick_slot(b if I % 2 == 1 else a, I // 2, 2)


@gluon.jit
def _rows(v, W: gl.constexpr):
    """[4 W, 8, 4] per-row values -> [4 W, 1, 8, 4, 8], the same value in a lane's 8 slots (registers: free)."""
    v = gl.expand_dims(gl.expand_dims(gl.convert_layout(v, row_layout(W)), 1), 4)
    v, _ = gl.broadcast(v, tile_index(8, frag_layout(W), 5, 4))
    return v


@gluon.jit
def acc_index(MB: gl.constexpr, W: gl.constexpr):
    """(R, mb, g, t, s) index tensors of the fragment tile, each broadcastable to [4 W, MB, 8, 4, 8]."""
    LF: gl.constexpr = frag_layout(W)
    return (tile_index(4 * W, LF, 5, 0), tile_index(MB, LF, 5, 1), tile_index(8, LF, 5, 2), tile_index(4, LF, 5, 3),
            tile_index(8, LF, 5, 4))


@gluon.jit
def mainloop(p_q, p_x, p_s, p_z, m_q, m_x, m_s, NW, k_begin, k_end, G: gl.constexpr, MB: gl.constexpr,
             W: gl.constexpr, PDL: gl.constexpr):
    """The fragment tile's accumulators [4 W, MB, 8, 4, 8] over k in [k_begin, k_end) (whole groups): p_q codes of
    packed row 0 ([W, 8, 4, KS, 8], ``code_layout``; rows NW apart), p_s / p_z scales and zeros of group 0
    ([W, 8, 4, 8]; groups NW apart), p_x the x pairs at k = 0 ([1, 2 MB, 8, 4, KS, 4] int32). PDL: the first
    group's weights are requested before the wait for the kernel before (common/gdc.py), x after it."""
    KS: gl.constexpr = G // 32
    acc = gl.zeros([4 * W, MB, 8, 4, 8], gl.float32, layout=frag_layout(W))
    live = k_begin < k_end
    b_q = gl.load(p_q + (k_begin // 8) * NW, mask=m_q & live, other=0)
    b_s = gl.load(p_s + (k_begin // G) * NW, mask=m_s & live, other=0.0)
    b_z = gl.load(p_z + (k_begin // G) * NW, mask=m_s & live, other=0.0)
    if PDL:
        gdc_wait()
    b_x = gl.load(p_x + k_begin // 2, mask=m_x & live, other=0)
    for k0 in range(k_begin, k_end, G):
        c_q, c_x, c_s, c_z = b_q, b_x, b_s, b_z
        # the next group's loads are in flight while this group's MMAs run
        k1 = k0 + G
        nxt = k1 < k_end
        b_q = gl.load(p_q + (k1 // 8) * NW, mask=m_q & nxt, other=0)
        b_x = gl.load(p_x + k1 // 2, mask=m_x & nxt, other=0)
        b_s = gl.load(p_s + (k1 // G) * NW, mask=m_s & nxt, other=0.0)
        b_z = gl.load(p_z + (k1 // G) * NW, mask=m_s & nxt, other=0.0)
        # [4W, 8, 4] per row half: 1024 + zero (the magic's offset folded in) and the scale
        z_lo, z_hi = _split_rows(c_z + 1024.0, W)
        s_lo, s_hi = _split_rows(c_s, W)
        z_lo, z_hi, s_lo, s_hi = _rows(z_lo, W), _rows(z_hi, W), _rows(s_lo, W), _rows(s_hi, W)
        # [4W, 8, 4, KS] each
        q_lo, q_hi = _split_rows(c_q, W)
        # x paired like the codes, then [1, MB, 8, 4, 8, KS] with slot 4 j + p
        c_x = gl.inline_asm_elementwise(PAIR_K_ASM, PAIR_K_CONSTRAINTS, [c_x], dtype=gl.int32, is_pure=True,
                                          pack=4)
        c_x = gl.reshape(c_x, [1, MB, 2, 8, 4, KS, 4])
        c_x = gl.reshape(gl.permute(c_x, [0, 1, 3, 4, 2, 6, 5]), [1, MB, 8, 4, 8, KS])
        for ks in gl.static_range(KS):
            f_a = gl.inline_asm_elementwise(
                _DEQUANT_ASM, _DEQUANT_CONSTRAINTS,
                [_rows(pick_slot(q_lo, ks, KS), W), _rows(pick_slot(q_hi, ks, KS), W), z_lo, z_hi, s_lo, s_hi],
                dtype=gl.int32, is_pure=True, pack=8)
            f_b = gl.convert_layout(pick_slot(c_x, ks, KS), frag_layout(W))
            acc = gl.inline_asm_elementwise(_MMA_ASM, _MMA_CONSTRAINTS, [acc, f_a, f_b], dtype=gl.float32,
                                            is_pure=True, pack=8)
    return acc


@gluon.jit
def store_tile(acc, o_ym, o_yn, y_ptr, part_ptr, bias_ptr, M, N, stride_ym, i_s, SPLIT: gl.constexpr,
               HAS_BIAS: gl.constexpr):
    """acc (fp32, token o_ym, column o_yn) + bias -> y fp16, or (SPLIT) into split i_s's fp32 partials [.., M, N]."""
    m_y = (o_ym < M) & (o_yn < N)
    if not SPLIT:
        if HAS_BIAS:
            acc += gl.load(bias_ptr + o_yn, mask=o_yn < N, other=0.0).to(gl.float32)
        gl.store(y_ptr + o_ym * stride_ym + o_yn, acc.to(gl.float16), mask=m_y)
    else:
        gl.store(part_ptr + (i_s * M + o_ym) * N + o_yn, acc, mask=m_y)


@gluon.jit
def w4a16_gemm_mma_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, part_ptr, M, N, K, stride_xm, stride_ym,
                          n_split, G: gl.constexpr, MB: gl.constexpr, W: gl.constexpr, SPLIT: gl.constexpr,
                          HAS_BIAS: gl.constexpr, PDL: gl.constexpr):
    """x_ptr: int32 view of x [M, K // 2] (stride_xm in int32); y [M, N] fp16, or (SPLIT) fp32 partials
    [n_split, M, N]. The split count is a run-time value: a new split does not compile a new kernel. PDL (sm_90,
    launched with launch_pdl): a programmatic dependent launch that fetches its first group of weights while the
    kernel before runs out."""
    if PDL:
        gdc_launch_dependents()
    # token tiles of one column tile run side by side (grid dim 0): the weight tile comes from DRAM once
    i_m, i_n, i_s = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    KS: gl.constexpr = G // 32
    LQ: gl.constexpr = code_layout(W, KS)
    LS: gl.constexpr = scale_layout(W)
    LX: gl.constexpr = x_layout(W, MB, KS)
    n_g = K // G
    g_per = gl.cdiv(n_g, n_split)
    k_begin = g_per * i_s * G
    k_end = gl.minimum(g_per * (i_s + 1), n_g) * G

    # codes [W, 8, 4, KS, 8]: column 64 w + 8 g + e (e = 2 b + h), packed row k / 8 = 4 ks + t
    o_qn = i_n * 64 * W + 64 * tile_index(W, LQ, 5, 0) + 8 * tile_index(8, LQ, 5, 1) + tile_index(8, LQ, 5, 4)
    o_qr = 4 * tile_index(KS, LQ, 5, 3) + tile_index(4, LQ, 5, 2)
    m_q = (o_qn < N) & (o_qr >= 0)
    p_q = qw_ptr + o_qr * N + o_qn
    # scales / zeros [W, 8, 4, 8] of the same columns (the 4 lanes t read the same ones)
    o_sn = i_n * 64 * W + 64 * tile_index(W, LS, 4, 0) + 8 * tile_index(8, LS, 4, 1) + tile_index(8, LS, 4, 3) \
        + 0 * tile_index(4, LS, 4, 2)
    m_s = o_sn < N
    # x [1, 2 MB, 8, 4, KS, 4] (int32 pairs): token 8 j + g, pair (k0 + 32 ks) / 2 + 4 t + p
    o_xm = i_m * 16 * MB + 8 * tile_index(2 * MB, LX, 6, 1) + tile_index(8, LX, 6, 2)
    o_xc = 16 * tile_index(KS, LX, 6, 4) + 4 * tile_index(4, LX, 6, 3) + tile_index(4, LX, 6, 5)
    m_x = (o_xm < M) & (o_xc >= 0)
    p_x = x_ptr + o_xm * stride_xm + o_xc

    acc = mainloop(p_q, p_x, s_ptr + o_sn, z_ptr + o_sn, m_q, m_x, m_s, N, k_begin, k_end, G, MB, W, PDL)

    # accumulator [R, mb, g, t, s]: column 64 (R // 4) + 8 g + 2 (R % 4) + (s % 4) // 2,
    # token 16 mb + 8 (s // 4) + 2 t + s % 2
    aR, am, ag, at, a_s = acc_index(MB, W)
    o_yn = i_n * 64 * W + 64 * (aR // 4) + 8 * ag + 2 * (aR % 4) + (a_s % 4) // 2
    o_ym = i_m * 16 * MB + 16 * am + 8 * (a_s // 4) + 2 * at + a_s % 2
    store_tile(acc, o_ym, o_yn, y_ptr, part_ptr, bias_ptr, M, N, stride_ym, i_s, SPLIT, HAS_BIAS)


# ---------------------------------------------------------------- launcher
@dataclass(frozen=True)
class MmaTile:
    """MB token blocks of 16 per program, W warps (64 columns each), split K toward ``waves`` programs per SM;
    ``pdl``: a programmatic dependent launch (sm_90; the MoE kernels ignore it)."""
    MB: int = 1
    W: int = 4
    waves: int = 4
    pdl: bool = False


def pick_mma_tile(rows: tuple, n: int) -> MmaTile | None:
    """The tile of the first ``(max n, tile)`` row of a table's ``mma`` entry that takes n; None past the last
    bound or for an empty entry (the dense and the MoE launch tables share this form)."""
    return next((t for bound, t in rows if n <= bound), None)


def mma_applies(x2: torch.Tensor, weight: QuantizedWeight) -> bool:
    """Whether this kernel takes the GEMM: fp16, a 2-D weight with groups of 32/64/128 dividing K, x rows that
    the int32 view reads with 16-byte loads (K and the row stride multiples of 8, 16-byte aligned)."""
    return (x2.dtype == torch.float16 and weight.dtype == torch.float16 and weight.qweight.dim() == 2
            and weight.group_size in (32, 64, 128) and weight.in_features % weight.group_size == 0
            and x2.stride(1) == 1 and x2.stride(0) % 8 == 0 and x2.data_ptr() % 16 == 0)


def tile_split(M: int, N: int, K: int, G: int, tile: MmaTile, sms: int) -> int:
    """Split K in whole groups toward tile.waves programs per SM (splitk.pick_split over this kernel's tiles)."""
    return pick_split(-(-N // (64 * tile.W)) * -(-M // (16 * tile.MB)), K // G, tile.waves, sms)


def register_a_operands(name: str, x: torch.Tensor, weight: QuantizedWeight, applies: bool, more: str):
    """The operand contract of the register-A launchers (this one and gemm_wgmma's): (M, K, N, G, y [M, N] fp16), or
    KernelContractError saying what to change; ``more`` names a condition of the caller's beyond mma_applies."""
    if not applies:
        raise KernelContractError(f"{name} needs fp16 x [M, K] with K-contiguous 16-byte aligned rows and a 2-D weight "
                                  f"with groups of 32/64/128{more}: x {tuple(x.shape)} {x.dtype} stride {x.stride()}, "
                                  f"group {weight.group_size}, N {weight.out_features}")
    M, K = x.shape
    if K != weight.in_features:
        raise KernelContractError(f"x has {K} input features, the weight {weight.in_features}")
    N = weight.out_features
    return M, K, N, weight.group_size, torch.empty((M, N), dtype=torch.float16, device=x.device)


def w4a16_gemm_mma(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None,
                   tile: MmaTile | None = None, split_k: int | None = None) -> torch.Tensor:
    """x [M, K] fp16 @ dequant(weight) [K, N] (+ bias [N]) -> [M, N] fp16 on mma.sync m16n8k16 (sm_80+).
    Split K goes through ``splitk_reduce_kernel`` (an in-kernel reduce by the last split to arrive measured slower:
    bench/NOTES.md)."""
    if not cuda_device(x.device):
        raise KernelContractError(f"w4a16_gemm_mma runs on CUDA only (Gluon has no interpreter), got {x.device}")
    M, K, N, G, y = register_a_operands("w4a16_gemm_mma", x, weight, mma_applies(x, weight), "")
    tile = tile or MmaTile()
    if M == 0:
        return y
    _, sms = device_key(x.device)
    split = split_k or tile_split(M, N, K, G, tile, sms)
    part = split_partials(split, y)
    b = bias if bias is not None else weight.scales
    grid = (-(-M // (16 * tile.MB)), -(-N // (64 * tile.W)), split)
    pdl = tile.pdl and pdl_supported(x.device)
    w4a16_gemm_mma_kernel[grid](x.view(torch.int32), weight.qweight, weight.scales, weight.zeros, b, y, part, M, N,
                                K, x.stride(0) // 2, y.stride(0), split, G=G, MB=tile.MB, W=tile.W, SPLIT=split > 1,
                                HAS_BIAS=bias is not None, PDL=pdl, num_warps=tile.W,
                                **({"launch_pdl": True} if pdl else {}))
    return reduce_splits(part, bias, y, split)


_SIG = {"x_ptr": "*i32", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "bias_ptr": "*fp16",
        "y_ptr": "*fp16", "part_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
        "stride_ym": "i32", "n_split": "i32", "G": "constexpr", "MB": "constexpr", "W": "constexpr",
        "SPLIT": "constexpr", "HAS_BIAS": "constexpr", "PDL": "constexpr"}
AOT_TILES = (MmaTile(1, 2), MmaTile(2, 1), MmaTile(1, 2, pdl=True))


def aot_tiles(cc: int) -> tuple:
    """AOT_TILES without the PDL ones below sm_90 (griddepcontrol); aot_configs builds none below sm_80."""
    return tuple(t for t in AOT_TILES if cc >= 90 or not t.pdl)


def aot_configs(cc: int) -> list[AotConfig]:
    """The tiles above at groups 128 and 32, split and unsplit (sm_80 and sm_90 only: mma.sync m16n8k16); unsplit with
    n_split the constant 1, as launched (AotConfig.ones)."""
    if cc < 80:
        return []
    out = []
    for t in aot_tiles(cc):
        for g in (128, 32):
            for split in (1, 4):
                out.append(AotConfig("w4a16_gemm_mma_kernel", dict(_SIG),
                                     dict(G=g, MB=t.MB, W=t.W, SPLIT=split > 1, HAS_BIAS=split == 1,
                                          PDL=t.pdl), t.W, 1,
                                     f"w4a16 mma MB{t.MB} W{t.W}{' pdl' if t.pdl else ''} g{g} split{split}",
                                     divisible_by_16=("N", "K", "stride_xm", "stride_ym"),
                                     ones=("n_split",) if split == 1 else ()))
    return out
