"""Tiny random Qwen3.5 models whose residual stream outgrows fp16 (65,504), as the real bf16-trained
checkpoints' massive activations do, while every single op's output still fits in fp16.

Scaled from the float32 random model of :func:`build_hf_model`: the embedding to ~55K (the stream
starts near the limit), the down projections (and the up projections or the experts' gate_up, whose
SiLU-mul output feeds them) so that each MLP / MoE block adds 20-60K to the stream; the normed inputs
keep every layer's own products O(1) whatever the stream's size. All weights are then rounded to fp16
(in place, float32 kept), so an fp16 run and a float32 run share the same weights exactly and differ
only in activation arithmetic.
"""
from __future__ import annotations

import torch

from catengine.models.layers import DecoderLayer

from .helpers import build_hf_model

FP16_MAX = 65504.0

# (name suffix, factor), first match wins. The fp16-rounded weights stay finite: the largest is ~54K.
SCALES = {
    "dense": (("embed_tokens.weight", 6e5), ("mlp.down_proj.weight", 3e5), ("mlp.up_proj.weight", 10.0)),
    "moe": (("embed_tokens.weight", 6e5), ("mlp.experts.down_proj", 6e3), ("mlp.experts.gate_up_proj", 3.0),
            ("shared_expert.down_proj.weight", 3e5)),
}


def build_overflow_hf(kind: str, seed: int = 5, **overrides):
    """A float32 transformers model (kind "dense" or "moe") with fp16-representable, scaled weights;
    ``overrides`` go to the tiny config (the GPU tests need a head dim the Triton attention supports)."""
    hf = build_hf_model(moe=kind == "moe", seed=seed, **overrides)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            factor = next((f for suffix, f in SCALES[kind] if name.endswith(suffix)), 1.0)
            p.mul_(factor)
            p.copy_(p.half().float())
            assert torch.isfinite(p).all(), name
    return hf


class StreamProbe:
    """Records, for each decoder layer call, max |layer output| and max |stream after the layer| (the
    sum the next norm forms), both in fp32: what an fp16 stream would have had to hold."""

    def __init__(self, monkeypatch):
        self.outputs: list[float] = []
        self.streams: list[float] = []
        original = DecoderLayer.__call__

        def recording(layer, h, residual, *args):
            out, res = original(layer, h, residual, *args)
            self.outputs.append(out.float().abs().max().item())
            self.streams.append((out.float() + res.float()).abs().max().item())
            return out, res

        monkeypatch.setattr(DecoderLayer, "__call__", recording)
