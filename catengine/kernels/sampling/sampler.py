"""Batch sampler: temperature, top-k, top-p, min-p per row, no sort and no host sync
(twin: ``sampling.naive.sample_tokens``).

The twin keeps a prefix of the tokens sorted by probability (top-k, then top-p on the unrenormalised
mass, then min-p) and returns ``argmax(p / -log(u))`` over it. Every filter keeps all tokens with
p >= some threshold, so instead of sorting we draw first and check after:

1. ``_max_kernel`` (rows x vocab chunks): chunk max logit and its first index (greedy rows end here).
2. ``_pass_kernel`` stage 1: with e = exp(x - x_max), x = logits / T: the chunk's sum of e and its
   best score e / -log(u) among tokens with e >= min_p (p >= min_p * p_max).
3. ``_pass_kernel`` stage 2 (only rows with top-k or top-p): for the row's best token w, the chunk's
   count and mass of tokens with e > e_w, and its best score among them.
4. ``_finish_kernel`` (one program per row): w is the answer if fewer than top_k tokens and less than
   top_p of the mass lie above it; otherwise every token at or below w is filtered too, so the next
   candidate is the best token above w, checked the same way (a loop over the whole row; since w is a
   draw from the candidates, more than one round is rare).
The answer equals the twin's: a kept w that is the best score over a superset of the kept set is the
best over the kept set. Results differ only where two values tie within float rounding.
The uniforms ``u`` are the twin's counter-based hash, recomputed bit for bit in uint32 arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...errors import KernelContractError
from ..common.aot import AotConfig
from ..common.arch import arch_from_cc, arch_of


@dataclass(frozen=True)
class SampleLaunch:
    chunk: int       # vocab entries per program in the parallel passes
    block: int       # vocab entries per inner step
    num_warps: int


TABLE = {70: SampleLaunch(8192, 1024, 4), 80: SampleLaunch(8192, 2048, 8), 90: SampleLaunch(8192, 2048, 8)}
# rows of the fp32 partials [B, 8, C] and of the int32 partials [B, 4, C]
_F_MAX, _F_Z, _F_S1, _F_E1, _F_MASS, _F_S2, _F_E2 = (tl.constexpr(i) for i in range(7))
_I_MAX, _I_1, _I_CNT, _I_2 = (tl.constexpr(i) for i in range(4))


@triton.jit
def _hash32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _row_key(seeds, steps, i_b):
    seed = tl.load(seeds + i_b)
    key = _hash32(seed.to(tl.uint32) ^ _hash32((seed >> 32).to(tl.uint32) + 0x9E3779B9))
    return _hash32(key ^ tl.load(steps + i_b).to(tl.uint32))


@triton.jit
def _pass(p_row, lo, hi, temp, x_max, key, thr, INCLUSIVE: tl.constexpr, BLOCK: tl.constexpr):
    """Over vocab [lo, hi): (sum e, count and mass of e above thr, best score above thr, its index, its e)."""
    z = tl.zeros([BLOCK], tl.float32)
    cnt = tl.zeros([BLOCK], tl.int32)
    mass = tl.zeros([BLOCK], tl.float32)
    bs = tl.full([BLOCK], -1.0, tl.float32)
    bi = tl.full([BLOCK], -1, tl.int32)
    be = tl.zeros([BLOCK], tl.float32)
    for v0 in range(lo, hi, BLOCK):
        o_v = v0 + tl.arange(0, BLOCK)
        m_v = o_v < hi
        # [BLOCK]
        b_l = tl.load(p_row + o_v, mask=m_v, other=float("-inf"))
        e = tl.exp(tl.math.div_rn(b_l, temp) - x_max)
        r = _hash32(key + o_v.to(tl.uint32) * 0x9E3779B9)
        u = ((r >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08
        s = e / -tl.log(u)
        if INCLUSIVE:
            above = (e >= thr) & m_v
        else:
            above = (e > thr) & m_v
        z += e
        cnt += above.to(tl.int32)
        mass += tl.where(above, e, 0.0)
        # strict > keeps the first index per lane, as torch.argmax does
        upd = above & (s > bs)
        bs = tl.where(upd, s, bs)
        bi = tl.where(upd, o_v, bi)
        be = tl.where(upd, e, be)
    best, idx, e_best = _best(bs, bi, be)
    return tl.sum(z, 0), tl.sum(cnt, 0), tl.sum(mass, 0), best, idx, e_best


@triton.jit
def _best(score, idx, e):
    """Highest score (-1 if none), its lowest index (-1 if none) and that token's e."""
    top = tl.max(score, 0)
    i = tl.min(tl.where((score == top) & (idx >= 0), idx, 2147483647), 0)
    i = tl.where(top < 0, -1, i)
    return top, i, tl.max(tl.where(idx == i, e, -1.0), 0)


