"""Qwen3.5/3.6 models: config, registry, loading."""
from __future__ import annotations

from pathlib import Path

import torch

from .model_config import ModelConfig
from .registry import MODEL_REGISTRY, model_class

__all__ = ["ModelConfig", "MODEL_REGISTRY", "model_class", "load_model"]


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device="cpu", load_mtp: bool = True,
               progress: bool = True, tp=None, expert_parallel: bool = False):
    """Build the model for ``path``'s config.json and stream its safetensors into it.
    The MTP head is built when ``load_mtp`` and the checkpoint holds ``mtp.*`` tensors. ``tp`` (a
    :class:`~catengine.distributed.TPGroup`): build and read only this rank's shard; the reads are
    kept in ``model.load_reads`` (stored name, dim, ranges, bytes). ``expert_parallel``: each rank holds
    (and reads) whole experts, E / N of them, instead of a slice of every expert."""
    from .loader import iter_checkpoint

    config = ModelConfig.from_pretrained(path)
    with_mtp = load_mtp and _has_mtp(Path(path))
    model = model_class(config.architecture)(config, dtype, device, with_mtp=with_mtp, tp=tp,
                                             expert_parallel=expert_parallel)
    model.load_reads = []
    shard = model.layout.shard if model.layout.size > 1 else None
    weights = iter_checkpoint(path, config, device=device, dtype=dtype, progress=progress, shard=shard,
                              reads=model.load_reads, experts=model.layout.expert_range)
    if not with_mtp:
        weights = ((n, v) for n, v in weights if not n.startswith("mtp."))
    model.load_weights(weights)
    return model


def _has_mtp(path: Path) -> bool:
    """True when the checkpoint holds ``mtp.*`` tensors (reads headers only, following the index)."""
    from .loader import list_tensors

    return any(t.name.startswith("mtp.") for t in list_tensors(path))
