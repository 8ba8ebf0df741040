"""W4A16 GEMM for sm_70 on the HMMA.884 building block (common/mma884.py): ``y = x @ dequant(W) (+ bias)`` for
the canonical K-packed layout (packing.py), fp16 activations, groups 32/64/128, split K for small grids.

The canonical layout is what the B fragment wants: one int32 ``qweight[r, n]`` holds the eight consecutive k
``8r .. 8r+7`` of column n, and a lane of the fragment tile holds exactly eight consecutive k of one column per
k = 8 step. So each step loads one int32 per fragment column from shared memory and dequantises it in registers
straight into the fragment, two values per instruction (int4_frag.dequant_frag: lop3 with the 0x6400 magic gives
the half2 ``1024 + q``, subtracting ``1024 + z``, the zero folded into the magic, is exact, and the scale rounds
once: ``w = ((1024 + q) - (1024 + z)) * s``, as in the twin). That puts k in the order 0 4 1 5 2 6 3 7 in a
lane's fragment slots, so the x staging is reordered the same way (int4_frag.permute_k) before its shared store.

Contract (as ``gemm.py``'s tl.dot kernel): K a multiple of BK and of the group size G, BK <= G (one scale row per
k tile). gemm.py's sm_70 row takes it for fp16 at M >= 2 (``hmma_applies``); its GPU tests
(tests/kernels/w4a16/test_gemm_sm70.py, ``-m gpu``) had not yet run when it was wired.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ...errors import KernelContractError
from ..common.aot import AotConfig
from ..common.arch import cuda_device, device_key
from ..common.int4_frag import code_layout, code_smem_layout, code_stage_layout, dequant_frag, index3, permute_k
from ..common.mma884 import (Tile884, a_layout, a_smem_shape, acc_rows_cols, b_layout, frag_layout, mma884,
                             pick_tile, smem_layout, stage_index, stage_layout_a)
from ..common.splitk import REDUCE_BLOCK, reduce_splits, split_partials, splitk_reduce_kernel  # noqa: F401 (aot)
from .packing import QuantizedWeight


# (max M, tile): 4 warps, A staging 2 * BK * BM bytes plus BK / 2 * BN of codes (a few KB of the 96 KB). Decode
# (M <= 64) is bound by the weight bytes, and every row of BM past M is tensor-core work on zeros that the V100
# pays at 125 TFLOP/s (BM 64 at M = 8: 91 us of HMMA for 5120 x 17408 against 50 us of DRAM), so BM follows M
# down to 16, the smallest the quad-pair layout allows (TurboMind's SM70 decode tiles are CTA M 16 / 32 too); one
# warp row, four warps across N, keeps each warp's A fragment to one or two 8-row blocks. The decode rows (M <= 32)
# take k tiles of 64 (groups >= 64; ``sm70_tile`` cuts BK to a group of 32): each program then has twice the bytes
# in flight per wait, so the split below halves, and a V100 SM holds all of them at once (at BK 32, M = 32 took
# two rounds of 5 resident programs; the projection, bench/NOTES.md: 53% -> 75% of 900 GB/s at 5120 x 17408).
SM70_TABLE = (
    (16, Tile884(16, 128, 64, 1, 4)),
    (32, Tile884(32, 128, 64, 1, 4)),
    (64, Tile884(64, 128, 32, 2, 2)),
    (None, Tile884(128, 128, 32, 2, 2)),
)
MAX_SPLIT_K = 8
# split K toward this many programs per SM at BK = 32 (proportionally fewer at larger BK: the same bytes in flight):
# a 4-warp decode program holds one k tile's loads in flight, and a V100 SM keeps 16 such programs resident (64
# warps), so ~4 per SM are what hides a ~500-cycle DRAM latency
SPLIT_WAVES = 4


@gluon.jit
def w4a16_gemm_sm70_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, part_ptr, M, N, K, stride_xm, stride_ym,
                           G: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                           WM: gl.constexpr, WN: gl.constexpr, SPLIT_K: gl.constexpr, HAS_BIAS: gl.constexpr):
    i_m, i_n, i_s = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    NW: gl.constexpr = WM * WN
    MB: gl.constexpr = BM // 8
    NB: gl.constexpr = BN // 8
    LA: gl.constexpr = stage_layout_a(NW)
    LQ: gl.constexpr = code_stage_layout(NW)
    LC: gl.constexpr = code_layout(WM, WN)
    LF: gl.constexpr = frag_layout(WM, WN)

    n_kb = K // BK
    kb_per = gl.cdiv(n_kb, SPLIT_K)
    k_begin = kb_per * i_s * BK
    k_end = gl.minimum(kb_per * (i_s + 1), n_kb) * BK

    # x staging [(step, mb), h, l, k]: row 8 mb + 4 h + l, k 8 step + k (the A fragment map)
    da, ha, la, ka = stage_index(BK // 8 * MB, LA)
    o_am = i_m * BM + 8 * (da % MB) + 4 * ha + la
    o_ak = k_begin + 8 * (da // MB) + ka
    m_am = o_am < M
    p_a = x_ptr + o_am * stride_xm + o_ak
    # code staging [(step, nb), h, l]: qweight row k / 8 = step, column 8 nb + 4 h + l
    dq, hq, lq = index3(BK // 8 * NB, LQ)
    o_qn = i_n * BN + 8 * (dq % NB) + 4 * hq + lq
    o_qr = k_begin // 8 + dq // NB
    m_qn = o_qn < N
    p_q = qw_ptr + o_qr * N + o_qn
    # scales and zeros of the fragment columns, [NB, 2, 4] in the codes' fragment layout
    nbc, hc, lc = index3(NB, LC)
    o_cn = i_n * BN + 8 * nbc + 4 * hc + lc
    m_cn = o_cn < N
    # nibble index of the fragment's k dim: [1, 1, 1, 8]
    o_i = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, b_layout(WM, WN)))))
    o_i = gl.expand_dims(gl.expand_dims(gl.expand_dims(o_i, 0), 1), 2)

    s_a = gl.allocate_shared_memory(gl.float16, a_smem_shape(BM, BK), smem_layout())
    s_q = gl.allocate_shared_memory(gl.int32, [BK // 8 * NB, 2, 4], code_smem_layout())
    acc = gl.zeros([MB, NB, 2, 4, 8], gl.float32, layout=LF)

    # [BK//8 * BM//8, 2, 4, 8]
    b_a = gl.load(p_a, mask=m_am & (o_ak < k_end), other=0.0)
    # [BK//8 * BN//8, 2, 4]
    b_q = gl.load(p_q, mask=m_qn & (o_qr * 8 < k_end), other=0)
    for k0 in range(k_begin, k_end, BK):
        s_a.store(permute_k(b_a))
        s_q.store(b_q)
        # [NB, 2, 4]: one scale row per k tile (BK <= G); zb = 1024 + z, the magic's offset folded into the zero
        b_s = gl.load(s_ptr + (k0 // G) * N + o_cn, mask=m_cn, other=0.0)
        b_zb = gl.load(z_ptr + (k0 // G) * N + o_cn, mask=m_cn, other=0.0) + 1024.0
        # the next tile's loads are in flight while the tensor cores work on this one
        k1 = k0 + BK
        b_a = gl.load(p_a + (k1 - k_begin), mask=m_am & (o_ak + (k1 - k_begin) < k_end), other=0.0)
        b_q = gl.load(p_q + ((k1 - k_begin) // 8) * N, mask=m_qn & ((o_qr * 8 + (k1 - k_begin)) < k_end), other=0)
        b_s = gl.expand_dims(b_s, 3)
        b_zb = gl.expand_dims(b_zb, 3)
        for j in gl.static_range(BK // 8):
            # [MB, 2, 4, 8] in the A fragment map
            f_a = s_a.slice(j * MB, MB).load(a_layout(WM, WN))
            # [NB, 2, 4, 1] codes, broadcast to the [NB, 2, 4, 8] slots -> (1024 + q - (1024 + z)) * s
            f_q, _ = gl.broadcast(gl.expand_dims(s_q.slice(j * NB, NB).load(LC), 3), o_i)
            f_w = dequant_frag(f_q, b_zb, b_s)
            acc = mma884(acc, gl.expand_dims(f_a, 1), gl.expand_dims(f_w, 0))

    rows, cols = acc_rows_cols(BM, BN, WM, WN)
    o_ym = i_m * BM + rows
    o_yn = i_n * BN + cols
    m_y = (o_ym < M) & (o_yn < N)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += gl.load(bias_ptr + o_yn, mask=o_yn < N, other=0.0).to(gl.float32)
        gl.store(y_ptr + o_ym * stride_ym + o_yn, acc.to(gl.float16), mask=m_y)
    else:
        gl.store(part_ptr + (i_s * M + o_ym) * N + o_yn, acc, mask=m_y)


def sm70_tile(M: int, G: int) -> Tile884:
    """The table's tile for M rows, its k tile cut to the group size G (one scale row per k tile)."""
    cfg = pick_tile(SM70_TABLE, M)
    return replace(cfg, BK=G) if cfg.BK > G else cfg


