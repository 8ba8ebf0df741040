"""Qwen3.5 / Qwen3.6 text model (dense and MoE, optional MTP head) over the flat batch."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..kernels import ops
from .batch import AttentionCache, BatchMetadata, GDNStateCache, ModelCaches
from .kv_cache_dtype import kv_cache_torch_dtype
from .model_config import ModelConfig
from .layers import DecoderLayer, Norm
from .linear import WeightSlots
from .mtp import MTPHead


class Qwen3_5ForCausalLM:
    """The whole text model. ``__call__`` returns final-norm hidden states; ``compute_logits`` the logits."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device, with_mtp: bool = False):
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        self.rope_cache = ops.rope_cos_sin_cache(config.max_position_embeddings, config.rotary_dim,
                                                 config.rope_theta, device=self.device)
        self.layers = [DecoderLayer(config, t, self.rope_cache) for t in config.layer_types]
        self.norm = Norm(config.rms_norm_eps)
        self.embed_tokens: torch.Tensor | None = None
        self.lm_head: torch.Tensor | None = None
        self.lm_head_int8: tuple[torch.Tensor, torch.Tensor] | None = None   # (qweight [V, H], scales [V])
        self.mtp = MTPHead(config, self.rope_cache) if with_mtp else None

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
        c = self.config
        elem = torch.empty(0, dtype=self.kv_cache_torch_dtype(kv_cache_dtype)).element_size()
        return 2 * block_size * c.num_key_value_heads * c.head_dim * elem * self.num_attention_caches

    def state_bytes_per_slot(self, ssm_dtype: torch.dtype = torch.float32) -> int:
        c = self.config
        conv = (c.linear_conv_kernel_dim - 1) * c.conv_dim * torch.empty(0, dtype=self.dtype).element_size()
        ssm = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * \
            torch.empty(0, dtype=ssm_dtype).element_size()
        return (conv + ssm) * len(c.linear_attention_layers)

    def allocate_caches(self, num_blocks: int, block_size: int, num_state_slots: int,
                        kv_cache_dtype: str = "auto", device=None,
                        ssm_dtype: torch.dtype = torch.float32) -> ModelCaches:
        """``ssm_dtype``: the recurrent state slots' storage (EngineConfig.mamba_ssm_cache_dtype); the GDN
        kernels load it to fp32, compute in fp32 and round only what they store."""
        c, device = self.config, device or self.device
        kv_dtype = self.kv_cache_torch_dtype(kv_cache_dtype)

        def attention_cache():
            shape = (num_blocks, block_size, c.num_key_value_heads, c.head_dim)
            return AttentionCache(torch.zeros(shape, dtype=kv_dtype, device=device),
                                  torch.zeros(shape, dtype=kv_dtype, device=device))

        layers = []
        for t in c.layer_types:
            if t == "full_attention":
                layers.append(attention_cache())
            else:
                conv = torch.zeros((num_state_slots, c.linear_conv_kernel_dim - 1, c.conv_dim),
                                   dtype=self.dtype, device=device)
                ssm = torch.zeros((num_state_slots, c.linear_num_value_heads, c.linear_key_head_dim,
                                   c.linear_value_head_dim), dtype=ssm_dtype, device=device)
                layers.append(GDNStateCache(conv, ssm))
        if self.mtp is not None:
            layers.append(attention_cache())
        return ModelCaches(layers, num_blocks, block_size, num_state_slots)

    # ------------------------------------------------------------------ forward
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed_tokens)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: BatchMetadata,
                 caches: ModelCaches) -> torch.Tensor:
        h, residual = self.embed(input_ids), None
        for layer, cache in zip(self.layers, caches.layers):
            h, residual = layer(h, residual, positions, batch, cache)
        h, _ = self.norm(h, residual)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head_int8 is not None:
            return ops.w8a16_linear(hidden, *self.lm_head_int8)
        return F.linear(hidden, self.lm_head).float()

    def mtp_forward(self, input_ids, positions, hidden_prev, batch: BatchMetadata, caches: ModelCaches):
        """One MTP draft step: hidden state after mtp.norm for each new token (feed compute_logits)."""
        if self.mtp is None:
            raise ConfigError("this checkpoint has no mtp.* weights; speculative decoding with MTP needs them")
        return self.mtp(self.embed(input_ids), hidden_prev, positions, batch, caches.layers[-1])
