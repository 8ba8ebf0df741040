"""Row-wise small ops: (1+w) RMSNorm with fused residual add, the GDN gated RMSNorm, SiLU-mul, and
per-head q/k norm + partial NeoX RoPE (twins: ``norm.naive.rms_norm``, ``gated_rms_norm``, ``silu_mul``,
``qk_norm_rope``).

Every kernel is a single pass over its rows (memory-bound): fp32 math, and the same intermediate
roundings to the activation dtype as the twins (the residual sum, the normed value before RoPE or the
gate), so results agree with them to the last bit but for fp32 reduction order and approximate rsqrt.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...errors import ConfigError, KernelContractError
from ..common.aot import AotConfig
from ..common.arch import arch_from_cc, arch_of, pdl_supported

MAX_HIDDEN = 65536  # rms_norm keeps one row in registers


@dataclass(frozen=True)
class RowLaunch:
    num_warps: int
    block_r: int = 1     # rows per program (head-sized rows; rms_norm too, for the launch sweep)
    block: int = 1024    # columns per program (silu_mul)


# arch -> op -> launch. Full rows (hidden 2-8K) use 8 warps (4 on sm_90); head-sized rows are batched.
# sm_90 from bench_attention --sweep on an H200: qk 32 rows of 256 per program 0.85 of copy bandwidth,
# 16 rows 0.82, 8 rows 0.79; rms_norm 8192 x 5120 one row per program with 4 warps 0.83, 8 warps 0.80,
# 16 warps 0.80, two rows 0.76-0.77 (with the residual add every launch gave 0.905-0.918).
TABLE = {
    70: {"rms_norm": RowLaunch(8), "gated": RowLaunch(4, 8), "silu_mul": RowLaunch(4, 1, 1024),
         "qk": RowLaunch(4, 4)},
    80: {"rms_norm": RowLaunch(8), "gated": RowLaunch(4, 16), "silu_mul": RowLaunch(4, 1, 2048),
         "qk": RowLaunch(4, 8)},
    90: {"rms_norm": RowLaunch(4), "gated": RowLaunch(4, 16), "silu_mul": RowLaunch(4, 1, 2048),
         "qk": RowLaunch(4, 32)},
}


def _launch(device, op: str) -> RowLaunch:
    return TABLE[arch_of(device)][op]


@triton.jit
def _rms_norm_kernel(x, residual, weight, y, s_out, T, H, eps, stride_x, stride_r, stride_y, stride_s,
                     BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, HAS_RES: tl.constexpr,
                     TRIGGER: tl.constexpr = False):
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    o_t = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_h = tl.arange(0, BLOCK_H)
    m_h = o_h < H
    m = (o_t < T)[:, None] & m_h[None, :]
    # [BLOCK_R, BLOCK_H]
    b_x = tl.load(x + o_t[:, None] * stride_x + o_h[None, :], mask=m, other=0.0)
    if HAS_RES:
        # [BLOCK_R, BLOCK_H]
        b_r = tl.load(residual + o_t[:, None] * stride_r + o_h[None, :], mask=m, other=0.0)
        # the sum in the residual stream's dtype (fp32 for fp16 models: their stream outgrows 65,504)
        b_x = (b_x.to(tl.float32) + b_r.to(tl.float32)).to(s_out.dtype.element_ty)
        tl.store(s_out + o_t[:, None] * stride_s + o_h[None, :], b_x, mask=m)
    b_xf = b_x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(b_xf * b_xf, 1) / H + eps)
    # [BLOCK_H]
    b_w = tl.load(weight + o_h, mask=m_h, other=0.0).to(tl.float32)
    tl.store(y + o_t[:, None] * stride_y + o_h[None, :],
             (b_xf * rstd[:, None] * (1.0 + b_w[None, :])).to(y.dtype.element_ty), mask=m)


def rms_norm(x, weight, eps: float, residual=None):
    """Triton twin of :func:`catengine.kernels.norm.naive.rms_norm`."""
    return rms_norm_with(x, weight, eps, residual)


def rms_norm_with(x, weight, eps: float, residual=None, cfg: RowLaunch | None = None):
    """``cfg`` overrides the table's launch (the benchmark's sweep)."""
    if x.dim() != 2 or x.stride(-1) != 1 or weight.shape != (x.shape[1],):
        raise KernelContractError(f"rms_norm: x must be [T, H] contiguous in H with weight [H]; got x {tuple(x.shape)} "
                                  f"stride {x.stride()}, weight {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1):
        raise KernelContractError(f"rms_norm: residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
    t, h = x.shape
    if h > MAX_HIDDEN:
        raise ConfigError(f"rms_norm: hidden size {h} exceeds the single-pass limit {MAX_HIDDEN}")
    # y in the model dtype (the weight's): x may be the fp32 MoE output; s in the residual stream's dtype
    y = torch.empty((t, h), dtype=weight.dtype, device=x.device)
    s = torch.empty((t, h), dtype=residual.dtype, device=x.device) if residual is not None else y
    r = residual if residual is not None else x
    if t:
        cfg = cfg or _launch(x.device, "rms_norm")
        _rms_norm_kernel[(triton.cdiv(t, cfg.block_r),)](
            x, r, weight, y, s, t, h, eps, x.stride(0), r.stride(0), y.stride(0), s.stride(0),
            BLOCK_R=cfg.block_r, BLOCK_H=triton.next_power_of_2(h), HAS_RES=residual is not None,
            TRIGGER=pdl_supported(x.device), num_warps=cfg.num_warps)
    return y if residual is None else (y, s)


@triton.jit
def _gated_rms_norm_kernel(x, z, weight, y, R, HV, DV, eps, stride_xt, stride_xh, stride_zt, stride_zh,
                           BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, TRIGGER: tl.constexpr = False):
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_d = tl.arange(0, BLOCK_D)
    m_r = o_r < R
    m_d = o_d < DV
    m = m_r[:, None] & m_d[None, :]
    t = (o_r // HV).to(tl.int64)
    h = o_r % HV
    # [BLOCK_R, BLOCK_D]
    b_x = tl.load(x + (t * stride_xt + h * stride_xh)[:, None] + o_d[None, :], mask=m, other=0.0)
    # [BLOCK_R, BLOCK_D]
    b_z = tl.load(z + (t * stride_zt + h * stride_zh)[:, None] + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    # [BLOCK_D]
    b_w = tl.load(weight + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_xf = b_x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(b_xf * b_xf, 1) / DV + eps)
    b_n = (b_xf * rstd[:, None]).to(b_x.dtype).to(tl.float32)
    b_y = b_n * b_w[None, :] * (b_z * tl.sigmoid(b_z))
    tl.store(y + o_r.to(tl.int64)[:, None] * DV + o_d[None, :], b_y.to(y.dtype.element_ty), mask=m)


def gated_rms_norm(x, z, weight, eps: float):
    """Triton twin of :func:`catengine.kernels.norm.naive.gated_rms_norm`."""
    if x.dim() != 3 or z.shape != x.shape or weight.shape != (x.shape[2],):
        raise KernelContractError(f"gated_rms_norm: x, z must be [T, Hv, dv] with weight [dv]; got {tuple(x.shape)}, "
                                  f"{tuple(z.shape)}, {tuple(weight.shape)}")
    if x.stride(-1) != 1 or z.stride(-1) != 1:
        raise KernelContractError("gated_rms_norm: x and z must be contiguous in their last dim")
    t, hv, dv = x.shape
    y = torch.empty((t, hv, dv), dtype=x.dtype, device=x.device)
    if t:
        cfg = _launch(x.device, "gated")
        _gated_rms_norm_kernel[(triton.cdiv(t * hv, cfg.block_r),)](
            x, z, weight, y, t * hv, hv, dv, eps, x.stride(0), x.stride(1), z.stride(0), z.stride(1),
            BLOCK_R=cfg.block_r, BLOCK_D=triton.next_power_of_2(dv), TRIGGER=pdl_supported(x.device),
            num_warps=cfg.num_warps)
    return y


@triton.jit
def _silu_mul_kernel(x, y, INTER, stride_x, stride_y, BLOCK: tl.constexpr, TRIGGER: tl.constexpr = False):
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    i_t = tl.program_id(0).to(tl.int64)
    o_i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m_i = o_i < INTER
    # [BLOCK]
    b_g = tl.load(x + i_t * stride_x + o_i, mask=m_i, other=0.0).to(tl.float32)
    # [BLOCK]
    b_u = tl.load(x + i_t * stride_x + INTER + o_i, mask=m_i, other=0.0).to(tl.float32)
    tl.store(y + i_t * stride_y + o_i, (b_g * tl.sigmoid(b_g) * b_u).to(y.dtype.element_ty), mask=m_i)


def silu_mul(x):
    """Triton twin of :func:`catengine.kernels.norm.naive.silu_mul`."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise KernelContractError(f"silu_mul: x must be [T, 2I] contiguous in its last dim, got {tuple(x.shape)}")
    t, inter = x.shape[0], x.shape[1] // 2
    y = torch.empty((t, inter), dtype=x.dtype, device=x.device)
    if t:
        cfg = _launch(x.device, "silu_mul")
        _silu_mul_kernel[(t, triton.cdiv(inter, cfg.block))](x, y, inter, x.stride(0), y.stride(0),
                                                             BLOCK=cfg.block, TRIGGER=pdl_supported(x.device),
                                                             num_warps=cfg.num_warps)
    return y


