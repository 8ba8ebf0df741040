"""Tiny random Qwen3.5 models built with transformers (the oracle) and run through catengine."""
from __future__ import annotations

import torch
import transformers

from catengine.models import ModelConfig, model_class
from catengine.models.batch import BatchMetadata


def tiny_text_config(moe: bool = False, **overrides) -> dict:
    cfg = dict(
        vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=96, rms_norm_eps=1e-6, max_position_embeddings=4096,
        tie_word_embeddings=False, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    )
    if moe:
        cfg.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
    cfg.update(overrides)
    return cfg


def build_hf_model(moe: bool = False, seed: int = 0, **overrides):
    """A float32 transformers model with random weights (norm weights randomised too, so (1 + w) is tested)."""
    torch.manual_seed(seed)
    cfg_dict = tiny_text_config(moe, **overrides)
    if moe:
        config = transformers.Qwen3_5MoeTextConfig(**cfg_dict)
        config.architectures = ["Qwen3_5MoeForCausalLM"]
        model = transformers.Qwen3_5MoeForCausalLM(config)
    else:
        config = transformers.Qwen3_5TextConfig(**cfg_dict)
        config.architectures = ["Qwen3_5ForCausalLM"]
        model = transformers.Qwen3_5ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.normal_(0.0, 0.1) if "linear_attn.norm" not in name else p.uniform_(0.5, 1.5)
            elif "experts" in name or name.endswith("gate.weight"):
                p.normal_(0.0, 0.1)
    return model.float().eval()


def ours_from_hf(hf_model, dtype=torch.float32):
    """catengine model with the transformers model's weights (fed by name, bypassing the file loader)."""
    config = ModelConfig.from_hf(hf_model.config.to_dict())
    model = model_class(config.architecture)(config, dtype, "cpu")
    model.load_weights((n, p.detach()) for n, p in hf_model.state_dict().items())
    return model


class PagedRunner:
    """Drives our model step by step through a paged KV cache and GDN state slots, like the engine will."""

    def __init__(self, model, num_blocks: int = 64, block_size: int = 4, num_slots: int = 8, kv_cache_dtype="auto"):
        self.model, self.block_size = model, block_size
        self.caches = model.allocate_caches(num_blocks, block_size, num_slots, kv_cache_dtype)
        self.free_blocks = list(range(num_blocks))[::-1]
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def step(self, chunks: dict[int, list[int]], all_rows: bool = False) -> torch.Tensor:
        """chunks: slot -> new token ids. Returns the logits of each chunk's last token, [B, V] (of
        every new token, [sum of chunk lengths, V], with all_rows)."""
        qlens, slens, tables, slots, ids = [], [], [], [], []
        for slot, toks in chunks.items():
            cached = self.lens.get(slot, 0)
            total = cached + len(toks)
            table = self.tables.setdefault(slot, [])
            while len(table) * self.block_size < total:
                table.append(self.free_blocks.pop())
            qlens.append(len(toks)); slens.append(total); tables.append(table); slots.append(slot); ids += toks
            self.lens[slot] = total
        device = self.model.device
        batch = BatchMetadata.build(qlens, slens, tables, self.block_size, slots, device=device)
        positions = BatchMetadata.positions(qlens, slens, device=device)
        hidden = self.model(torch.tensor(ids, device=device), positions, batch, self.caches)
        if all_rows:
            return self.model.compute_logits(hidden)
        last = torch.tensor(qlens, device=device).cumsum(0) - 1
        return self.model.compute_logits(hidden[last])
