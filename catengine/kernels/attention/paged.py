"""Paged causal GQA attention over the KV cache (twin: ``attention.naive.paged_attention``).

One kernel body, two launch shapes picked by ``max_query_len`` (on the sm_70 row, fp16 runs paged_sm70.py's
HMMA.884 kernel instead, with the same grid and row packing, while ``paged_sm70.ENABLED``):

* prefill (``max_query_len > DECODE_MAX_QUERY``): grid (query tiles, B * nkv). A program owns
  ``TOK = BLOCK_M // G`` consecutive new tokens of one sequence times the ``G = nh / nkv`` query
  heads sharing one KV head (rows ordered token-major), so each K/V tile is read once for the whole
  group. Key tiles every row can see run without masks; the diagonal tiles apply the causal mask.
  The last query tiles (the longest rows) are launched first.
* decode (one new token per sequence, or a few for speculative verification): grid
  (1, B * nkv, splits). Every row of the group's ``G * q_len`` queries is in one tile, and the
  sequence's KV range is cut into ``splits`` pieces so that a small batch still fills the GPU; a
  second kernel combines the pieces' (unnormalised output, max, sum) rows.

Pages are gathered per key row (``block_tables[b, pos // block_size]``), so any block size works; it
is a compile-time constant, as a run-time divisor cost each key row a division sequence (the gather
was 15% of the decode loop's instructions), and key tiles start at multiples of BLOCK_N, so with
power-of-two sizes a row's slot in its block is loop-invariant.
fp8 e5m2 caches are read as int16 byte pairs and widened exactly (even and odd head dims separately)
by shifts or, with the launch row's ``widen_asm``, by one inline-PTX prmt / and per 4 bytes; the math
is fp32 with the dot operands in q's dtype; the optional sigmoid gate is applied in the epilogue.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from ...errors import ConfigError, KernelContractError
from ..common.aot import AotConfig
from ..common.arch import INTERPRET, arch_from_cc, arch_of, device_key
from ..common.e5m2_jit import e5m2_pair
from .decode import REDUCE_BLOCK_D, REDUCE_BLOCK_S, kv_tile, reduce_splits, split_partials, split_reduce_kernel
from . import DEFAULT_BLOCK_SIZE
from .paged_sm70 import paged_attention_sm70, sm70_applies
from .launch import DECODE, DECODE_E5M2, PREFILL, AttnLaunch, decode_warps, num_decode_splits, table_launch

DECODE_MAX_QUERY = 8          # up to this many new tokens per sequence use the split-KV decode launch
LOG2E = 1.4426950408889634


@triton.jit
def _qk(b_q, b_q2, k_cache, p_table, start, m_n, kvh, BS, stride_kb, stride_ks, stride_kh, D: tl.constexpr,
        BLOCK_N: tl.constexpr, FP8: tl.constexpr, MASK: tl.constexpr, WIDEN_ASM: tl.constexpr):
    """[BLOCK_M, BLOCK_N] fp32 q.k for the keys start + [0, BLOCK_N); e5m2: q.k = q_even.k_even +
    q_odd.k_odd over int16 byte pairs (b_q, b_q2 = even, odd columns of q)."""
    if FP8:
        b_k_lo, b_k_hi = e5m2_pair(kv_tile(k_cache, p_table, start, m_n, kvh, tl.arange(0, D // 2), BS,
                                           stride_kb, stride_ks, stride_kh, BLOCK_N, MASK), b_q.dtype, WIDEN_ASM)
        b_s = tl.dot(b_q2, tl.trans(b_k_hi), tl.dot(b_q, tl.trans(b_k_lo)))
    else:
        b_k = kv_tile(k_cache, p_table, start, m_n, kvh, tl.arange(0, D), BS, stride_kb, stride_ks, stride_kh,
                      BLOCK_N, MASK)
        b_s = tl.dot(b_q, tl.trans(b_k.to(b_q.dtype)))
    return b_s


@triton.jit
def _attend(acc, acc2, l_i, m_i, b_q, b_q2, k_cache, v_cache, p_table, kvh, pos, lo, hi, qk_scale, BS,
            stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, D: tl.constexpr,
            BLOCK_N: tl.constexpr, FP8: tl.constexpr, MASK: tl.constexpr, WIDEN_ASM: tl.constexpr):
    """Online-softmax accumulation over keys [lo, hi); MASK applies causality and the hi bound.
    e5m2: acc and acc2 hold the even and odd output columns (widened bytes would reach the MMA through
    byte-wise shared-memory loads, which made e5m2 decode as slow as fp16); otherwise acc2 is unused."""
    dt = b_q.dtype
    for start in range(lo, hi, BLOCK_N):
        o_n = start + tl.arange(0, BLOCK_N)
        m_n = o_n < hi
        b_s = _qk(b_q, b_q2, k_cache, p_table, start, m_n, kvh, BS, stride_kb, stride_ks, stride_kh, D, BLOCK_N,
                  FP8, MASK, WIDEN_ASM) * qk_scale
        if MASK:
            b_s = tl.where((o_n[None, :] <= pos[:, None]) & m_n[None, :], b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        alpha = tl.exp2(m_i - m_new)
        b_p = tl.exp2(b_s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(b_p, 1)
        m_i = m_new
        b_p = b_p.to(dt)
        if FP8:
            b_v_lo, b_v_hi = e5m2_pair(kv_tile(v_cache, p_table, start, m_n, kvh, tl.arange(0, D // 2), BS,
                                               stride_vb, stride_vs, stride_vh, BLOCK_N, MASK), dt, WIDEN_ASM)
            acc = acc * alpha[:, None] + tl.dot(b_p, b_v_lo)
            acc2 = acc2 * alpha[:, None] + tl.dot(b_p, b_v_hi)
        else:
            b_v = kv_tile(v_cache, p_table, start, m_n, kvh, tl.arange(0, D), BS, stride_vb, stride_vs, stride_vh,
                          BLOCK_N, MASK)
            acc = acc * alpha[:, None] + tl.dot(b_p, b_v.to(dt))
    return acc, acc2, l_i, m_i


@triton.jit
def paged_attn_kernel(q, k_cache, v_cache, out, gate, part_o, part_ml, block_tables, seq_lens,
                      query_start_loc, qk_scale, NKV, G, TOK, NUM_QT, NUM_SPLITS, BS: tl.constexpr,
                      stride_qt, stride_qh, stride_ot, stride_oh, stride_gt, stride_gh,
                      stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr,
                      HAS_GATE: tl.constexpr, SPLIT: tl.constexpr, TWO_PHASE: tl.constexpr,
                      WIDEN_ASM: tl.constexpr):
    i_qt = NUM_QT - 1 - tl.program_id(0)
    i_bk = tl.program_id(1)
    i_s = tl.program_id(2)
    i_b = i_bk // NKV
    kvh = i_bk % NKV
    q_start = tl.load(query_start_loc + i_b)
    q_len = tl.load(query_start_loc + i_b + 1) - q_start
    tok0 = i_qt * TOK
    if tok0 >= q_len:
        return
    seq_len = tl.load(seq_lens + i_b)
    ctx = seq_len - q_len
    o_m = tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, D)
    t = tok0 + o_m // G
    hq = kvh * G + o_m % G
    m_row = (o_m < TOK * G) & (t < q_len)
    pos = ctx + t
    tok = (q_start + t).to(tl.int64)
    p_q = q + tok * stride_qt + hq * stride_qh
    kv_end = ctx + tl.minimum(tok0 + TOK, q_len)
    lo = 0
    hi = kv_end
    if SPLIT:
        per = tl.cdiv(tl.cdiv(kv_end, BLOCK_N), NUM_SPLITS) * BLOCK_N
        lo = i_s * per
        hi = tl.minimum(lo + per, kv_end)
    # keys below full_end are visible to every row of the tile: no mask there
    full_end = ((ctx + tok0 + 1) // BLOCK_N) * BLOCK_N
    mid = tl.minimum(tl.maximum(full_end, lo), hi) if TWO_PHASE else lo
    p_table = block_tables + i_b.to(tl.int64) * stride_bt
    # a finite start keeps fully masked rows at p = 0 instead of exp2(-inf + inf) = NaN
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if FP8:
        o_w = tl.arange(0, D // 2)
        # [BLOCK_M, D // 2] each: even and odd columns of q
        b_q = tl.load(p_q[:, None] + 2 * o_w[None, :], mask=m_row[:, None], other=0.0)
        b_q2 = tl.load(p_q[:, None] + 2 * o_w[None, :] + 1, mask=m_row[:, None], other=0.0)
    else:
        # [BLOCK_M, D]
        b_q = tl.load(p_q[:, None] + o_d[None, :], mask=m_row[:, None], other=0.0)
        b_q2 = b_q
    if FP8:
        acc = tl.zeros([BLOCK_M, D // 2], tl.float32)
        acc2 = tl.zeros([BLOCK_M, D // 2], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        acc2 = tl.zeros([1, 1], tl.float32)
    if TWO_PHASE:
        acc, acc2, l_i, m_i = _attend(acc, acc2, l_i, m_i, b_q, b_q2, k_cache, v_cache, p_table, kvh, pos, lo, mid,
                                      qk_scale, BS, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                      D, BLOCK_N, FP8, False, WIDEN_ASM)
    acc, acc2, l_i, m_i = _attend(acc, acc2, l_i, m_i, b_q, b_q2, k_cache, v_cache, p_table, kvh, pos, mid, hi,
                                  qk_scale, BS, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                  D, BLOCK_N, FP8, True, WIDEN_ASM)
    if FP8:
        acc = tl.reshape(tl.join(acc, acc2), (BLOCK_M, D))
    if SPLIT:
        row = (tok * (NKV * G) + hq) * NUM_SPLITS + i_s
        tl.store(part_o + row[:, None] * D + o_d[None, :], acc, mask=m_row[:, None])
        tl.store(part_ml + row * 2, m_i, mask=m_row)
        tl.store(part_ml + row * 2 + 1, l_i, mask=m_row)
    else:
        b_o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        if HAS_GATE:
            # [BLOCK_M, D]
            b_g = tl.load(gate + tok[:, None] * stride_gt + hq[:, None] * stride_gh + o_d[None, :],
                          mask=m_row[:, None], other=0.0).to(tl.float32)
            b_o = b_o * tl.sigmoid(b_g)
        tl.store(out + tok[:, None] * stride_ot + hq[:, None] * stride_oh + o_d[None, :],
                 b_o.to(out.dtype.element_ty), mask=m_row[:, None])


def _inline_ptx(device: torch.device) -> bool:
    """Inline PTX runs only in compiled kernels on NVIDIA GPUs (not in the interpreter, not on ROCm)."""
    return device.type == "cuda" and torch.version.hip is None and not INTERPRET


def check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, gate):
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise KernelContractError(f"paged_attention: q must be [T, nh, d] and caches [num_blocks, block_size, nkv, "
                                  f"d]; got q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    nh, d, nkv = q.shape[1], q.shape[2], k_cache.shape[2]
    if k_cache.shape[3] != d or nh % nkv:
        raise KernelContractError(f"paged_attention: head_dim {d} vs cache {k_cache.shape[3]}, or {nh} query heads "
                                  f"not a multiple of {nkv} KV heads")
    if d not in (64, 128, 256):
        raise ConfigError(f"paged_attention: head_dim {d} has no launch config; supported: 64, 128, 256")
    if nh // nkv > 64:
        raise ConfigError(f"paged_attention: GQA group of {nh // nkv} heads exceeds 64 rows per tile")
    if gate is not None and gate.shape != q.shape:
        raise KernelContractError(f"paged_attention: gate {tuple(gate.shape)} must match q {tuple(q.shape)}")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("gate", gate)):
        if x is not None and x.stride(-1) != 1:
            raise KernelContractError(f"paged_attention: {name} must be contiguous in its last dim")
    if block_tables.stride(-1) != 1 or block_tables.dtype != torch.int32:
        raise KernelContractError("paged_attention: block_tables must be a row-contiguous int32 tensor")
    if seq_lens.dtype != torch.int32 or query_start_loc.dtype != torch.int32:
        raise KernelContractError("paged_attention: seq_lens and query_start_loc must be int32")


def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale: float,
                    max_query_len: int, max_seq_len: int, gate=None):
    """Triton twin of :func:`catengine.kernels.attention.naive.paged_attention`."""
    return paged_attention_with(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                                max_query_len, max_seq_len, gate)


def paged_attention_with(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, max_query_len,
                         max_seq_len, gate=None, arch=None, num_splits=None, cfg: AttnLaunch | None = None):
    """``arch``, ``num_splits`` and ``cfg`` override the table row, the split count and the launch
    (tests run every row in the interpreter; the benchmark compares candidate launches)."""
    check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, gate)
    t, nh, d = q.shape
    nkv, bs = k_cache.shape[2], k_cache.shape[1]
    g = nh // nkv
    out = torch.empty((t, nh, d), dtype=q.dtype, device=q.device)
    b = seq_lens.shape[0]
    if t == 0 or b == 0 or max_query_len <= 0:
        return out
    arch = arch or arch_of(q.device)
    if cfg is None and sm70_applies(arch, q, k_cache):   # Volta tensor cores (tl.dot is FMA there)
        return paged_attention_sm70(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                                    max_query_len, max_seq_len, gate, num_splits=num_splits)
    decode = max_query_len <= DECODE_MAX_QUERY
    fp8 = k_cache.dtype == torch.uint8
    cfg = cfg or table_launch(arch, d, decode, fp8)
    num_warps = cfg.num_warps
    if decode:
        block_m = max(cfg.block_m, triton.next_power_of_2(g * max_query_len))
        num_warps = decode_warps(cfg, block_m)
        tok, num_qt = max_query_len, 1
        if num_splits is None:
            sms = device_key(q.device)[1]
            num_splits = num_decode_splits(b, nkv, max_seq_len, cfg, sms)
    else:
        block_m = max(cfg.block_m, triton.next_power_of_2(g))
        tok = block_m // g
        num_qt, num_splits = triton.cdiv(max_query_len, tok), 1
    split = num_splits > 1
    if fp8:  # e5m2 bytes read as int16 pairs (strides below are in pairs)
        k_cache, v_cache = k_cache.view(torch.int16), v_cache.view(torch.int16)
    has_gate = gate is not None
    g_arg = gate if has_gate else q
    part_o, part_ml = split_partials(t, nh, num_splits, d, q.device)
    paged_attn_kernel[(num_qt, b * nkv, num_splits)](
        q, k_cache, v_cache, out, g_arg, part_o, part_ml, block_tables, seq_lens, query_start_loc,
        scale * LOG2E, nkv, g, tok, num_qt, num_splits, bs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), g_arg.stride(0), g_arg.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        D=d, BLOCK_M=block_m, BLOCK_N=cfg.block_n, FP8=fp8, HAS_GATE=has_gate, SPLIT=split,
        TWO_PHASE=cfg.two_phase, WIDEN_ASM=fp8 and cfg.widen_asm and _inline_ptx(q.device),
        num_warps=num_warps, num_stages=cfg.num_stages)
    if split:
        reduce_splits(part_o, part_ml, out, g_arg, nh, num_splits, has_gate)
    return out




def _attn_signature(act: str, kv: str) -> dict:
    kv = "i16" if kv == "u8" else kv
    sig = {"q": f"*{act}", "k_cache": f"*{kv}", "v_cache": f"*{kv}", "out": f"*{act}", "gate": f"*{act}",
           "part_o": "*fp32", "part_ml": "*fp32", "block_tables": "*i32", "seq_lens": "*i32",
           "query_start_loc": "*i32", "qk_scale": "fp32"}
    for name in ("NKV", "G", "TOK", "NUM_QT", "NUM_SPLITS", "stride_qt", "stride_qh", "stride_ot",
                 "stride_oh", "stride_gt", "stride_gh", "stride_kb", "stride_ks", "stride_kh", "stride_vb",
                 "stride_vs", "stride_vh", "stride_bt"):
        sig[name] = "i32"
    sig.update({c: "constexpr" for c in ("BS", "D", "BLOCK_M", "BLOCK_N", "FP8", "HAS_GATE", "SPLIT", "TWO_PHASE",
                                         "WIDEN_ASM")})
    return sig


def aot_configs(cc: int) -> list[AotConfig]:
    """Every table row, for the gated Qwen3.5 layer in the arch's model dtype (fp16 on sm_70, bf16 on
    sm_80+) and the engine's default block size, with the model-dtype cache and, for d = 256, the e5m2
    cache; decode also in its speculative (4 tokens x 6 heads -> 32 rows) and unsplit shapes, and the e5m2
    decode row with the other widening too (the inline PTX must assemble for sm_70 and sm_90)."""
    arch = arch_from_cc(cc)
    act = "fp16" if arch == 70 else "bf16"
    block_size = DEFAULT_BLOCK_SIZE
    out = []

    def add(c: AttnLaunch, kv: str, d: int, bm: int, split: bool, name: str):
        consts = dict(BS=block_size, D=d, BLOCK_M=bm, BLOCK_N=c.block_n, FP8=kv == "u8", HAS_GATE=True,
                      SPLIT=split, TWO_PHASE=c.two_phase, WIDEN_ASM=kv == "u8" and c.widen_asm)
        warps = c.num_warps if name == "prefill" else decode_warps(c, bm)
        out.append(AotConfig("paged_attn_kernel", _attn_signature(act, kv), consts, warps, c.num_stages,
                             f"{name} d{d} kv {kv} rows {bm} split {split} widen_asm {consts['WIDEN_ASM']}"))

    for d in (64, 128, 256):
        for kv in ((act, "u8") if d == 256 else (act,)):
            p, c = table_launch(arch, d, False, kv == "u8"), table_launch(arch, d, True, kv == "u8")
            add(p, kv, d, p.block_m, False, "prefill")
            for bm, split in (((c.block_m, True), (32, True), (c.block_m, False)) if d == 256 else
                              ((c.block_m, True),)):
                add(c, kv, d, bm, split, "decode")
            if kv == "u8":
                add(dataclasses.replace(c, widen_asm=not c.widen_asm), kv, d, c.block_m, True, "decode")
        sig = {"part_o": "*fp32", "part_ml": "*fp32", "out": f"*{act}", "gate": f"*{act}"}
        sig.update({n: "i32" for n in ("NH", "NUM_SPLITS", "stride_ot", "stride_oh", "stride_gt", "stride_gh")})
        sig.update(D="constexpr", BLOCK_S="constexpr", BLOCK_D="constexpr", HAS_GATE="constexpr")
        out.append(AotConfig("split_reduce_kernel", sig, dict(D=d, BLOCK_S=REDUCE_BLOCK_S, BLOCK_D=REDUCE_BLOCK_D,
                                                              HAS_GATE=True), 4, 1, f"split reduce d{d}"))
    return out


__all__ = ["paged_attention", "num_decode_splits", "PREFILL", "DECODE", "DECODE_E5M2", "DECODE_MAX_QUERY",
           "aot_configs", "AttnLaunch", "table_launch", "decode_warps"]
