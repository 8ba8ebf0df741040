"""Scatter new K/V into the paged cache (twin: ``attention.naive.store_kv``).

One program per new token writes all KV heads of K and V. An fp8 e5m2 cache (uint8 bytes) is
written with the integer round-to-nearest-even of :func:`catengine.kernels.common.e5m2_jit.fp16_to_e5m2_bits`
(the design notes, ../shared/design/SM70.md) instead of ``.to(tl.float8e5)``, which does not compile for
sm_70 and rounds differently across architectures in Triton 3.6.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import KernelContractError
from ..common.aot import AotConfig
from ..common.arch import arch_from_cc, arch_of
from ..common.e5m2_jit import fp16_to_e5m2_bits

# arch -> num_warps for one token's [nkv, d] rows (a few KB: a pure bandwidth copy)
_WARPS = {70: 4, 80: 4, 90: 4}


@triton.jit
def _store_kv_kernel(key, value, k_cache, v_cache, slot_mapping, NKV, D, BS,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                     BH: tl.constexpr, BD: tl.constexpr, FP8: tl.constexpr):
    i_t = tl.program_id(0)
    slot = tl.load(slot_mapping + i_t)
    if slot < 0:
        return
    blk = slot // BS
    off = slot % BS
    o_h = tl.arange(0, BH)
    o_d = tl.arange(0, BD)
    m_hd = (o_h < NKV)[:, None] & (o_d < D)[None, :]
    p_k = key + i_t.to(tl.int64) * stride_kt + o_h[:, None] * stride_kh + o_d[None, :]
    p_v = value + i_t.to(tl.int64) * stride_vt + o_h[:, None] * stride_vh + o_d[None, :]
    # [BH, BD]
    b_k = tl.load(p_k, mask=m_hd, other=0.0)
    # [BH, BD]
    b_v = tl.load(p_v, mask=m_hd, other=0.0)
    p_kc = k_cache + blk * stride_kcb + off * stride_kcs + o_h[:, None] * stride_kch + o_d[None, :]
    p_vc = v_cache + blk * stride_vcb + off * stride_vcs + o_h[:, None] * stride_vch + o_d[None, :]
    if FP8:
        tl.store(p_kc, fp16_to_e5m2_bits(b_k), mask=m_hd)
        tl.store(p_vc, fp16_to_e5m2_bits(b_v), mask=m_hd)
    else:
        tl.store(p_kc, b_k.to(p_kc.dtype.element_ty), mask=m_hd)
        tl.store(p_vc, b_v.to(p_vc.dtype.element_ty), mask=m_hd)


def _check(key, value, k_cache, v_cache, slot_mapping):
    if key.shape != value.shape or key.dim() != 3:
        raise KernelContractError(f"store_kv: key/value must both be [T, nkv, d], got {tuple(key.shape)} and "
                                  f"{tuple(value.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4 or k_cache.shape[2:] != key.shape[1:]:
        raise KernelContractError(f"store_kv: caches must be [num_blocks, block_size, nkv, d] matching key "
                                  f"{tuple(key.shape)}, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.dtype != v_cache.dtype:
        raise KernelContractError(f"store_kv: k_cache is {k_cache.dtype} but v_cache is {v_cache.dtype}; use one dtype")
    for name, t in (("key", key), ("value", value), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise KernelContractError(f"store_kv: {name} must be contiguous in its last dim (call .contiguous())")
    if slot_mapping.shape[0] != key.shape[0]:
        raise KernelContractError(f"store_kv: slot_mapping has {slot_mapping.shape[0]} entries for "
                                  f"{key.shape[0]} tokens")


def store_kv(key, value, k_cache, v_cache, slot_mapping):
    """Triton twin of :func:`catengine.kernels.attention.naive.store_kv` (in place)."""
    _check(key, value, k_cache, v_cache, slot_mapping)
    t, nkv, d = key.shape
    if t == 0:
        return
    _store_kv_kernel[(t,)](
        key, value, k_cache, v_cache, slot_mapping, nkv, d, k_cache.shape[1],
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BH=triton.next_power_of_2(nkv), BD=triton.next_power_of_2(d), FP8=k_cache.dtype == torch.uint8,
        num_warps=_WARPS[arch_of(key.device)])




def aot_configs(cc: int) -> list[AotConfig]:
    """Every (input dtype, cache dtype) the engine stores, for Qwen3.5's 2/4 KV heads of d 256."""
    arch = arch_from_cc(cc)
    act = ["fp16"] if arch == 70 else ["fp16", "bf16"]
    out = []
    for a, c, bh in ((a, c, bh) for a in act for c in (a, "u8") for bh in (2, 4)):
        sig = {"key": f"*{a}", "value": f"*{a}", "k_cache": f"*{c}", "v_cache": f"*{c}",
               "slot_mapping": "*i64", "NKV": "i32", "D": "i32", "BS": "i32"}
        sig.update({s: "i32" for s in ("stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_kcb",
                                       "stride_kcs", "stride_kch", "stride_vcb", "stride_vcs", "stride_vch")})
        sig.update(BH="constexpr", BD="constexpr", FP8="constexpr")
        out.append(AotConfig("_store_kv_kernel", sig, {"BH": bh, "BD": 256, "FP8": c == "u8"},
                             num_warps=_WARPS[arch], num_stages=1, name=f"store_kv {a}->{c} nkv{bh}"))
    return out


__all__ = ["store_kv", "aot_configs"]
