"""The blocks of a Qwen3.5/3.6 decoder layer, written against the flat batch (see QWEN35.md for the math).

Every op goes through ``catengine.kernels.ops``, so the same code runs the Triton kernels on CUDA and
the torch twins on the CPU.
"""
from __future__ import annotations

import torch

from ..kernels import ops
from .batch import AttentionCache, BatchMetadata, GDNStateCache
from .gdn_verify import conv_windows_before, save_conv_windows
from .model_config import ModelConfig
from .linear import Linear, MergedLinear, SkinnyCounters, WeightSlots, dense_linear
from .sharding import TPLayout


def residual_dtype(dtype: torch.dtype) -> torch.dtype:
    """The residual stream's dtype for a model dtype: fp32 for fp16, the model dtype otherwise.

    Qwen3.5/3.6 are trained in bf16, whose range is fp32's: their residual streams grow past fp16's
    65,504 in some layers (massive activations), which in an fp16 stream become inf and then NaN in
    the next norm. An fp32 stream costs 2 extra bytes per element read and written by each fused
    add + norm, small beside the GEMMs. bf16 keeps a bf16 stream: it cannot overflow, it matches the
    transformers reference's rounding for bf16 checkpoints, and it keeps the sm_80+ paths unchanged.
    """
    return torch.float32 if dtype == torch.float16 else dtype


class Norm:
    """Qwen's (1 + w) RMSNorm; the weight is stored as w, the kernel adds 1."""

    def __init__(self, eps: float):
        self.eps = eps
        self.weight: torch.Tensor | None = None

    def register(self, slots: WeightSlots, name: str) -> None:
        slots.add(f"{name}.weight", lambda v: setattr(self, "weight", v))

    def __call__(self, x, residual=None):
        return ops.rms_norm(x, self.weight, self.eps, residual)


class Attention:
    """Gated full attention: q (with a per-head output gate) / k / v, q/k norm, partial RoPE, paged KV."""

    def __init__(self, cfg: ModelConfig, rope_cache: torch.Tensor, tp: TPLayout):
        # this rank's heads (all of them at TP1): o_proj is row-parallel, the decoder layer all-reduces
        self.nh, self.nkv, self.d = tp.nh, tp.nkv, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.scale = self.d ** -0.5
        self.rope_cache = rope_cache
        # q_proj emits [q_h | gate_h] per head, hence 2 * nh * d
        self.qkv_proj = MergedLinear(cfg.hidden_size, [2 * self.nh * self.d, self.nkv * self.d, self.nkv * self.d])
        self.o_proj = Linear(self.nh * self.d, cfg.hidden_size)
        self.q_norm, self.k_norm = Norm(self.eps), Norm(self.eps)

    def register(self, slots: WeightSlots, prefix: str) -> None:
        for i, part in enumerate(("q_proj", "k_proj", "v_proj")):
            self.qkv_proj.register_part(slots, i, f"{prefix}.{part}")
        self.o_proj.register(slots, f"{prefix}.o_proj")
        self.q_norm.register(slots, f"{prefix}.q_norm")
        self.k_norm.register(slots, f"{prefix}.k_norm")

    def __call__(self, x, positions, batch: BatchMetadata, cache: AttentionCache):
        t = x.shape[0]
        qg, k, v = self.qkv_proj.split(self.qkv_proj(x))
        # strided views, no copies: qk_norm_rope, store_kv and paged_attention take row and head strides
        qg = qg.view(t, self.nh, 2 * self.d)
        q, gate = qg[..., : self.d], qg[..., self.d:]
        k, v = k.reshape(t, self.nkv, self.d), v.reshape(t, self.nkv, self.d)
        q, k = ops.qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, positions, self.rope_cache, self.eps)
        ops.store_kv(k, v, cache.k, cache.v, batch.slot_mapping)
        o = ops.paged_attention(q, cache.k, cache.v, batch.block_tables, batch.seq_lens, batch.query_start_loc,
                                self.scale, batch.max_query_len, batch.max_seq_len, gate=gate)
        return self.o_proj(o.view(t, self.nh * self.d))


