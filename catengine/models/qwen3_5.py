"""Qwen3.5 / Qwen3.6 text model (dense and MoE, optional MTP head) over the flat batch."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..distributed.group import TPGroup
from ..errors import ConfigError
from ..kernels import ops
from .batch import AttentionCache, BatchMetadata, GDNStateCache, ModelCaches
from .kv_cache_dtype import kv_cache_torch_dtype
from .model_config import ModelConfig
from .layers import DecoderLayer, Norm
from .linear import WeightSlots
from .mtp import MTPHead
from .sharding import TPLayout


class Qwen3_5ForCausalLM:
    """The whole text model. ``__call__`` returns final-norm hidden states; ``compute_logits`` the logits."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device, with_mtp: bool = False, tp=None,
                 expert_parallel: bool = False):
        """``tp``: the :class:`~catengine.distributed.TPGroup` this rank belongs to (None: one rank). The
        model then holds this rank's shard (``self.layout.shard`` names each tensor's slice, the loader
        reads only that) and calls the group's collectives; ``config`` stays the whole model's.
        ``expert_parallel``: the rank holds whole routed experts (``layout.expert_range``)."""
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        self.group = tp if tp is not None else TPGroup.single()
        self.layout = TPLayout.of(config, self.group.rank, self.group.size, expert_parallel)
        self.rope_cache = ops.rope_cos_sin_cache(config.max_position_embeddings, config.rotary_dim,
                                                 config.rope_theta, device=self.device)
        self.layers = [DecoderLayer(config, t, self.rope_cache, self.layout, self.group) for t in config.layer_types]
        self.norm = Norm(config.rms_norm_eps)
        self.embed_tokens: torch.Tensor | None = None   # [V / N, H]: this rank's vocab rows (vocab_range)
        self.lm_head: torch.Tensor | None = None
        self.lm_head_int8: tuple[torch.Tensor, torch.Tensor] | None = None   # (qweight [V, H], scales [V])
        self.mtp = MTPHead(config, self.rope_cache, self.layout, self.group) if with_mtp else None

    # ------------------------------------------------------------------ weights
    def weight_slots(self) -> WeightSlots:
        slots = WeightSlots(self.device, self.dtype)
        slots.add("model.embed_tokens.weight", lambda v: setattr(self, "embed_tokens", v))
        for i, layer in enumerate(self.layers):
            layer.register(slots, f"model.layers.{i}")
        self.norm.register(slots, "model.norm")
        if not self.config.tie_word_embeddings:
            slots.add("lm_head.weight", lambda v: setattr(self, "lm_head", v))
        if self.mtp is not None:
            self.mtp.register(slots, "mtp")
        return slots

    def load_weights(self, weights) -> None:
        """weights: iterable of (normalized checkpoint name, tensor or QuantizedWeight)."""
        slots = self.weight_slots()
        if self.config.tie_word_embeddings:
            # some tied checkpoints still store lm_head.weight: accept and ignore it
            weights = ((n, v) for n, v in weights if n != "lm_head.weight")
        slots.load(weights)
        if self.config.tie_word_embeddings:
            self.lm_head = self.embed_tokens

    def quantize_lm_head(self, mode: str) -> None:
        """``mode`` "int8": replace the lm_head by per-row int8 weights and 16-bit scales (W8A16; computed
        here, after loading). A tied lm_head keeps embed_tokens for the embedding lookups."""
        if mode != "int8":
            raise ConfigError(f"quantize_lm_head {mode!r} is not supported; use 'int8'")
        from ..kernels.w8a16.naive import quantize_per_channel
        self.lm_head_int8 = quantize_per_channel(self.lm_head, self.dtype)
        if not self.config.tie_word_embeddings:
            self.lm_head = None   # the 16-bit copy would otherwise stay resident

    # ------------------------------------------------------------------ caches
    def kv_cache_torch_dtype(self, kv_cache_dtype: str) -> torch.dtype:
        """The K/V tensors' dtype for a :data:`~catengine.models.kv_cache_dtype.KV_CACHE_DTYPES` name."""
        return kv_cache_torch_dtype(kv_cache_dtype, self.dtype)

    @property
    def num_attention_caches(self) -> int:
        return len(self.config.full_attention_layers) + (1 if self.mtp is not None else 0)

    def kv_cache_bytes_per_block(self, block_size: int, kv_cache_dtype: str = "auto") -> int:
        """Per rank: this rank's KV heads (replicated ones counted on every rank that holds them)."""
        c = self.config
        elem = torch.empty(0, dtype=self.kv_cache_torch_dtype(kv_cache_dtype)).element_size()
        return 2 * block_size * self.layout.nkv * c.head_dim * elem * self.num_attention_caches

    def state_bytes_per_slot(self, ssm_dtype: torch.dtype = torch.float32) -> int:
        c, tp = self.config, self.layout
        conv = (c.linear_conv_kernel_dim - 1) * tp.conv_dim * torch.empty(0, dtype=self.dtype).element_size()
        ssm = tp.hv * c.linear_key_head_dim * c.linear_value_head_dim * torch.empty(0, dtype=ssm_dtype).element_size()
        return (conv + ssm) * len(c.linear_attention_layers)

    def allocate_caches(self, num_blocks: int, block_size: int, num_state_slots: int,
                        kv_cache_dtype: str = "auto", device=None,
                        ssm_dtype: torch.dtype = torch.float32) -> ModelCaches:
        """``ssm_dtype``: the recurrent state slots' storage (EngineConfig.mamba_ssm_cache_dtype); the GDN
        kernels load it to fp32, compute in fp32 and round only what they store."""
        c, tp, device = self.config, self.layout, device or self.device
        kv_dtype = self.kv_cache_torch_dtype(kv_cache_dtype)

        def attention_cache():
            shape = (num_blocks, block_size, tp.nkv, c.head_dim)
            return AttentionCache(torch.zeros(shape, dtype=kv_dtype, device=device),
                                  torch.zeros(shape, dtype=kv_dtype, device=device))

        layers = []
        for t in c.layer_types:
            if t == "full_attention":
                layers.append(attention_cache())
            else:
                conv = torch.zeros((num_state_slots, c.linear_conv_kernel_dim - 1, tp.conv_dim),
                                   dtype=self.dtype, device=device)
                ssm = torch.zeros((num_state_slots, tp.hv, c.linear_key_head_dim,
                                   c.linear_value_head_dim), dtype=ssm_dtype, device=device)
                layers.append(GDNStateCache(conv, ssm))
        if self.mtp is not None:
            layers.append(attention_cache())
        return ModelCaches(layers, num_blocks, block_size, num_state_slots)

    # ------------------------------------------------------------------ forward
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return F.embedding(input_ids, self.embed_tokens)
        # vocab-parallel: each token's row lives on one rank, the others add zeros (the sum is exact)
        v0, v1 = self.layout.vocab_range
        local = input_ids - v0
        outside = (local < 0) | (local >= v1 - v0)
        rows = F.embedding(local.masked_fill(outside, 0), self.embed_tokens)
        return self.group.all_reduce(rows.masked_fill(outside[:, None], 0))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: BatchMetadata,
                 caches: ModelCaches) -> torch.Tensor:
        h, residual = self.embed(input_ids), None
        for layer, cache in zip(self.layers, caches.layers):
            h, residual = layer(h, residual, positions, batch, cache)
        h, _ = self.norm(h, residual)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head_int8 is not None:
            logits = ops.w8a16_linear(hidden, *self.lm_head_int8)
        else:
            logits = F.linear(hidden, self.lm_head).float()
        if self.group.size == 1:
            return logits
        # every rank's vocab slice, padded to one width (the last may be short), gathered in rank order
        pad = self.layout.vocab_per_rank - logits.shape[-1]
        if pad:
            logits = F.pad(logits, (0, pad), value=float("-inf"))
        return self.group.all_gather(logits, dim=-1)[..., : self.config.vocab_size]

    def mtp_forward(self, input_ids, positions, hidden_prev, batch: BatchMetadata, caches: ModelCaches):
        """One MTP draft step: hidden state after mtp.norm for each new token (feed compute_logits)."""
        if self.mtp is None:
            raise ConfigError("this checkpoint has no mtp.* weights; speculative decoding with MTP needs them")
        return self.mtp(self.embed(input_ids), hidden_prev, positions, batch, caches.layers[-1])