@triton.jit
def _norm_rope_rows(x, out, weight, cos_sin, positions, i_p, R, H, eps, stride_xt, stride_xh, stride_cs,
                    BLOCK_R: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr):
    o_r = i_p * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = o_r < R
    t = (o_r // H).to(tl.int64)
    p_row = x + t * stride_xt + (o_r % H) * stride_xh
    p_out = out + o_r.to(tl.int64) * D
    o_d = tl.arange(0, D)
    o_h = tl.arange(0, HALF)
    # [BLOCK_R, D]
    b_x = tl.load(p_row[:, None] + o_d[None, :], mask=m_r[:, None], other=0.0)
    b_xf = b_x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(b_xf * b_xf, 1) / D + eps)[:, None]
    # [D]
    b_w = 1.0 + tl.load(weight + o_d).to(tl.float32)
    b_n = (b_xf * rstd * b_w[None, :]).to(b_x.dtype)
    # the pass-through dims; the rotary ones are stored below (no overlapping stores in one program)
    tl.store(p_out[:, None] + o_d[None, :], b_n, mask=m_r[:, None] & (o_d >= 2 * HALF)[None, :])
    # [BLOCK_R, HALF] each: the two rotated halves, normed exactly as above
    b_x1 = tl.load(p_row[:, None] + o_h[None, :], mask=m_r[:, None], other=0.0).to(tl.float32)
    b_x2 = tl.load(p_row[:, None] + HALF + o_h[None, :], mask=m_r[:, None], other=0.0).to(tl.float32)
    b_w1 = 1.0 + tl.load(weight + o_h).to(tl.float32)
    b_w2 = 1.0 + tl.load(weight + HALF + o_h).to(tl.float32)
    b_n1 = (b_x1 * rstd * b_w1[None, :]).to(b_x.dtype).to(tl.float32)
    b_n2 = (b_x2 * rstd * b_w2[None, :]).to(b_x.dtype).to(tl.float32)
    # [BLOCK_R]
    b_pos = tl.load(positions + t, mask=m_r, other=0)
    p_cs = cos_sin + b_pos * stride_cs
    # [BLOCK_R, HALF]
    b_c = tl.load(p_cs[:, None] + o_h[None, :], mask=m_r[:, None], other=0.0)
    b_s = tl.load(p_cs[:, None] + HALF + o_h[None, :], mask=m_r[:, None], other=0.0)
    tl.store(p_out[:, None] + o_h[None, :], (b_n1 * b_c - b_n2 * b_s).to(b_x.dtype), mask=m_r[:, None])
    tl.store(p_out[:, None] + HALF + o_h[None, :], (b_n2 * b_c + b_n1 * b_s).to(b_x.dtype), mask=m_r[:, None])


