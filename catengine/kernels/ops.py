"""One dispatch for every op the model calls: the Triton kernel on CUDA, the torch twin elsewhere.

Each op below is a plain function with its twin's signature and docstring (``<family>/naive.py``): on
a CUDA tensor it calls the family's Triton implementation, on any other device (and everywhere under
``CATENGINE_KERNELS=reference``, for A/B checks on a GPU) the twin. The Triton modules are imported
inside the CUDA branch: importing them (and Triton) costs about half a second that a CPU run never
needs. ``@_op`` registers each function under its name (``OP_NAMES``); a second op of one name is an
error.
"""
from __future__ import annotations

import os
from typing import Callable

from ..errors import CatEngineError
from .attention import naive as attention_naive
from .common import e5m2
from .gdn import naive as gdn_naive
from .moe import naive as moe_naive
from .norm import naive as norm_naive
from .sampling import naive as sampling_naive
from .skinny import naive as skinny_naive
from .w4a16 import naive as w4a16_naive
from .w4a16.packing import QuantizedWeight
from .w8a16 import naive as w8a16_naive


class DuplicateOpError(CatEngineError):
    """Two ops registered under one name: the later would silently replace the earlier."""


class OpRegistry:
    """Name -> twin of each op, filled once while ``ops`` is imported."""

    def __init__(self):
        self._twins: dict[str, Callable] = {}

    def op(self, twin: Callable) -> Callable[[Callable], Callable]:
        """Decorator: registers the op named like the function, whose twin is ``twin``; the op takes the
        twin's docstring (its signature must be the twin's, which tests/kernels/test_ops.py checks)."""
        def register(fn: Callable) -> Callable:
            name = fn.__name__
            if name in self._twins:
                raise DuplicateOpError(f"op {name!r} is registered twice; each op has one function in ops.py")
            if twin.__name__ != name:
                raise DuplicateOpError(f"op {name!r} names the twin {twin.__module__}.{twin.__name__}")
            self._twins[name] = twin
            fn.__doc__ = twin.__doc__
            return fn
        return register

    def names(self) -> tuple[str, ...]:
        return tuple(self._twins)

    def twin(self, name: str) -> Callable:
        return self._twins[name]


REGISTRY = OpRegistry()
_op = REGISTRY.op


def use_triton(device) -> bool:
    return getattr(device, "type", str(device)) == "cuda" and os.environ.get("CATENGINE_KERNELS") != "reference"


# ---------------------------------------------------------------- norm: norms, RoPE, activations
@_op(norm_naive.rms_norm)
def rms_norm(x, weight, eps: float, residual=None):
    if use_triton(x.device):
        from .norm import norm_rope
        return norm_rope.rms_norm(x, weight, eps, residual)
    return norm_naive.rms_norm(x, weight, eps, residual)


@_op(norm_naive.gated_rms_norm)
def gated_rms_norm(x, z, weight, eps: float):
    if use_triton(x.device):
        from .norm import norm_rope
        return norm_rope.gated_rms_norm(x, z, weight, eps)
    return norm_naive.gated_rms_norm(x, z, weight, eps)


@_op(norm_naive.silu_mul)
def silu_mul(x):
    if use_triton(x.device):
        from .norm import norm_rope
        return norm_rope.silu_mul(x)
    return norm_naive.silu_mul(x)


@_op(norm_naive.qk_norm_rope)
def qk_norm_rope(q, k, q_weight, k_weight, positions, cos_sin_cache, eps: float):
    if use_triton(q.device):
        from .norm import norm_rope
        return norm_rope.qk_norm_rope(q, k, q_weight, k_weight, positions, cos_sin_cache, eps)
    return norm_naive.qk_norm_rope(q, k, q_weight, k_weight, positions, cos_sin_cache, eps)


# ---------------------------------------------------------------- attention: paged KV cache
@_op(attention_naive.store_kv)
def store_kv(key, value, k_cache, v_cache, slot_mapping):
    if use_triton(key.device):
        from .attention import kv_store
        return kv_store.store_kv(key, value, k_cache, v_cache, slot_mapping)
    return attention_naive.store_kv(key, value, k_cache, v_cache, slot_mapping)