def pick_split_k(M: int, N: int, K: int, cfg: Tile884, sms: int) -> int:
    """Split K toward SPLIT_WAVES programs per SM at BK = 32, SPLIT_WAVES * 32 / BK at larger k tiles (small M x N
    leaves most of the SMs idle, or their DRAM latency exposed, otherwise), rounded so that no split is empty."""
    tiles = -(-M // cfg.BM) * -(-N // cfg.BN)
    n_kb = K // cfg.BK
    want = max(1, min(MAX_SPLIT_K, -(-SPLIT_WAVES * sms * 32 // (tiles * cfg.BK)), n_kb))
    per = -(-n_kb // want)
    return -(-n_kb // per)


def w4a16_gemm_sm70(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None,
                    config: Tile884 | None = None, split_k: int | None = None) -> torch.Tensor:
    """x [M, K] fp16 @ dequant(weight) [K, N] (+ bias [N]) -> [M, N] fp16 on m8n8k4. CUDA only (Gluon and inline
    PTX have no interpreter)."""
    if x.dtype != torch.float16 or weight.dtype != torch.float16:
        raise KernelContractError(f"the sm_70 W4A16 GEMM takes fp16 (sm_70 has no bf16), got {x.dtype} "
                                  f"activations and {weight.dtype} scales")
    if not cuda_device(x.device):
        raise KernelContractError(f"w4a16_gemm_sm70 runs on CUDA only (Gluon has no interpreter), got {x.device}")
    M, K = x.shape
    N, G = weight.out_features, weight.group_size
    cfg = config or sm70_tile(M, G)
    if K != weight.in_features or x.stride(1) != 1 or weight.qweight.dim() != 2:
        raise KernelContractError(f"x {tuple(x.shape)} (stride {x.stride()}) does not match a 2-D weight of "
                                  f"K = {weight.in_features}, or is not contiguous along K")
    if G not in (32, 64, 128) or K % G or G % cfg.BK:
        raise KernelContractError(f"group size {G} with K = {K}: need G in 32/64/128, K % G == 0, G % {cfg.BK} == 0")
    cfg.check()
    y = torch.empty((M, N), dtype=torch.float16, device=x.device)
    if M == 0:
        return y
    _, sms = device_key(x.device)   # the row's reference count under CATENGINE_ARCH, as every launcher
    split = split_k or pick_split_k(M, N, K, cfg, sms)
    part = split_partials(split, y)
    qw, s, z = weight.qweight.contiguous(), weight.scales.contiguous(), weight.zeros.contiguous()
    b = bias if bias is not None else s
    grid = (-(-M // cfg.BM), -(-N // cfg.BN), split)
    w4a16_gemm_sm70_kernel[grid](x, qw, s, z, b, y, part, M, N, K, x.stride(0), y.stride(0), G=G, BM=cfg.BM,
                                 BN=cfg.BN, BK=cfg.BK, WM=cfg.WM, WN=cfg.WN, SPLIT_K=split,
                                 HAS_BIAS=bias is not None, num_warps=cfg.num_warps)
    return reduce_splits(part, bias, y, split)


_SIG = {"x_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "bias_ptr": "*fp16",
        "y_ptr": "*fp16", "part_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
        "stride_ym": "i32", "G": "constexpr", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr",
        "WM": "constexpr", "WN": "constexpr", "SPLIT_K": "constexpr", "HAS_BIAS": "constexpr"}


def aot_configs(cc: int) -> list[AotConfig]:
    """Every tile of the sm_70 table, groups 128 and 32 (BK cut to the group as ``sm70_tile`` does), split and
    unsplit (model K and N are multiples of 16)."""
    out = []
    for _, t in SM70_TABLE:
        for g in (128, 32):
            c = replace(t, BK=min(t.BK, g))
            for split in (1, 4):
                out.append(AotConfig("w4a16_gemm_sm70_kernel", dict(_SIG),
                                     dict(G=g, BM=c.BM, BN=c.BN, BK=c.BK, WM=c.WM, WN=c.WN, SPLIT_K=split,
                                          HAS_BIAS=split == 1),
                                     c.num_warps, 1, f"w4a16 sm70 {c.BM}x{c.BN}x{c.BK} g{g} split{split}",
                                     divisible_by_16=("N", "K", "stride_xm", "stride_ym")))
    out.append(AotConfig("splitk_reduce_kernel", {"part_ptr": "*fp32", "bias_ptr": "*fp16", "y_ptr": "*fp16",
                                                  "M": "i32", "N": "i32", "stride_ym": "i32", "SPLIT_K": "constexpr",
                                                  "BLOCK": "constexpr", "HAS_BIAS": "constexpr",
                                                  "TRIGGER": "constexpr"},
                         dict(SPLIT_K=4, BLOCK=REDUCE_BLOCK, HAS_BIAS=True, TRIGGER=False), 4, 1, "reduce fp16"))
    return out
