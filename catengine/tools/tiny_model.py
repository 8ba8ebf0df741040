"""Tiny random Qwen3.5 checkpoints written with transformers (tokenizer files copied from the demo model, the
vocabulary cut to 2,048 tokens): what the engine tests run on, and what ``bench/host_step.py`` times the host side
of an engine step with."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

TINY_VOCAB = 2048
TOKENIZER_KEEP = 2000   # BPE tokens kept; the 33 special tokens follow (ids 2000..2032)


def write_tiny_model(out, *, seed: int = 0, vocab_size: int = TINY_VOCAB, full_attention_every: int = 2,
                     num_layers: int = 4, max_position_embeddings: int = 4096) -> None:
    """A random float32 Qwen3.5 checkpoint. The weights are drawn wider than transformers' default
    (std 0.1 instead of 0.02) so that greedy outputs depend on the context instead of collapsing
    into one repeated token: a scheduling bug then changes the output."""
    import transformers

    from .demo import demo_model_path

    layer_types = ["full_attention" if (i + 1) % full_attention_every == 0 else "linear_attention"
                   for i in range(num_layers)]
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=num_layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=96, rms_norm_eps=1e-6,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=False, linear_conv_kernel_dim=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=layer_types, initializer_range=0.1,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5})
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.Qwen3_5ForCausalLM(cfg)
    model.save_pretrained(str(out))
    demo = demo_model_path()
    shutil.copy(demo / "tokenizer_config.json", out / "tokenizer_config.json")
    write_small_tokenizer(demo / "tokenizer.json", out / "tokenizer.json", TOKENIZER_KEEP)


def write_small_tokenizer(src, dst, keep: int) -> None:
    """The demo (Qwen3.5) tokenizer cut to its first ``keep`` BPE tokens, special tokens renumbered
    to follow them. Ids 0..255 are the 256 byte tokens, so every text still encodes (rare words and
    multi-byte characters as bytes: byte-fallback streams are exercised). Loading the full 248K-token
    file takes seconds per engine; this one loads in milliseconds."""
    data = json.loads(Path(src).read_text(encoding="utf-8"))
    model = data["model"]
    vocab = {t: i for t, i in model["vocab"].items() if i < keep}
    merges = [m for m in model["merges"]
              if (m if isinstance(m, list) else m.split(" "))[0] in vocab
              and (m if isinstance(m, list) else m.split(" "))[1] in vocab
              and "".join(m if isinstance(m, list) else m.split(" ")) in vocab]
    model["vocab"], model["merges"] = vocab, merges
    for k, tok in enumerate(data["added_tokens"]):
        tok["id"] = keep + k
    Path(dst).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
