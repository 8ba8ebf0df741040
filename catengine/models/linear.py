"""Linear layers whose weight is either dense ([out, in]: cuBLAS, or the skinny kernel for few columns at decode
sizes) or 4-bit (QuantizedWeight, Triton), and the name -> setter table the loader fills.

Projections that read the same input are merged into one GEMM at load time (q/k/v, gate/up, the GDN
input projections): one launch and one pass over the activations instead of several.
"""
from __future__ import annotations

from typing import Callable

import torch

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


class SkinnyCounters:
    """The int32 arrival counters of one dense weight's ``ops.skinny_linear`` calls (its in-kernel split-K reduce;
    each call leaves them zero): ``ops.skinny_counters`` of them, allocated at the first eager CUDA call and kept,
    since a captured CUDA graph holds their address. None before that when the first call is inside a capture (the
    op then runs cuBLAS wherever it would split K), and on devices where the op never splits K in-kernel."""

    def __init__(self):
        self.buf: torch.Tensor | None = None
        self.shape = None     # (N, K) that ``size`` was computed for
        self.size = 0

    def take(self, weight: torch.Tensor) -> torch.Tensor | None:
        if weight.shape != self.shape:
            # a shape the buffer was not sized for gets None from held_counters if it needs more: cuBLAS, not a
            # wrong answer
            self.shape, self.size = weight.shape, ops.skinny_counters(weight)
        if not self.size:
            return None
        # imported here, past the CPU's return above: splitk imports Triton, which a CPU process never loads
        from ..kernels.common.splitk import held_counters
        return held_counters(self, "buf", weight.device, self.size, self.size)

    def reset(self) -> None:
        """Forget the buffer (the owner's weight was replaced): the next eager call sizes a new one."""
        self.buf, self.shape, self.size = None, None, 0


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 counters: SkinnyCounters) -> torch.Tensor:
    """x @ weight^T (+ bias) for a dense [out, in] weight: ``ops.skinny_linear`` (one launch for few columns at
    decode sizes on the rows that have its kernel, cuBLAS otherwise) with the weight's counters."""
    return ops.skinny_linear(x, weight, bias, counters.take(weight))


class Linear:
    """y = x @ W^T (+ b) with W dense [out, in] or a QuantizedWeight (x @ w layout)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        self.in_features, self.out_features = in_features, out_features
        self.weight: torch.Tensor | QuantizedWeight | None = None
        self.bias: torch.Tensor | None = None
        self.has_bias = bias
        self.counters = SkinnyCounters()   # a dense weight's, for dense_linear

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
        self.counters.reset()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, QuantizedWeight):
            return ops.w4a16_linear(x, self.weight, self.bias)
        return dense_linear(x, self.weight, self.bias, self.counters)


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
        self.counters.reset()
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