@triton.jit
def _max_kernel(logits, part_f, part_i, V, C, stride_l, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    i_b = tl.program_id(0)
    i_c = tl.program_id(1)
    p_row = logits + i_b.to(tl.int64) * stride_l
    bm = tl.full([BLOCK], float("-inf"), tl.float32)
    bi = tl.full([BLOCK], 2147483647, tl.int32)
    for v0 in range(i_c * CHUNK, tl.minimum(i_c * CHUNK + CHUNK, V), BLOCK):
        o_v = v0 + tl.arange(0, BLOCK)
        # [BLOCK]
        b_l = tl.load(p_row + o_v, mask=o_v < V, other=float("-inf"))
        upd = b_l > bm
        bm = tl.where(upd, b_l, bm)
        bi = tl.where(upd, o_v, bi)
    top = tl.max(bm, 0)
    base = (i_b * 8 + _F_MAX) * C + i_c
    tl.store(part_f + base, top)
    tl.store(part_i + (i_b * 4 + _I_MAX) * C + i_c, tl.min(tl.where(bm == top, bi, 2147483647), 0))


@triton.jit
def _row_max(part_f, part_i, i_b, C, C_P2: tl.constexpr):
    o_c = tl.arange(0, C_P2)
    m_c = o_c < C
    # [C_P2]
    b_m = tl.load(part_f + (i_b * 8 + _F_MAX) * C + o_c, mask=m_c, other=float("-inf"))
    # [C_P2]
    b_i = tl.load(part_i + (i_b * 4 + _I_MAX) * C + o_c, mask=m_c, other=2147483647)
    top = tl.max(b_m, 0)
    return top, tl.min(tl.where(b_m == top, b_i, 2147483647), 0)


@triton.jit
def _combine(part_f, part_i, i_b, C, F_S: tl.constexpr, F_E: tl.constexpr, I_I: tl.constexpr,
             C_P2: tl.constexpr):
    o_c = tl.arange(0, C_P2)
    m_c = o_c < C
    # [C_P2] each
    b_s = tl.load(part_f + (i_b * 8 + F_S) * C + o_c, mask=m_c, other=-1.0)
    b_e = tl.load(part_f + (i_b * 8 + F_E) * C + o_c, mask=m_c, other=0.0)
    b_i = tl.load(part_i + (i_b * 4 + I_I) * C + o_c, mask=m_c, other=-1)
    return _best(b_s, b_i, b_e)


@triton.jit
def _sum_row(part, i_b, C, ROW: tl.constexpr, NROWS: tl.constexpr, C_P2: tl.constexpr):
    o_c = tl.arange(0, C_P2)
    # [C_P2]
    return tl.sum(tl.load(part + (i_b * NROWS + ROW) * C + o_c, mask=o_c < C, other=0), 0)


@triton.jit
def _pass_kernel(logits, temperature, top_k, top_p, min_p, seeds, steps, part_f, part_i, V, C, stride_l,
                 STAGE: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, C_P2: tl.constexpr):
    i_b = tl.program_id(0)
    i_c = tl.program_id(1)
    temp = tl.load(temperature + i_b)
    if temp <= 0:
        return
    if STAGE == 2:
        if (tl.load(top_k + i_b) <= 0) & (tl.load(top_p + i_b) >= 1.0):
            return
    l_max, _ = _row_max(part_f, part_i, i_b, C, C_P2)
    x_max = tl.math.div_rn(l_max, temp)
    key = _row_key(seeds, steps, i_b)
    p_row = logits + i_b.to(tl.int64) * stride_l
    lo = i_c * CHUNK
    hi = tl.minimum(lo + CHUNK, V)
    if STAGE == 1:
        z, _, _, s, i, e = _pass(p_row, lo, hi, temp, x_max, key, tl.load(min_p + i_b), True, BLOCK)
        tl.store(part_f + (i_b * 8 + _F_Z) * C + i_c, z)
        tl.store(part_f + (i_b * 8 + _F_S1) * C + i_c, s)
        tl.store(part_f + (i_b * 8 + _F_E1) * C + i_c, e)
        tl.store(part_i + (i_b * 4 + _I_1) * C + i_c, i)
    else:
        _, w_i, w_e = _combine(part_f, part_i, i_b, C, _F_S1, _F_E1, _I_1, C_P2)
        if w_i >= 0:
            _, cnt, mass, s, i, e = _pass(p_row, lo, hi, temp, x_max, key, w_e, False, BLOCK)
            tl.store(part_i + (i_b * 4 + _I_CNT) * C + i_c, cnt)
            tl.store(part_f + (i_b * 8 + _F_MASS) * C + i_c, mass)
            tl.store(part_f + (i_b * 8 + _F_S2) * C + i_c, s)
            tl.store(part_f + (i_b * 8 + _F_E2) * C + i_c, e)
            tl.store(part_i + (i_b * 4 + _I_2) * C + i_c, i)


@triton.jit
def _finish_kernel(logits, temperature, top_k, top_p, min_p, seeds, steps, part_f, part_i, out, V, C,
                   stride_l, BLOCK: tl.constexpr, C_P2: tl.constexpr):
    i_b = tl.program_id(0)
    temp = tl.load(temperature + i_b)
    l_max, arg = _row_max(part_f, part_i, i_b, C, C_P2)
    if temp > 0:
        k = tl.load(top_k + i_b)
        tp = tl.load(top_p + i_b)
        _, w_i, w_e = _combine(part_f, part_i, i_b, C, _F_S1, _F_E1, _I_1, C_P2)
        if (w_i >= 0) & ((k > 0) | (tp < 1.0)):
            z = _sum_row(part_f, i_b, C, _F_Z, 8, C_P2)
            cnt = _sum_row(part_i, i_b, C, _I_CNT, 4, C_P2)
            mass = _sum_row(part_f, i_b, C, _F_MASS, 8, C_P2)
            _, n_i, n_e = _combine(part_f, part_i, i_b, C, _F_S2, _F_E2, _I_2, C_P2)
            x_max = tl.math.div_rn(l_max, temp)
            key = _row_key(seeds, steps, i_b)
            p_row = logits + i_b.to(tl.int64) * stride_l
            kept = ((k <= 0) | (cnt < k)) & (mass < tp * z)
            go = (kept == 0) & (n_i >= 0)
            w_i = tl.where(kept, w_i, tl.where(n_i >= 0, n_i, 0))
            w_e = tl.where(kept, w_e, n_e)
            while go:
                _, cnt, mass, _, n_i, n_e = _pass(p_row, 0, V, temp, x_max, key, w_e, False, BLOCK)
                kept = ((k <= 0) | (cnt < k)) & (mass < tp * z)
                go = (kept == 0) & (n_i >= 0)
                w_i = tl.where(kept, w_i, tl.where(n_i >= 0, n_i, 0))
                w_e = tl.where(kept, w_e, n_e)
        arg = tl.where(w_i >= 0, w_i, 0)
    tl.store(out + i_b, arg.to(tl.int64))


def sample_tokens(logits, temperature, top_k, top_p, min_p, seeds, steps):
    """Triton twin of :func:`catengine.kernels.sampling.naive.sample_tokens`."""
    return sample_tokens_with(logits, temperature, top_k, top_p, min_p, seeds, steps)


def sample_tokens_with(logits, temperature, top_k, top_p, min_p, seeds, steps, cfg: SampleLaunch | None = None):
    """``cfg`` overrides the table row (tests use small chunks to cover the cross-chunk combines)."""
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(-1) != 1:
        raise KernelContractError(f"sample_tokens: logits must be [B, V] fp32 contiguous in V, got "
                                  f"{tuple(logits.shape)} {logits.dtype}")
    b, v = logits.shape
    for name, x, dt in (("temperature", temperature, torch.float32), ("top_k", top_k, torch.int32),
                        ("top_p", top_p, torch.float32), ("min_p", min_p, torch.float32),
                        ("seeds", seeds, torch.int64), ("steps", steps, torch.int64)):
        if x.shape != (b,) or x.dtype != dt:
            raise KernelContractError(f"sample_tokens: {name} must be [{b}] {dt}, got {tuple(x.shape)} {x.dtype}")
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    if b == 0:
        return out
    cfg = cfg or TABLE[arch_of(logits.device)]
    c = triton.cdiv(v, cfg.chunk)
    c_p2 = triton.next_power_of_2(c)
    part_f = torch.empty((b, 8, c), dtype=torch.float32, device=logits.device)
    part_i = torch.empty((b, 4, c), dtype=torch.int32, device=logits.device)
    args = (logits, temperature, top_k, top_p, min_p, seeds, steps, part_f, part_i)
    _max_kernel[(b, c)](logits, part_f, part_i, v, c, logits.stride(0), CHUNK=cfg.chunk, BLOCK=cfg.block,
                        num_warps=cfg.num_warps)
    for stage in (1, 2):
        _pass_kernel[(b, c)](*args, v, c, logits.stride(0), STAGE=stage, CHUNK=cfg.chunk, BLOCK=cfg.block,
                             C_P2=c_p2, num_warps=cfg.num_warps)
    _finish_kernel[(b,)](*args, out, v, c, logits.stride(0), BLOCK=cfg.block, C_P2=c_p2,
                         num_warps=cfg.num_warps)
    return out




def aot_configs(cc: int) -> list[AotConfig]:
    """The arch's row at the Qwen3.5 vocabulary (248,320 -> 31 chunks of 8192)."""
    cfg = TABLE[arch_from_cc(cc)]
    c_p2 = triton.next_power_of_2(triton.cdiv(248320, cfg.chunk))
    params = {"logits": "*fp32", "temperature": "*fp32", "top_k": "*i32", "top_p": "*fp32", "min_p": "*fp32",
              "seeds": "*i64", "steps": "*i64", "part_f": "*fp32", "part_i": "*i32"}
    out = [AotConfig("_max_kernel", {"logits": "*fp32", "part_f": "*fp32", "part_i": "*i32", "V": "i32",
                                     "C": "i32", "stride_l": "i32", "CHUNK": "constexpr", "BLOCK": "constexpr"},
                     dict(CHUNK=cfg.chunk, BLOCK=cfg.block), cfg.num_warps, 1, "sampler max")]
    for stage in (1, 2):
        sig = dict(params, V="i32", C="i32", stride_l="i32", STAGE="constexpr", CHUNK="constexpr",
                   BLOCK="constexpr", C_P2="constexpr")
        out.append(AotConfig("_pass_kernel", sig, dict(STAGE=stage, CHUNK=cfg.chunk, BLOCK=cfg.block, C_P2=c_p2),
                             cfg.num_warps, 1, f"sampler pass {stage}"))
    sig = dict(params, out="*i64", V="i32", C="i32", stride_l="i32", BLOCK="constexpr", C_P2="constexpr")
    out.append(AotConfig("_finish_kernel", sig, dict(BLOCK=cfg.block, C_P2=c_p2), cfg.num_warps, 1,
                         "sampler finish"))
    return out