@_op(attention_naive.paged_attention)
def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale: float,
                    max_query_len: int, max_seq_len: int, gate=None):
    if use_triton(q.device):
        from .attention import paged
        return paged.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                                     max_query_len, max_seq_len, gate)
    return attention_naive.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                                           max_query_len, max_seq_len, gate)


# ---------------------------------------------------------------- gdn: conv1d, gating, gated delta rule
@_op(gdn_naive.causal_conv1d)
def causal_conv1d(x, weight, conv_states, query_start_loc, state_slots, has_initial_state,
                  activation: str | None = "silu"):
    if use_triton(x.device):
        from .gdn import conv1d
        return conv1d.causal_conv1d(x, weight, conv_states, query_start_loc, state_slots, has_initial_state,
                                    activation)
    return gdn_naive.causal_conv1d(x, weight, conv_states, query_start_loc, state_slots, has_initial_state,
                                   activation)


@_op(gdn_naive.causal_conv1d_update)
def causal_conv1d_update(x, weight, conv_states, state_slots, activation: str | None = "silu"):
    if use_triton(x.device):
        from .gdn import conv1d
        return conv1d.causal_conv1d_update(x, weight, conv_states, state_slots, activation)
    return gdn_naive.causal_conv1d_update(x, weight, conv_states, state_slots, activation)


@_op(gdn_naive.gdn_gating)
def gdn_gating(A_log, a, dt_bias, b):
    if use_triton(A_log.device):
        from .gdn import recurrent
        return recurrent.gdn_gating(A_log, a, dt_bias, b)
    return gdn_naive.gdn_gating(A_log, a, dt_bias, b)


@_op(gdn_naive.chunk_gated_delta_rule)
def chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                           has_initial_state, scale: float, use_qk_l2norm: bool = True,
                           chunk_size: int = 64):
    if use_triton(q.device):
        from .gdn import chunk
        return chunk.chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                                            has_initial_state, scale, use_qk_l2norm, chunk_size)
    return gdn_naive.chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                                            has_initial_state, scale, use_qk_l2norm, chunk_size)


@_op(gdn_naive.recurrent_gated_delta_rule)
def recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                               has_initial_state, scale: float, use_qk_l2norm: bool = True,
                               intermediate_state_slots=None):
    if use_triton(q.device):
        from .gdn import recurrent
        return recurrent.recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                                                    has_initial_state, scale, use_qk_l2norm,
                                                    intermediate_state_slots)
    return gdn_naive.recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                                                has_initial_state, scale, use_qk_l2norm, intermediate_state_slots)


@_op(gdn_naive.gdn_gating_recurrent)
def gdn_gating_recurrent(q, k, v, A_log, a, dt_bias, b, ssm_states, query_start_loc, state_slots, has_initial_state,
                         scale: float, use_qk_l2norm: bool = True, intermediate_state_slots=None):
    if use_triton(q.device):
        from .gdn import recurrent
        return recurrent.gdn_gating_recurrent(q, k, v, A_log, a, dt_bias, b, ssm_states, query_start_loc,
                                              state_slots, has_initial_state, scale, use_qk_l2norm,
                                              intermediate_state_slots)
    return gdn_naive.gdn_gating_recurrent(q, k, v, A_log, a, dt_bias, b, ssm_states, query_start_loc, state_slots,
                                          has_initial_state, scale, use_qk_l2norm, intermediate_state_slots)


# ---------------------------------------------------------------- w4a16 and moe
@_op(w4a16_naive.w4a16_linear)
def w4a16_linear(x, weight: QuantizedWeight, bias=None):
    if use_triton(x.device):
        # the one CUDA implementation: dequantise + cuBLAS for large M, the fused GEMV / GEMM otherwise
        from .w4a16 import dequant
        return dequant.w4a16_linear(x, weight, bias)
    return w4a16_naive.w4a16_linear(x, weight, bias)


@_op(w8a16_naive.w8a16_linear)
def w8a16_linear(x, qweight, scales):
    if use_triton(x.device):
        from .w8a16 import gemv
        return gemv.w8a16_linear(x, qweight, scales)
    return w8a16_naive.w8a16_linear(x, qweight, scales)


# ---------------------------------------------------------------- skinny: dense linears with few columns
@_op(skinny_naive.skinny_linear)
def skinny_linear(x, w, bias=None, counters=None):
    if use_triton(x.device):
        # one launch where the kernel's table takes the shape, cuBLAS elsewhere
        from .skinny import skinny
        return skinny.skinny_linear(x, w, bias, counters)
    return skinny_naive.skinny_linear(x, w, bias, counters)


