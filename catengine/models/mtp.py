"""The multi-token-prediction head shipped with Qwen3.5/3.6 checkpoints (``mtp.*``).

h = norm(layer0(fc(cat[norm_e(embed(token)), norm_h(h_prev)]), pos)); it shares embed_tokens and lm_head
with the main model. Speculative decoding drives it (k drafts reuse the same layer).
"""
from __future__ import annotations

import torch

from .batch import AttentionCache, BatchMetadata
from .model_config import ModelConfig
from .layers import DecoderLayer, Norm
from .linear import Linear, WeightSlots
from .sharding import TPLayout


class MTPHead:
    def __init__(self, config: ModelConfig, rope_cache: torch.Tensor, tp: TPLayout, group):
        eps = config.rms_norm_eps
        self.pre_fc_norm_embedding, self.pre_fc_norm_hidden, self.norm = Norm(eps), Norm(eps), Norm(eps)
        # fc is replicated (2H x H, small beside the layer): its output feeds the layer on every rank
        self.fc = Linear(2 * config.hidden_size, config.hidden_size)
        # one full-attention decoder layer (MoE block for MoE models), with its own KV cache, sharded as
        # the main model's layers are
        self.layer = DecoderLayer(config, "full_attention", rope_cache, tp, group)

    def register(self, slots: WeightSlots, prefix: str) -> None:
        self.pre_fc_norm_embedding.register(slots, f"{prefix}.pre_fc_norm_embedding")
        self.pre_fc_norm_hidden.register(slots, f"{prefix}.pre_fc_norm_hidden")
        self.norm.register(slots, f"{prefix}.norm")
        self.fc.register(slots, f"{prefix}.fc")
        self.layer.register(slots, f"{prefix}.layers.0")

    def __call__(self, embeds, hidden_prev, positions, batch: BatchMetadata, cache: AttentionCache):
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden_prev)], dim=-1))
        h, residual = self.layer(x, None, positions, batch, cache)
        h, _ = self.norm(h, residual)
        return h
