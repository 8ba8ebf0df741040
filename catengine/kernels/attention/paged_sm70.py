"""Paged causal GQA attention for sm_70 on the HMMA.884 building block (common/mma884.py); twin:
``attention.naive.paged_attention``, and the same contract, grid and row packing as paged.py's tl.dot kernel:

* a program owns BLOCK_M rows = ``TOK`` consecutive new tokens x the ``G`` query heads of one KV head (token-major),
  so prefill tiles and decode (the GQA group's heads times the k + 1 speculative positions of a sequence) are one
  kernel; decode cuts the key range into splits combined by decode.py's ``split_reduce_kernel``;
* S = Q K^T: A = Q [rows, head_dim] staged once in shared memory, B = K^T [head_dim, keys], i.e. each lane's B
  fragment is 8 consecutive head dims of one key: a 16-byte run of the cache row, gathered per key through the
  block table; O += P V: A = P [rows, keys], B = V [keys, head_dim];
* online softmax in fp32 (exp2, scale folded in), causal mask on every key tile, masked K/V loads (other = 0) so
  slots past seq_len are never read;
* fp8 e5m2 caches: bytes widened in registers (``u8 << 8`` is the fp16, exactly) between the global load and the
  shared-memory store, so the tensor cores see fp16 as for an fp16 cache.

P from the QK^T accumulator to the A fragment of PV goes through shared memory: the m8n8k4 C fragment spreads a
row's 8 keys over two lanes of a quad (lanes l and l ^ 2, 4 keys each, and each lane holds two rows), while the A
fragment wants one row's 8 keys in one lane, and PV steps through P in k = 8 slices, which a register tensor cannot
be sliced into (a shared descriptor can: ``slice``). So P is stored once as fp16 in the A staging shape
[(step, mb), h, l, k] and read back one step at a time, like every A operand of gemm884.

The softmax reduces over the column bits of the fragment tile itself (softmax_sm70.py: the l and i dims split
into bits, four single-dim reductions, no relabelling to [rows, cols]: Triton 3.6 miscompiles reductions over that
relabelled layout), and the row statistics broadcast back onto the S and O tiles the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ...errors import KernelContractError
from ..common.aot import AotConfig
from ..common.arch import INTERPRET, cuda_device, device_key
from . import DEFAULT_BLOCK_SIZE
from .decode import reduce_splits, split_partials
from .launch import num_decode_splits
from ..common.mma884 import (a_layout, a_smem_shape, acc_rows_cols, b_layout, b_smem_shape, frag_layout, mma884,
                             smem_layout, stage_index, stage_layout_a, stage_layout_b, tile_check)
from .softmax_sm70 import frag_bits, frag_merge, p_to_a_stage, row_ids, row_max, row_sum, rows_bcast


@gluon.jit
def _widen(x, FP8: gl.constexpr):
    """Cache elements -> fp16: e5m2 bytes are the top byte of their fp16 (exact)."""
    if FP8:
        x = (x.to(gl.uint16) << 8).to(gl.float16, bitcast=True)
    return x


@gluon.jit
def _kv_rows(p_table, key, m_key, BS: gl.constexpr, stride_b, stride_s, kvh, stride_h):
    """Offset of each key's cache row (block table gather; BS is a power of two: shifts)."""
    page = gl.load(p_table + key // BS, mask=m_key, other=0)
    return page.to(gl.int64) * stride_b + (key % BS) * stride_s + kvh * stride_h


@gluon.jit
def paged_attn_sm70_kernel(q, k_cache, v_cache, out, gate, part_o, part_ml, block_tables, seq_lens,
                           query_start_loc, qk_scale, NKV, G, TOK, NUM_QT, NUM_SPLITS, BS: gl.constexpr,
                           stride_qt, stride_qh, stride_ot, stride_oh, stride_gt, stride_gh,
                           stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                           D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WM: gl.constexpr,
                           WN: gl.constexpr,
                           FP8: gl.constexpr, HAS_GATE: gl.constexpr, SPLIT: gl.constexpr):
    # WM x WN warps over rows x columns of both tiles (S [BLOCK_M, BLOCK_N], O [BLOCK_M, D]): WN > 1 splits the keys
    # of QK^T and the head dims of PV, and the softmax's row reductions then cross warps
    MB: gl.constexpr = BLOCK_M // 8
    NB: gl.constexpr = BLOCK_N // 8
    ND: gl.constexpr = D // 8
    LF: gl.constexpr = frag_layout(WM, WN)
    LA: gl.constexpr = stage_layout_a(WM * WN)
    LB: gl.constexpr = stage_layout_b(WM * WN)
    LAF: gl.constexpr = a_layout(WM, WN)
    LBF: gl.constexpr = b_layout(WM, WN)

    i_qt = NUM_QT - 1 - gl.program_id(0)      # the longest rows first
    i_bk = gl.program_id(1)
    i_s = gl.program_id(2)
    i_b = i_bk // NKV
    kvh = i_bk % NKV
    q_start = gl.load(query_start_loc + i_b)
    q_len = gl.load(query_start_loc + i_b + 1) - q_start
    tok0 = i_qt * TOK
    if tok0 >= q_len:
        return
    seq_len = gl.load(seq_lens + i_b)
    ctx = seq_len - q_len
    kv_end = ctx + gl.minimum(tok0 + TOK, q_len)
    lo = 0
    hi = kv_end
    if SPLIT:
        per = gl.cdiv(gl.cdiv(kv_end, BLOCK_N), NUM_SPLITS) * BLOCK_N
        lo = i_s * per
        hi = gl.minimum(lo + per, kv_end)
    p_table = block_tables + i_b.to(gl.int64) * stride_bt

    # Q staging [(step, mb), h, l, k]: row 8 mb + 4 h + l of the tile, head dim 8 step + k
    dq, hq_, lq, kq = stage_index(ND * MB, LA)
    r_q = 8 * (dq % MB) + 4 * hq_ + lq
    t_q = tok0 + r_q // G
    m_q = (r_q < TOK * G) & (t_q < q_len)
    p_q = q + (q_start + t_q).to(gl.int64) * stride_qt + (kvh * G + r_q % G) * stride_qh + 8 * (dq // MB) + kq
    s_q = gl.allocate_shared_memory(gl.float16, a_smem_shape(BLOCK_M, D), smem_layout())
    s_q.store(gl.load(p_q, mask=m_q, other=0.0))

    # K^T staging [(step, nb), h, l, k]: key 8 nb + 4 h + l of the tile, head dim 8 step + k (16 bytes per lane)
    dk, hk, lk, kk = stage_index(ND * NB, LA)
    n_k = 8 * (dk % NB) + 4 * hk + lk
    d_k = 8 * (dk // NB) + kk
    # V staging [(step, nd), h, l, k]: key 8 step + k, head dim 8 nd + 4 h + l (8 consecutive dims per lane)
    dv, hv, lv, kv = stage_index(NB * ND, LB)
    n_v = 8 * (dv // ND) + kv
    d_v = 8 * (dv % ND) + 4 * hv + lv
    s_k = gl.allocate_shared_memory(gl.float16, b_smem_shape(D, BLOCK_N), smem_layout())
    s_v = gl.allocate_shared_memory(gl.float16, b_smem_shape(BLOCK_N, D), smem_layout())
    s_p = gl.allocate_shared_memory(gl.float16, a_smem_shape(BLOCK_M, BLOCK_N), smem_layout())

    # row statistics [mb, h, l1, i2] (softmax_sm70.py); r_s / c_s: tile row / key column of each S accumulator
    L8: gl.constexpr = frag_bits(gl.zeros([MB, NB, 2, 4, 8], gl.float32, layout=LF), BLOCK_M, BLOCK_N).type.layout
    L_ROW: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(5, gl.SliceLayout(7, L8))))
    r_s, c_s = acc_rows_cols(BLOCK_M, BLOCK_N, WM, WN)
    pos = ctx + tok0 + r_s // G
    # a finite start keeps fully masked rows at p = 0 instead of exp2(-inf + inf) = NaN
    m_i = gl.full([MB, 2, 2, 2], -1e30, gl.float32, layout=L_ROW)
    l_i = gl.zeros([MB, 2, 2, 2], gl.float32, layout=L_ROW)
    acc = gl.zeros([MB, ND, 2, 4, 8], gl.float32, layout=LF)

    for start in range(lo, hi, BLOCK_N):
        key_k = start + n_k
        m_k = key_k < hi
        b_k = gl.load(k_cache + _kv_rows(p_table, key_k, m_k, BS, stride_kb, stride_ks, kvh, stride_kh) + d_k,
                      mask=m_k, other=0)
        key_v = start + n_v
        m_v = key_v < hi
        # V's loads are issued before the QK^T products, which hide their latency
        b_v = gl.load(v_cache + _kv_rows(p_table, key_v, m_v, BS, stride_vb, stride_vs, kvh, stride_vh) + d_v,
                      mask=m_v, other=0)
        s_k.store(_widen(b_k, FP8))
        s = gl.zeros([MB, NB, 2, 4, 8], gl.float32, layout=LF)
        for j in gl.static_range(ND):
            f_q = s_q.slice(j * MB, MB).load(LAF)
            f_k = s_k.slice(j * NB, NB).load(LBF)
            s = mma884(s, gl.expand_dims(f_q, 1), gl.expand_dims(f_k, 0))
        key = start + c_s
        s = gl.where((key <= pos) & (key < hi), s * qk_scale, float("-inf"))
        s8 = frag_bits(s, BLOCK_M, BLOCK_N)
        m_new = gl.maximum(m_i, row_max(s8))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s8 - rows_bcast(m_new))
        l_i = l_i * alpha + row_sum(p)
        m_i = m_new
        s_p.store(p_to_a_stage(p.to(gl.float16), BLOCK_M, BLOCK_N))
        s_v.store(_widen(b_v, FP8))
        acc = frag_merge(frag_bits(acc, BLOCK_M, D) * rows_bcast(alpha), BLOCK_M, D, LF)
        for j in gl.static_range(NB):
            f_p = s_p.slice(j * MB, MB).load(LAF)
            f_v = s_v.slice(j * ND, ND).load(LBF)
            acc = mma884(acc, gl.expand_dims(f_p, 1), gl.expand_dims(f_v, 0))

    # stores straight from the fragment tile: r_o / c_o are each accumulator's tile row and head dim
    r_o, c_o = acc_rows_cols(BLOCK_M, D, WM, WN)
    t_o = tok0 + r_o // G
    m_o = (r_o < TOK * G) & (t_o < q_len)
    tok = (q_start + t_o).to(gl.int64)
    hq = kvh * G + r_o % G
    if SPLIT:
        row = (tok * (NKV * G) + hq) * NUM_SPLITS + i_s
        gl.store(part_o + row * D + c_o, acc, mask=m_o)
        r_m = row_ids(BLOCK_M, BLOCK_N, WM, WN)
        t_m = tok0 + r_m // G
        m_m = (r_m < TOK * G) & (t_m < q_len)
        row_m = ((q_start + t_m).to(gl.int64) * (NKV * G) + kvh * G + r_m % G) * NUM_SPLITS + i_s
        gl.store(part_ml + row_m * 2, m_i, mask=m_m)
        gl.store(part_ml + row_m * 2 + 1, l_i, mask=m_m)
    else:
        b_o = frag_merge(frag_bits(acc, BLOCK_M, D) / rows_bcast(gl.where(l_i > 0, l_i, 1.0)), BLOCK_M, D, LF)
        if HAS_GATE:
            b_g = gl.load(gate + tok * stride_gt + hq * stride_gh + c_o, mask=m_o, other=0.0).to(gl.float32)
            b_o = b_o / (1.0 + gl.exp(-b_g))
        gl.store(out + tok * stride_ot + hq * stride_oh + c_o, b_o.to(gl.float16), mask=m_o)


# ---------------------------------------------------------------- host side
@dataclass(frozen=True)
class Sm70Attn:
    """One launch of the HMMA.884 attention: block_m rows, block_n keys per step, on wm x wn warps (rows x
    columns of the S and O tiles)."""
    block_m: int
    block_n: int
    wm: int
    wn: int
    ctas_per_sm: int = 1    # resident programs per SM at this shared memory (decode sizes its splits to fill them)

    @property
    def num_warps(self) -> int:
        return self.wm * self.wn

    def check(self, d: int, g: int) -> None:
        """A tile the kernel runs at head dim d for groups of g heads, within a V100 block's shared memory."""
        if self.block_m not in (16, 32, 64, 128) or self.block_n not in (16, 32, 64, 128) or self.block_m < g:
            raise KernelContractError(f"sm_70 attention tile {self}: block_m and block_n must be 16/32/64/128 and "
                                      f"block_m must hold the {g} query heads of a group")
        try:   # the S tile, and the O tile [block_m, d] on the same warps
            tile_check(self.block_m, self.block_n, 8, self.wm, self.wn)
            tile_check(self.block_m, d, 8, self.wm, self.wn)
        except ValueError as e:
            raise KernelContractError(f"sm_70 attention tile {self} at head_dim {d}: {e}") from None
        if self.smem_bytes(d) > _SM70_SMEM:
            raise KernelContractError(f"sm_70 attention tile {self} at head_dim {d} needs {self.smem_bytes(d)} bytes "
                                      f"of shared memory, over the V100's {_SM70_SMEM}; use a smaller block_m or "
                                      f"block_n")

    def smem_bytes(self, d: int) -> int:
        """Q, K, V and P tiles, fp16, one buffer each (sm_70 has no cp.async to fill a second one). With wn > 1 the
        compiler adds the softmax's cross-warp reduction scratch (256-512 B for the table's tiles; the AOT test
        checks the compiled total against 96 KB)."""
        return 2 * (self.block_m * d + 2 * self.block_n * d + self.block_m * self.block_n)


# head_dim -> launch, from the V100's 96 KB of shared memory per SM (and per block), 64K registers per SM and 255 per
# lane. O costs block_m * d / (32 * warps) fp32 registers per lane: at d = 256 and 16 rows per warp that is 128, which
# with S, the fragments and the K/V loads in flight spilled (ptxas), so d = 256 puts 2 warps on the columns (wn: keys
# of S, head dims of O) for 64 per lane. Prefill d = 256: 64 rows x 32 keys is 68 KB (BLOCK_N 64 would be 104 KB,
# 128 rows x 32 keys 100 KB), 8 warps; d = 128: 128 x 64, 80 KB, 8 warps; d = 64: 128 x 64, 48 KB, two programs per
# SM. Decode (:func:`decode_launch`): as many rows as the group's heads x query positions.
PREFILL_SM70 = {64: Sm70Attn(128, 64, 8, 1, 2), 128: Sm70Attn(128, 64, 8, 1), 256: Sm70Attn(64, 32, 4, 2)}
DECODE_SM70_N = (64, 32)    # decode key tiles, the longest that fits
_SM70_SMEM = 96 * 1024


def decode_launch(d: int, rows: int) -> Sm70Attn:
    """Decode tile for ``rows`` = G x q_len query rows (16, 32 or 64; at d = 256 at least 32, for 8 warps): 4 warps,
    8 at d = 256 or 64 rows, the columns split over the warps the rows leave, the longest key tile within 96 KB.
    The K/V tile in flight costs block_n * d / (32 * warps) fp16 per lane and operand: at d = 256 with 4 warps, 64
    of them, and ptxas spilled. Extra rows cost only tensor-core time, which decode has to spare (it waits on
    memory). The split count then fills the SMs' program slots at this shared memory."""
    bm = max(32 if d == 256 else 16, 1 << (max(rows, 1) - 1).bit_length())
    warps = 8 if d == 256 or bm >= 64 else 4
    wm = bm // 16
    wn = max(1, warps // wm)
    c = next(Sm70Attn(bm, bn, wm, wn) for bn in DECODE_SM70_N
             if bn % (16 * wn) == 0 and Sm70Attn(bm, bn, wm, wn).smem_bytes(d) <= _SM70_SMEM)
    return replace(c, ctas_per_sm=max(1, min(8, _SM70_SMEM // c.smem_bytes(d))))


# The sm_70 row's choice of this kernel (False: paged.py's tl.dot kernel, FMA there). On since the H200 run of
# 2026-12-03 (Triton 3.6, after the softmax fix of softmax_sm70.py): test_paged_sm70.py -m gpu 51 passed (prefill
# and decode, fp16 and e5m2, d 64/128/256, GQA 6:1 / 8:1 / 1:1, 1 and 5 rows per sequence, splits 1-17, KV blocks
# 8-32; max error 2.4e-4-2e-3 against the fp32 twin, bound 4e-3).
ENABLED = True


def sm70_applies(arch: int, q, k_cache) -> bool:
    """Whether the HMMA.884 kernel takes this call: ``ENABLED``, the sm_70 row, fp16 queries, an fp16 or e5m2 cache,
    a head dim it tiles, and a compiled run on an NVIDIA GPU (the interpreter has no Gluon: the tl.dot kernel is its
    twin)."""
    return (ENABLED and arch == 70 and q.dtype == torch.float16 and k_cache.dtype in (torch.float16, torch.uint8)
            and q.shape[-1] in PREFILL_SM70 and cuda_device(q.device) and torch.version.hip is None
            and not INTERPRET)


def paged_attention_sm70(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, max_query_len,
                         max_seq_len, gate=None, num_splits=None, cfg: Sm70Attn | None = None):
    """:func:`catengine.kernels.attention.naive.paged_attention` on m8n8k4 (fp16 queries, fp16 or e5m2 cache).
    ``num_splits`` and ``cfg`` override the decode split count and the table's launch (tests)."""
    from .paged import DECODE_MAX_QUERY, LOG2E, check_paged_inputs   # paged.py dispatches here
    check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, gate)
    t, nh, d = q.shape
    if q.dtype != torch.float16 or k_cache.dtype not in (torch.float16, torch.uint8):
        raise KernelContractError(f"the sm_70 attention takes fp16 queries (sm_70 has no bf16) and an fp16 or e5m2 "
                                  f"(uint8) cache, got {q.dtype} and {k_cache.dtype}")
    if not cuda_device(q.device):
        raise KernelContractError(f"paged_attention_sm70 runs on CUDA only (Gluon has no interpreter), got {q.device}")
    nkv, bs = k_cache.shape[2], k_cache.shape[1]
    g = nh // nkv
    out = torch.empty((t, nh, d), dtype=q.dtype, device=q.device)
    b = seq_lens.shape[0]
    if t == 0 or b == 0 or max_query_len <= 0:
        return out
    decode = max_query_len <= DECODE_MAX_QUERY and g * max_query_len <= 64
    cfg = cfg or (decode_launch(d, g * max_query_len) if decode else PREFILL_SM70[d])
    cfg.check(d, g)
    if decode and cfg.block_m >= g * max_query_len:
        tok, num_qt = max_query_len, 1
        if num_splits is None:
            num_splits = num_decode_splits(b, nkv, max_seq_len, cfg, device_key(q.device)[1])
    else:
        tok = cfg.block_m // g
        num_qt, num_splits = triton.cdiv(max_query_len, tok), 1
    split = num_splits > 1
    has_gate = gate is not None
    g_arg = gate if has_gate else q
    part_o, part_ml = split_partials(t, nh, num_splits, d, q.device)
    paged_attn_sm70_kernel[(num_qt, b * nkv, num_splits)](
        q, k_cache, v_cache, out, g_arg, part_o, part_ml, block_tables, seq_lens, query_start_loc,
        scale * LOG2E, nkv, g, tok, num_qt, num_splits, bs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), g_arg.stride(0), g_arg.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, WM=cfg.wm, WN=cfg.wn, FP8=k_cache.dtype == torch.uint8,
        HAS_GATE=has_gate, SPLIT=split, num_warps=cfg.num_warps)
    if split:
        reduce_splits(part_o, part_ml, out, g_arg, nh, num_splits, has_gate)
    return out


def _signature(kv: str) -> dict:
    sig = {"q": "*fp16", "k_cache": f"*{kv}", "v_cache": f"*{kv}", "out": "*fp16", "gate": "*fp16",
           "part_o": "*fp32", "part_ml": "*fp32", "block_tables": "*i32", "seq_lens": "*i32",
           "query_start_loc": "*i32", "qk_scale": "fp32"}
    for name in ("NKV", "G", "TOK", "NUM_QT", "NUM_SPLITS", "stride_qt", "stride_qh", "stride_ot", "stride_oh",
                 "stride_gt", "stride_gh", "stride_kb", "stride_ks", "stride_kh", "stride_vb", "stride_vs",
                 "stride_vh", "stride_bt"):
        sig[name] = "i32"
    sig.update({c: "constexpr" for c in ("BS", "D", "BLOCK_M", "BLOCK_N", "WM", "WN", "FP8", "HAS_GATE", "SPLIT")})
    return sig


def aot_configs(cc: int) -> list[AotConfig]:
    """Every head dim's prefill launch and its decode launches for 6 rows (a 6:1 group) and 40 (8 heads x 5
    speculative positions), at d = 256 also unsplit, for both cache dtypes, gated, at the default block size (other
    sizes compile the same source; CI's compile time is the limit).
    The kernel is arch-neutral Gluon: the same list builds for sm_90 (the H200 runs it emulated)."""
    out = []

    def add(c: Sm70Attn, d: int, kv: str, split: bool, name: str):
        consts = dict(BS=DEFAULT_BLOCK_SIZE, D=d, BLOCK_M=c.block_m, BLOCK_N=c.block_n, WM=c.wm, WN=c.wn,
                      FP8=kv == "u8", HAS_GATE=True, SPLIT=split)
        out.append(AotConfig("paged_attn_sm70_kernel", _signature(kv), consts, c.num_warps, 1,
                             f"sm70 {name} d{d} kv {kv} {c.block_m}x{c.block_n} split {split}"))

    for d in (64, 128, 256):
        for kv in ("fp16", "u8"):
            add(PREFILL_SM70[d], d, kv, False, "prefill")
            for rows in (6, 40):
                add(decode_launch(d, rows), d, kv, True, "decode")
            if d == 256:
                add(decode_launch(d, 6), d, kv, False, "decode")
    return out


__all__ = ["ENABLED", "paged_attention_sm70", "sm70_applies", "Sm70Attn", "PREFILL_SM70", "DECODE_SM70_N", "decode_launch",
           "paged_attn_sm70_kernel", "aot_configs"]
