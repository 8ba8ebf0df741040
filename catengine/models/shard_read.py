"""Reading one tensor-parallel rank's slice of each checkpoint tensor (used by ``loader.iter_checkpoint``).

Dense tensors are cut where :meth:`TPLayout.shard` says. A 4-bit linear is cut in its logical [N, K]
coordinates, mapped onto each format's stored tensors (see ``quant_formats.py`` for the layouts):

=================  ===================  =========================
stored tensor      split N (column)     split K (row)
=================  ===================  =========================
AWQ qweight        dim 1, / 8           dim 0
AWQ qzeros         dim 1, / 8           dim 0, / G
AWQ scales         dim 1                dim 0, / G
CT weight_packed   dim 0                dim 1, / 8
CT weight_scale    dim 0                dim 0, / G  (dim 1)
CT zero_point      dim 0, / 8 (ceil)    dim 1, / G
CT g_idx           whole                dim 0 (renumbered)
=================  ===================  =========================

A cut that falls inside a packed word or a scale group cannot be taken: ConfigError naming the module
and the fix (a smaller tensor_parallel_size, or a group size that divides the slice).
"""
from __future__ import annotations

import math

import torch

from ..errors import ConfigError
from .sharding import Shard

# (format, part) -> (stored dim for an N split, N divisor, stored dim for a K split, K divisor: 8, "G" or 1)
_QUANT_CUTS = {
    ("awq", "qweight"): (1, 8, 0, 1), ("awq", "qzeros"): (1, 8, 0, "G"), ("awq", "scales"): (1, 1, 0, "G"),
    ("compressed-tensors", "weight_packed"): (0, 1, 1, 8), ("compressed-tensors", "weight_scale"): (0, 1, 1, "G"),
    ("compressed-tensors", "weight_zero_point"): (0, 8, 1, "G"), ("compressed-tensors", "weight_g_idx"): (None, 1, 0, 1),
}


def read_slice(f, info, cut: tuple[int, tuple[tuple[int, int], ...]]) -> torch.Tensor:
    """Only ``cut``'s ranges of tensor ``info`` from the open safetensors file ``f``, concatenated."""
    dim, ranges = cut
    view = f.get_slice(info.name)
    parts = []
    for a, b in ranges:
        index = [slice(None)] * len(info.shape)
        index[dim] = slice(a, b)
        parts.append(view[tuple(index)])
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


class Slicer:
    """Stored tensor -> the (dim, ranges) this rank reads, from the layout's logical shards."""

    def __init__(self, plan, shard):
        self.plan, self.shard = plan, shard
        self.infos = {t.name: t for t in plan.tensors}

    def _module_dims(self, module: str) -> tuple[int, int, int, str]:
        """(N, K, G, format) of a quantized module, from its stored shapes."""
        fmt, parts = self.plan.formats[module], self.plan.quant[module]
        if fmt == "awq":
            k, n8 = self.infos[parts["qweight"]].shape
            return n8 * 8, k, k // self.infos[parts["scales"]].shape[0], fmt
        n, k8 = self.infos[parts["weight_packed"]].shape
        return n, k8 * 8, k8 * 8 // self.infos[parts["weight_scale"]].shape[1], fmt

    def cut(self, info) -> tuple[int, tuple[tuple[int, int], ...]] | None:
        kind, key = self.plan.route[info.name]
        if kind == "dense":
            s = self.shard(key)
            return (s.dim, s.ranges) if s is not None else None
        s = self.shard(f"{key}.weight")
        part = info.name.rpartition(".")[2]
        if s is None or part == "weight_shape":
            return None
        n, k, g, fmt = self._module_dims(key)
        n_dim, n_div, k_dim, k_div = _QUANT_CUTS[(fmt, part)]
        dim, div, total = (n_dim, n_div, n) if s.dim == 0 else (k_dim, k_div, k)
        if dim is None:
            return None
        div = g if div == "G" else div
        need = math.lcm(8, g) if s.dim == 1 else div   # a row split keeps whole groups and words
        for a, b in s.ranges:
            if a % need or (b % need and b != total):
                side = "output" if s.dim == 0 else "input"
                why = "a packed 4-bit word" if need == 8 else f"a quantization group of {g}"
                raise ConfigError(f"{key}: tensor parallelism cuts its {side} dimension ({total}) at {a}..{b}, "
                                  f"inside {why}; use a smaller tensor_parallel_size or a checkpoint quantized "
                                  f"with a group size that divides {b - a}")
        return dim, tuple((a // div, -(-b // div)) for a, b in s.ranges)

    def fix(self, info, tensor: torch.Tensor) -> torch.Tensor:
        """Values that name positions inside the full tensor, renumbered for the slice."""
        kind, key = self.plan.route[info.name]
        if kind != "part":
            return tensor
        s = self.shard(f"{key}.weight")
        if s is None:
            return tensor
        part = info.name.rpartition(".")[2]
        n, k, g, _ = self._module_dims(key)
        if part == "weight_shape":
            return torch.tensor([s.size if s.dim == 0 else n, s.size if s.dim == 1 else k], dtype=tensor.dtype)
        if part == "weight_g_idx" and s.dim == 1:
            return tensor - s.ranges[0][0] // g
        return tensor


__all__ = ["Shard", "Slicer", "read_slice"]
