"""Linear layers whose weight is either dense ([out, in], cuBLAS) or 4-bit (QuantizedWeight, Triton),
and the name -> setter table the loader fills.

Projections that read the same input are merged into one GEMM at load time (q/k/v, gate/up, the GDN
input projections): one launch and one pass over the activations instead of several.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import ModelLoadError
from ..kernels import ops
from ..kernels.w4a16.packing import QuantizedWeight, dequantize


class WeightSlots:
    """Checkpoint name -> setter. The model registers every tensor it expects; the loader feeds them."""

    def __init__(self, device, dtype: torch.dtype):
        self.device, self.dtype = device, dtype
        self.setters: dict[str, Callable] = {}
        self.finalizers: list[Callable[[], None]] = []

    def add(self, name: str, setter: Callable, keep_fp32: bool = False) -> None:
        def set_value(value):
            setter(self.convert(value, torch.float32 if keep_fp32 else self.dtype))
        self.setters[name] = set_value

    def convert(self, value, dtype):
        if isinstance(value, QuantizedWeight):
            return value.to(self.device, self.dtype)
        if value.is_floating_point():
            return value.to(device=self.device, dtype=dtype)
        return value.to(self.device)

    def load(self, weights) -> None:
        """Assign every (name, value); raise ModelLoadError naming missing and unexpected tensors."""
        seen, unexpected = set(), []
        for name, value in weights:
            setter = self.setters.get(name)
            if setter is None:
                unexpected.append(name)
                continue
            setter(value)
            seen.add(name)
        missing = sorted(set(self.setters) - seen)
        if missing or unexpected:
            msg = []
            if missing:
                msg.append(f"missing tensors ({len(missing)}): {', '.join(missing[:20])}")
            if unexpected:
                msg.append(f"unexpected tensors ({len(unexpected)}): {', '.join(sorted(unexpected)[:20])}")
            raise ModelLoadError("checkpoint does not match the model config: " + "; ".join(msg))
        for finalize in self.finalizers:
            finalize()


class Linear:
    """y = x @ W^T (+ b) with W dense [out, in] or a QuantizedWeight (x @ w layout)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        self.in_features, self.out_features = in_features, out_features
        self.weight: torch.Tensor | QuantizedWeight | None = None
        self.bias: torch.Tensor | None = None
        self.has_bias = bias

    def register(self, slots: WeightSlots, name: str) -> None:
        slots.add(f"{name}.weight", lambda v: self._set_weight(v, name))
        if self.has_bias:
            slots.add(f"{name}.bias", lambda v: setattr(self, "bias", v))

    def _set_weight(self, value, name: str) -> None:
        shape = (value.in_features, value.out_features) if isinstance(value, QuantizedWeight) \
            else (value.shape[1], value.shape[0])
        if shape != (self.in_features, self.out_features):
            raise ModelLoadError(f"{name}.weight has in/out features {shape}, the config implies "
                                 f"{(self.in_features, self.out_features)}")
        self.weight = value

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, QuantizedWeight):
            return ops.w4a16_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several projections of one input computed by one GEMM; outputs are concatenated in order."""

    def __init__(self, in_features: int, part_sizes: list[int]):
        super().__init__(in_features, sum(part_sizes))
        self.part_sizes = part_sizes
        self.parts: list = [None] * len(part_sizes)

    def register_part(self, slots: WeightSlots, index: int, name: str) -> None:
        def set_part(value):
            n = value.out_features if isinstance(value, QuantizedWeight) else value.shape[0]
            k = value.in_features if isinstance(value, QuantizedWeight) else value.shape[1]
            if (k, n) != (self.in_features, self.part_sizes[index]):
                raise ModelLoadError(f"{name}.weight has in/out features {(k, n)}, the config implies "
                                     f"{(self.in_features, self.part_sizes[index])}")
            self.parts[index] = value
        slots.add(f"{name}.weight", set_part)
        if index == 0:
            slots.finalizers.append(self._merge)

    def _merge(self) -> None:
        parts, self.parts = self.parts, [None] * len(self.parts)
        quantized = [isinstance(p, QuantizedWeight) for p in parts]
        if all(quantized) and len({p.group_size for p in parts}) == 1:
            self.weight = QuantizedWeight(torch.cat([p.qweight for p in parts], -1),
                                          torch.cat([p.scales for p in parts], -1),
                                          torch.cat([p.zeros for p in parts], -1), parts[0].group_size)
            return
        # Mixed formats (rare: a skip list that leaves one part unquantized) run as one dense GEMM.
        dtype = next(p.dtype for p in parts)
        self.weight = torch.cat([dequantize(p, dtype).t() if q else p for p, q in zip(parts, quantized)], 0)

    def split(self, y: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(y, self.part_sizes, dim=-1))
