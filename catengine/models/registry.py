"""config.json ``architectures`` -> model class."""
from __future__ import annotations

from ..errors import ConfigError
from .qwen3_5 import Qwen3_5ForCausalLM

MODEL_REGISTRY = {
    "Qwen3_5ForCausalLM": Qwen3_5ForCausalLM,
    "Qwen3_5ForConditionalGeneration": Qwen3_5ForCausalLM,
    "Qwen3_5MoeForCausalLM": Qwen3_5ForCausalLM,
    "Qwen3_5MoeForConditionalGeneration": Qwen3_5ForCausalLM,
}


def model_class(architecture: str):
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ConfigError(f"architecture {architecture!r} is not supported; catengine serves "
                          f"{', '.join(sorted(MODEL_REGISTRY))}") from None