class GatedDeltaNet:
    """Linear attention layer: causal conv + gated delta rule with per-sequence state slots."""

    def __init__(self, cfg: ModelConfig, tp: TPLayout):
        # this rank's heads: value head j still reads key head j // (hv / hk) after the split
        self.hk, self.hv = tp.hk, tp.hv
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.eps = cfg.rms_norm_eps
        self.in_proj_qkvz = MergedLinear(cfg.hidden_size, [tp.conv_dim, self.value_dim])
        self.in_proj_ba = MergedLinear(cfg.hidden_size, [self.hv, self.hv])
        self.out_proj = Linear(self.value_dim, cfg.hidden_size)
        self.conv_weight = self.A_log = self.dt_bias = self.norm_weight = None

    def register(self, slots: WeightSlots, prefix: str) -> None:
        self.in_proj_qkvz.register_part(slots, 0, f"{prefix}.in_proj_qkv")
        self.in_proj_qkvz.register_part(slots, 1, f"{prefix}.in_proj_z")
        self.in_proj_ba.register_part(slots, 0, f"{prefix}.in_proj_b")
        self.in_proj_ba.register_part(slots, 1, f"{prefix}.in_proj_a")
        self.out_proj.register(slots, f"{prefix}.out_proj")
        # conv1d weight is [C, 1, Kc] on disk; the kernels take [C, Kc]
        slots.add(f"{prefix}.conv1d.weight", lambda v: setattr(self, "conv_weight", v.reshape(v.shape[0], -1)))
        # the decay parameters feed exp/softplus: keep them in fp32 whatever the model dtype
        slots.add(f"{prefix}.A_log", lambda v: setattr(self, "A_log", v), keep_fp32=True)
        slots.add(f"{prefix}.dt_bias", lambda v: setattr(self, "dt_bias", v), keep_fp32=True)
        slots.add(f"{prefix}.norm.weight", lambda v: setattr(self, "norm_weight", v))

    def __call__(self, x, positions, batch: BatchMetadata, cache: GDNStateCache):
        t = x.shape[0]
        mixed, z = self.in_proj_qkvz.split(self.in_proj_qkvz(x))
        b, a = self.in_proj_ba.split(self.in_proj_ba(x))
        # column slices stay views: the conv and gating kernels take a row stride
        # speculative verification: the recurrent rule and the conv keep the state after every new token
        verify = batch.intermediate_state_slots is not None and not batch.decode_only
        if batch.decode_only:
            mixed = ops.causal_conv1d_update(mixed, self.conv_weight, cache.conv, batch.state_slots)
        else:
            pre = mixed
            init = conv_windows_before(cache.conv, batch.state_slots, batch.has_initial_state) if verify else None
            mixed = ops.causal_conv1d(mixed, self.conv_weight, cache.conv, batch.query_start_loc,
                                      batch.state_slots, batch.has_initial_state)
            if verify:
                save_conv_windows(pre, init, cache.conv, batch.query_start_loc, batch.intermediate_state_slots,
                                  batch.intermediate_targets)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(t, self.hk, self.dk)
        k = k.reshape(t, self.hk, self.dk)
        v = v.reshape(t, self.hv, self.dv)
        if batch.decode_only or verify:
            # the gating inside the recurrent kernel: one launch a layer fewer
            o = ops.gdn_gating_recurrent(q, k, v, self.A_log, a, self.dt_bias, b, cache.ssm, batch.query_start_loc,
                                         batch.state_slots, batch.has_initial_state, self.dk ** -0.5, True,
                                         batch.intermediate_state_slots)
        else:
            g, beta = ops.gdn_gating(self.A_log, a, self.dt_bias, b)
            o = ops.chunk_gated_delta_rule(q, k, v, g, beta, cache.ssm, batch.query_start_loc, batch.state_slots,
                                           batch.has_initial_state, self.dk ** -0.5, True)
        o = ops.gated_rms_norm(o, z.reshape(t, self.hv, self.dv), self.norm_weight, self.eps)
        return self.out_proj(o.reshape(t, self.value_dim))


class MLP:
    """SwiGLU feed-forward: down(silu(gate x) * up x), gate and up in one GEMM."""

    def __init__(self, hidden: int, intermediate: int):
        self.gate_up_proj = MergedLinear(hidden, [intermediate, intermediate])
        self.down_proj = Linear(intermediate, hidden)

    def register(self, slots: WeightSlots, prefix: str) -> None:
        self.gate_up_proj.register_part(slots, 0, f"{prefix}.gate_proj")
        self.gate_up_proj.register_part(slots, 1, f"{prefix}.up_proj")
        self.down_proj.register(slots, f"{prefix}.down_proj")

    def __call__(self, x):
        return self.down_proj(ops.silu_mul(self.gate_up_proj(x)))