@triton.jit
def _qk_norm_rope_kernel(q, k, q_out, k_out, q_weight, k_weight, cos_sin, positions, T, NH, NKV, NQP, eps,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
                         BLOCK_R: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr):
    # one launch for both: programs [0, NQP) take q rows, the rest k rows
    i_p = tl.program_id(0)
    if i_p < NQP:
        _norm_rope_rows(q, q_out, q_weight, cos_sin, positions, i_p, T * NH, NH, eps, stride_qt, stride_qh,
                        stride_cs, BLOCK_R, D, HALF)
    else:
        _norm_rope_rows(k, k_out, k_weight, cos_sin, positions, i_p - NQP, T * NKV, NKV, eps, stride_kt,
                        stride_kh, stride_cs, BLOCK_R, D, HALF)


def qk_norm_rope(q, k, q_weight, k_weight, positions, cos_sin_cache, eps: float):
    """Triton twin of :func:`catengine.kernels.norm.naive.qk_norm_rope` (returns new contiguous q, k)."""
    return qk_norm_rope_with(q, k, q_weight, k_weight, positions, cos_sin_cache, eps)


def qk_norm_rope_with(q, k, q_weight, k_weight, positions, cos_sin_cache, eps: float, cfg: RowLaunch | None = None):
    """``cfg`` overrides the table's launch (the benchmark's sweep)."""
    t, nh, d = q.shape
    nkv = k.shape[1]
    rot = cos_sin_cache.shape[-1]
    if k.shape != (t, nkv, d) or q_weight.shape != (d,) or k_weight.shape != (d,):
        raise KernelContractError(f"qk_norm_rope: q [T, nh, d] {tuple(q.shape)}, k [T, nkv, d] {tuple(k.shape)} and "
                                  f"weights [d] {tuple(q_weight.shape)}, {tuple(k_weight.shape)} disagree")
    if d & (d - 1) or rot % 2 or rot > d or (rot // 2) & (rot // 2 - 1):
        raise ConfigError(f"qk_norm_rope: head_dim {d} and rotary dim {rot} must be powers of two, rot <= d")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or cos_sin_cache.stride(-1) != 1:
        raise KernelContractError("qk_norm_rope: q, k and cos_sin_cache must be contiguous in their last dim")
    q_out = torch.empty((t, nh, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, nkv, d), dtype=k.dtype, device=k.device)
    if t:
        cfg = cfg or _launch(q.device, "qk")
        nqp = triton.cdiv(t * nh, cfg.block_r)
        grid = (nqp + triton.cdiv(t * nkv, cfg.block_r),)
        _qk_norm_rope_kernel[grid](q, k, q_out, k_out, q_weight, k_weight, cos_sin_cache, positions, t, nh, nkv,
                                   nqp, eps, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                   cos_sin_cache.stride(0), BLOCK_R=cfg.block_r, D=d, HALF=rot // 2,
                                   num_warps=cfg.num_warps)
    return q_out, k_out




def aot_configs(cc: int) -> list[AotConfig]:
    """Each op of the arch's table in the arch's model dtype, at the Qwen3.5 sizes (hidden 2048 / 3072 /
    5120, GDN dv 128, head_dim 256 with 64 rotary dims)."""
    arch = arch_from_cc(cc)
    tab = TABLE[arch]
    a = "fp16" if arch == 70 else "bf16"
    trigger = arch >= 90    # the ops before a GEMM let a PDL launch of it start (griddepcontrol: sm_90)
    out = []
    # with the residual add: x is a mixer's output (model dtype) or the MoE block's unrounded fp32
    # output; the residual stream is fp32 for fp16 models (catengine.models.layers.residual_dtype)
    r = "fp32" if a == "fp16" else a
    variants = [(False, a, a)] + [(True, xd, r) for xd in (a, "fp32")]
    for block_h in (2048, 4096, 8192):
        for res, xd, rd in variants:
            sig = {"x": f"*{xd}", "residual": f"*{rd}", "weight": f"*{a}", "y": f"*{a}", "s_out": f"*{rd}",
                   "T": "i32", "H": "i32", "eps": "fp32", "stride_x": "i32", "stride_r": "i32", "stride_y": "i32",
                   "stride_s": "i32", "BLOCK_R": "constexpr", "BLOCK_H": "constexpr", "HAS_RES": "constexpr",
                   "TRIGGER": "constexpr"}
            c = tab["rms_norm"]
            name = f"rms_norm {block_h} res {res}" + (f" x {xd} stream {rd}" if res else "")
            out.append(AotConfig("_rms_norm_kernel", sig, dict(BLOCK_R=c.block_r, BLOCK_H=block_h, HAS_RES=res,
                                                               TRIGGER=trigger), c.num_warps, 1, name))
    g = tab["gated"]
    sig = {"x": f"*{a}", "z": f"*{a}", "weight": f"*{a}", "y": f"*{a}", "R": "i32", "HV": "i32", "DV": "i32",
           "eps": "fp32", "stride_xt": "i32", "stride_xh": "i32", "stride_zt": "i32", "stride_zh": "i32",
           "BLOCK_R": "constexpr", "BLOCK_D": "constexpr", "TRIGGER": "constexpr"}
    out.append(AotConfig("_gated_rms_norm_kernel", sig, dict(BLOCK_R=g.block_r, BLOCK_D=128, TRIGGER=trigger),
                         g.num_warps, 1, "gated_rms_norm dv128"))
    s = tab["silu_mul"]
    sig = {"x": f"*{a}", "y": f"*{a}", "INTER": "i32", "stride_x": "i32", "stride_y": "i32", "BLOCK": "constexpr",
           "TRIGGER": "constexpr"}
    out.append(AotConfig("_silu_mul_kernel", sig, dict(BLOCK=s.block, TRIGGER=trigger), s.num_warps, 1, "silu_mul"))
    qk = tab["qk"]
    sig = {"q": f"*{a}", "k": f"*{a}", "q_out": f"*{a}", "k_out": f"*{a}", "q_weight": f"*{a}",
           "k_weight": f"*{a}", "cos_sin": "*fp32", "positions": "*i64"}
    sig.update({n: "i32" for n in ("T", "NH", "NKV", "NQP")})
    sig["eps"] = "fp32"
    sig.update({n: "i32" for n in ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_cs")})
    sig.update(BLOCK_R="constexpr", D="constexpr", HALF="constexpr")
    out.append(AotConfig("_qk_norm_rope_kernel", sig, dict(BLOCK_R=qk.block_r, D=256, HALF=32), qk.num_warps, 1,
                         "qk_norm_rope d256 rot64"))
    return out