@_op(skinny_naive.skinny_counters)
def skinny_counters(w):
    if use_triton(w.device):
        from .skinny import skinny
        return skinny.skinny_counters(w)
    return skinny_naive.skinny_counters(w)


@_op(moe_naive.moe_route)
def moe_route(router_logits, top_k: int, renormalize: bool = True, expert_range: tuple[int, int] | None = None):
    if use_triton(router_logits.device):
        from .moe import route
        return route.moe_route(router_logits, top_k, renormalize, expert_range)
    return moe_naive.moe_route(router_logits, top_k, renormalize, expert_range)


@_op(moe_naive.fused_moe)
def fused_moe(x, w13, w2, topk_weights, topk_ids):
    if use_triton(x.device):
        from .moe import fused
        return fused.fused_moe(x, w13, w2, topk_weights, topk_ids)
    return moe_naive.fused_moe(x, w13, w2, topk_weights, topk_ids)


@_op(moe_naive.shared_expert_add)
def shared_expert_add(routed, gate_logit, shared):
    if use_triton(routed.device):
        from .moe import shared as moe_shared
        return moe_shared.shared_expert_add(routed, gate_logit, shared)
    return moe_naive.shared_expert_add(routed, gate_logit, shared)


# ---------------------------------------------------------------- sampling
@_op(sampling_naive.sample_tokens)
def sample_tokens(logits, temperature, top_k, top_p, min_p, seeds, steps):
    if use_triton(logits.device):
        from .sampling import sampler
        return sampler.sample_tokens(logits, temperature, top_k, top_p, min_p, seeds, steps)
    return sampling_naive.sample_tokens(logits, temperature, top_k, top_p, min_p, seeds, steps)


@_op(sampling_naive.apply_token_bitmask)
def apply_token_bitmask(logits, bitmask, rows):
    if use_triton(logits.device):
        from .sampling import bitmask as token_bitmask
        return token_bitmask.apply_token_bitmask(logits, bitmask, rows)
    return sampling_naive.apply_token_bitmask(logits, bitmask, rows)


OP_NAMES = REGISTRY.names()


def triton_ops() -> dict[str, Callable]:
    """Name -> Triton implementation of every op (imports Triton): what each op above calls on CUDA,
    for tests that compare every op's signature with its twin's."""
    from .attention import kv_store, paged
    from .gdn import chunk, conv1d, recurrent
    from .moe import fused, route, shared
    from .norm import norm_rope
    from .sampling import bitmask, sampler
    from .skinny import skinny
    from .w4a16 import dequant
    from .w8a16 import gemv
    return {
        "rms_norm": norm_rope.rms_norm, "gated_rms_norm": norm_rope.gated_rms_norm, "silu_mul": norm_rope.silu_mul,
        "qk_norm_rope": norm_rope.qk_norm_rope, "store_kv": kv_store.store_kv,
        "paged_attention": paged.paged_attention, "causal_conv1d": conv1d.causal_conv1d,
        "causal_conv1d_update": conv1d.causal_conv1d_update, "gdn_gating": recurrent.gdn_gating,
        "chunk_gated_delta_rule": chunk.chunk_gated_delta_rule,
        "recurrent_gated_delta_rule": recurrent.recurrent_gated_delta_rule,
        "gdn_gating_recurrent": recurrent.gdn_gating_recurrent, "w4a16_linear": dequant.w4a16_linear,
        "w8a16_linear": gemv.w8a16_linear, "skinny_linear": skinny.skinny_linear,
        "skinny_counters": skinny.skinny_counters,
        "moe_route": route.moe_route, "fused_moe": fused.fused_moe,
        "shared_expert_add": shared.shared_expert_add, "sample_tokens": sampler.sample_tokens,
        "apply_token_bitmask": bitmask.apply_token_bitmask,
    }


# not ops (no Triton form): the model builds the RoPE table once, the engine converts fp8 bytes
rope_cos_sin_cache = norm_naive.rope_cos_sin_cache
fp16_to_e5m2 = e5m2.fp16_to_e5m2
e5m2_to_fp16 = e5m2.e5m2_to_fp16