class SparseMoE:
    """Top-k routed experts plus a sigmoid-gated shared expert."""

    def __init__(self, cfg: ModelConfig, tp: TPLayout):
        # every rank routes all tokens (the router is replicated) through its slice of every expert's
        # intermediate dim, or with expert parallelism through its whole experts only (expert_range: the
        # other ranks' get id -1, which fused_moe skips); the partial sums meet in the decoder layer's all-reduce
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.num_experts, self.expert_range = cfg.num_experts, tp.expert_range
        self.router_weight = self.w13 = self.w2 = self.shared_gate_weight = None
        self._merged = None   # router + shared gate rows, see _router_and_gate
        self._counters = SkinnyCounters()   # the router GEMM's (dense_linear)
        self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size // tp.size) \
            if cfg.shared_expert_intermediate_size else None

    def register(self, slots: WeightSlots, prefix: str) -> None:
        slots.add(f"{prefix}.gate.weight", lambda v: self._set("router_weight", v))
        slots.add(f"{prefix}.experts.gate_up_proj", lambda v: setattr(self, "w13", v))
        slots.add(f"{prefix}.experts.down_proj", lambda v: setattr(self, "w2", v))
        if self.shared_expert is not None:
            self.shared_expert.register(slots, f"{prefix}.shared_expert")
            slots.add(f"{prefix}.shared_expert_gate.weight", lambda v: self._set("shared_gate_weight", v))

    def _set(self, name: str, value: torch.Tensor) -> None:
        setattr(self, name, value)
        self._merged = None
        self._counters.reset()

    def _router_and_gate(self) -> torch.Tensor:
        """[E (+1), H]: the router rows, then the shared expert's gate row, so one GEMM gives both (a
        1-row GEMM is two cuBLAS launches of its own at decode). Built on the first call, after
        loading (the eager warm-up, before any CUDA graph capture); loading a weight again drops it."""
        if self.shared_expert is None:
            return self.router_weight
        if self._merged is None:
            merged = torch.cat([self.router_weight, self.shared_gate_weight])
            # the separate weights become views, so the rows are not held twice
            self.router_weight, self.shared_gate_weight = merged[: self.num_experts], merged[self.num_experts:]
            self._merged = merged
        return self._merged

    def __call__(self, x):
        """x: [T, H] in the model dtype -> [T, H] fp32: the routed sum (fused_moe's fp32 accumulators)
        plus the gated shared expert, added in fp32 and handed to the residual add unrounded, since
        in an fp16 model this sum is where activations outgrow 65,504."""
        logits = dense_linear(x, self._router_and_gate(), None, self._counters)
        weights, ids = ops.moe_route(logits[:, : self.num_experts], self.top_k, self.renormalize, self.expert_range)
        out = ops.fused_moe(x, self.w13, self.w2, weights, ids)
        if self.shared_expert is not None:
            out = ops.shared_expert_add(out, logits[:, self.num_experts:], self.shared_expert(x))
        return out


class DecoderLayer:
    """x += mixer(norm1(x)); x += mlp(norm2(x)); the residual add is fused into the next norm."""

    def __init__(self, cfg: ModelConfig, layer_type: str, rope_cache: torch.Tensor, tp: TPLayout, group):
        """``tp``: this rank's share of the heads and widths; ``group``: the TPGroup whose all-reduce
        sums the row-parallel outputs (two per layer; no-ops at TP1)."""
        self.layer_type, self.group = layer_type, group
        self.input_layernorm = Norm(cfg.rms_norm_eps)
        self.post_attention_layernorm = Norm(cfg.rms_norm_eps)
        self.mixer = Attention(cfg, rope_cache, tp) if layer_type == "full_attention" else GatedDeltaNet(cfg, tp)
        self.mlp = SparseMoE(cfg, tp) if cfg.is_moe else MLP(cfg.hidden_size, cfg.intermediate_size // tp.size)

    def register(self, slots: WeightSlots, prefix: str) -> None:
        self.input_layernorm.register(slots, f"{prefix}.input_layernorm")
        self.post_attention_layernorm.register(slots, f"{prefix}.post_attention_layernorm")
        mixer_name = "self_attn" if self.layer_type == "full_attention" else "linear_attn"
        self.mixer.register(slots, f"{prefix}.{mixer_name}")
        self.mlp.register(slots, f"{prefix}.mlp")

    def __call__(self, h, residual, positions, batch, cache):
        """h: the previous layer's output (model dtype, or fp32 from a MoE block); residual: the stream
        in :func:`residual_dtype`, None at the first layer (h is then the embedding)."""
        if residual is None:
            residual, x = h.to(residual_dtype(h.dtype)), self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm(h, residual)
        x = self.group.all_reduce(self.mixer(x, positions, batch, cache))
        x, residual = self.post_attention_layernorm(x, residual)
        return self.group.all_reduce(self.mlp(x)), residual
