"""Tiny random Qwen3.5 checkpoints (dense and MoE) with a random MTP head under the published ``mtp.*`` names,
and the engine runs the speculative tests compare."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from catengine import Engine


def write_tiny_mtp_model(out: Path, *, moe: bool = False, seed: int = 0) -> Path:
    import transformers
    from safetensors.torch import load_file, save_file

    from catengine.tools.demo import demo_model_path
    from catengine.tools.tiny_model import TINY_VOCAB, TOKENIZER_KEEP, write_small_tokenizer

    cfg = dict(vocab_size=TINY_VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, intermediate_size=96, rms_norm_eps=1e-6,
               max_position_embeddings=4096, tie_word_embeddings=False, linear_conv_kernel_dim=4,
               linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
               layer_types=["linear_attention", "full_attention"] * 2, initializer_range=0.1,
               rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5})
    if moe:
        cfg.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
        config, cls = transformers.Qwen3_5MoeTextConfig(**cfg), transformers.Qwen3_5MoeForCausalLM
        config.architectures = ["Qwen3_5MoeForCausalLM"]
    else:
        config, cls = transformers.Qwen3_5TextConfig(**cfg), transformers.Qwen3_5ForCausalLM
        config.architectures = ["Qwen3_5ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model.save_pretrained(str(out))
    # the MTP head: norms, fc and one full-attention decoder layer (layer 1 is the template of its shapes)
    g = torch.Generator().manual_seed(seed + 1)
    h = config.hidden_size
    mtp = {f"mtp.{n}.weight": torch.randn(h, generator=g) * 0.1
           for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}
    mtp["mtp.fc.weight"] = torch.randn(h, 2 * h, generator=g) / (2 * h) ** 0.5
    for name, p in model.model.layers[1].state_dict().items():
        mtp[f"mtp.layers.0.{name}"] = torch.randn(p.shape, generator=g) * p.float().std().clamp_min(0.05)
    files = sorted(out.glob("*.safetensors"))
    assert len(files) == 1, files
    tensors = load_file(str(files[0]))
    tensors.update({k: v.contiguous() for k, v in mtp.items()})
    save_file(tensors, str(files[0]), metadata={"format": "pt"})
    cfg_path = out / "config.json"
    c = json.loads(cfg_path.read_text())
    c["mtp_num_hidden_layers"] = 1
    cfg_path.write_text(json.dumps(c))
    demo = demo_model_path()
    shutil.copy(demo / "tokenizer_config.json", out / "tokenizer_config.json")
    write_small_tokenizer(demo / "tokenizer.json", out / "tokenizer.json", TOKENIZER_KEEP)
    return out


def engine(path, k: int = 0, disable_by_batch_size: int | None = None, **kwargs) -> Engine:
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    if spec and disable_by_batch_size:
        spec["disable_by_batch_size"] = disable_by_batch_size
    return Engine(model=str(path), device="cpu", speculative_config=spec, **kwargs)


def outputs(results) -> dict[tuple[str, int], list[int]]:
    return {(r.request_id, c.index): list(c.token_ids) for r in results for c in r.outputs}


def finish(results) -> dict[tuple[str, int], tuple]:
    return {(r.request_id, c.index): (c.finish_reason, c.stop_reason, c.text) for r in results for c in r.outputs}
