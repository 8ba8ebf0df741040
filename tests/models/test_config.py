"""ModelConfig reads both published config layouts; bad configs and checkpoints fail with messages that say why."""
import pytest
import torch

from catengine.errors import ConfigError, ModelLoadError
from catengine.models import ModelConfig, model_class

from .helpers import build_hf_model, ours_from_hf, tiny_text_config

TEXT = dict(tiny_text_config(), architectures=["Qwen3_5ForCausalLM"], eos_token_id=248046)


def test_text_only_and_conditional_generation_layouts_agree():
    flat = ModelConfig.from_hf(TEXT)
    nested = ModelConfig.from_hf({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": {k: v for k, v in TEXT.items() if k != "architectures"},
        "vision_config": {"depth": 2}, "tie_word_embeddings": False,
    })
    fields = [f for f in ModelConfig.__dataclass_fields__ if f not in ("architecture", "hf_config")]
    assert {f: getattr(flat, f) for f in fields} == {f: getattr(nested, f) for f in fields}
    assert flat.rotary_dim == 8 and flat.full_attention_layers == [3] and flat.eos_token_ids == (248046,)


def test_moe_fields():
    cfg = ModelConfig.from_hf(dict(tiny_text_config(moe=True), architectures=["Qwen3_5MoeForCausalLM"]))
    assert cfg.is_moe and cfg.num_experts == 8 and cfg.num_experts_per_tok == 2 and cfg.intermediate_size == 0


def test_default_layer_pattern_is_every_fourth_full():
    cfg = dict(TEXT, num_hidden_layers=8)
    del cfg["layer_types"]
    assert ModelConfig.from_hf(cfg).full_attention_layers == [3, 7]


def test_unknown_architecture_is_a_clear_error():
    with pytest.raises(ConfigError, match="LlamaForCausalLM.*not supported.*Qwen3_5ForCausalLM"):
        model_class(ModelConfig.from_hf(dict(TEXT, architectures=["LlamaForCausalLM"])).architecture)


@pytest.mark.parametrize("quant,match", [
    ({"quant_method": "gptq", "bits": 4}, "gptq.*not supported"),
    ({"quant_method": "awq", "bits": 8, "version": "gemm"}, "4-bit AWQ GEMM"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {}}, "pack-quantized"),
])
def test_unsupported_quantization_fails_clearly(quant, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_hf(dict(TEXT, quantization_config=quant))


def test_missing_and_unexpected_tensors_are_named():
    hf = build_hf_model(seed=5)
    config = ModelConfig.from_hf(hf.config.to_dict())
    model = model_class(config.architecture)(config, torch.float32, "cpu")
    sd = dict(hf.state_dict())
    del sd["model.layers.1.linear_attn.A_log"]
    sd["model.layers.0.mystery.weight"] = torch.zeros(3)
    with pytest.raises(ModelLoadError, match=r"missing.*layers\.1\.linear_attn\.A_log.*unexpected.*mystery"):
        model.load_weights(sd.items())


def test_wrong_shape_is_named():
    hf = build_hf_model(seed=6)
    sd = dict(hf.state_dict())
    sd["model.layers.3.self_attn.o_proj.weight"] = torch.zeros(64, 100)
    config = ModelConfig.from_hf(hf.config.to_dict())
    with pytest.raises(ModelLoadError, match="o_proj"):
        model_class(config.architecture)(config, torch.float32, "cpu").load_weights(sd.items())


def test_cache_sizes_follow_the_config():
    ours = ours_from_hf(build_hf_model(seed=7))
    c = ours.config
    assert ours.kv_cache_bytes_per_block(16) == 2 * 16 * c.num_key_value_heads * c.head_dim * 4 * 1
    assert ours.kv_cache_bytes_per_block(16, "fp8_e5m2") == 2 * 16 * c.num_key_value_heads * c.head_dim * 1
    caches = ours.allocate_caches(3, 16, 2, "fp8_e5m2")
    assert caches.layers[3].k.dtype == torch.uint8 and caches.layers[0].ssm.shape == (2, 4, 16, 16)
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        ours.allocate_caches(1, 16, 1, "int4")


def test_one_kv_cache_dtype_vocabulary():
    """config.py validates against the names the model maps; a name one rejects the other rejects too."""
    from catengine import config
    from catengine.models import kv_cache_dtype

    assert config.KV_CACHE_DTYPES is kv_cache_dtype.KV_CACHE_DTYPES
    for name in kv_cache_dtype.KV_CACHE_DTYPES:
        config.EngineConfig(kv_cache_dtype=name).validate()
        kv_cache_dtype.kv_cache_torch_dtype(name, torch.float16)
    for name in ("fp8", "fp8_e4m3", "float16", None):
        with pytest.raises(ConfigError, match="kv_cache_dtype"):
            config.EngineConfig(kv_cache_dtype=name).validate()
        with pytest.raises(ConfigError, match="kv_cache_dtype"):
            kv_cache_dtype.kv_cache_torch_dtype(name, torch.float16)
