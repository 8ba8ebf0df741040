"""On-disk 4-bit formats <-> the canonical :class:`QuantizedWeight` (see ``kernels/packing.py``).

Both directions live here: the loader reads the formats, the quantizer writes them.

AutoAWQ GEMM (per linear ``<module>.{qweight,qzeros,scales}``):
  ``qweight`` int32 ``[K, N/8]`` and ``qzeros`` int32 ``[K/G, N/8]`` pack eight *columns* per word,
  nibble ``i`` holding column ``8c + AWQ_ORDER[i]``; ``scales`` ``[K/G, N]`` (fp16); w = (q - z) * s.
compressed-tensors ``pack-quantized`` (``<module>.{weight_packed,weight_scale,weight_shape[,weight_zero_point]}``):
  ``weight_packed`` int32 ``[N, K/8]``, element ``(n, 8c+i)`` at bits ``4i`` of word ``(n, c)``;
  ``weight_scale`` ``[N, K/G]``; ``weight_shape`` = ``[N, K]``; ``weight_zero_point`` int32 ``[ceil(N/8), K/G]``
  packed along dim 0 (asymmetric only). Every stored nibble is the signed value + 8, weights and zero
  points alike, so the stored nibbles are exactly the canonical codes and a symmetric zero is 8.

Every conversion moves bits only (no float arithmetic on weights), so the canonical dequantization equals
each format's own dequantization bit for bit in the scales' dtype.
"""
from __future__ import annotations

import re
from typing import Iterable

import torch

from ..errors import ModelLoadError
from ..kernels.w4a16.packing import QuantizedWeight

# nibble i of an AWQ word holds column AWQ_ORDER[i] of its 8-column pack (AutoAWQ's GEMM order)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_PARTS = ("qweight", "qzeros", "scales")
CT_REQUIRED = ("weight_packed", "weight_scale", "weight_shape")
CT_OPTIONAL = ("weight_zero_point", "weight_g_idx")
# tensor suffixes of quantization schemes catengine cannot run: FP8 block/tensor scales, NVFP4, GPTQ act-order,
# activation quantization
UNSUPPORTED_PARTS = ("weight_scale_inv", "weight_global_scale", "weight_scale_2", "input_scale",
                     "input_global_scale", "input_zero_point", "g_idx")
QUANT_PARTS = frozenset(AWQ_PARTS + CT_REQUIRED + CT_OPTIONAL + UNSUPPORTED_PARTS)


def module_format(module: str, parts: Iterable[str]) -> str:
    """"awq" or "compressed-tensors" for the set of quantization tensor suffixes found under ``module``;
    ModelLoadError naming the tensors when the set is incomplete, mixed or of an unsupported scheme."""
    parts = set(parts)
    names = ", ".join(f"{module}.{p}" for p in sorted(parts))
    bad = parts & set(UNSUPPORTED_PARTS)
    if bad:
        raise ModelLoadError(
            f"{names}: tensors {sorted(bad)} belong to a quantization scheme catengine does not run (FP8, NVFP4, "
            "GPTQ or activation quantization); use an AWQ (4-bit GEMM) or compressed-tensors pack-quantized "
            "W4A16 checkpoint, or an unquantized one")
    awq, ct = parts & set(AWQ_PARTS), parts & set(CT_REQUIRED + CT_OPTIONAL)
    if awq and ct:
        raise ModelLoadError(f"{names}: module mixes AutoAWQ and compressed-tensors tensors")
    if awq:
        missing = [p for p in AWQ_PARTS if p not in parts]
        kind = "awq"
    else:
        missing = [p for p in CT_REQUIRED if p not in parts]
        kind = "compressed-tensors"
    if missing:
        raise ModelLoadError(f"quantized module {module} ({kind}) lacks tensors "
                             f"{', '.join(f'{module}.{p}' for p in missing)}; found {names}. "
                             "The checkpoint is incomplete: re-download or re-quantize it")
    return kind


# ----------------------------------------------------------------------------- nibble helpers
def _unpack_cols(packed: torch.Tensor, order=range(8)) -> torch.Tensor:
    """int32 ``[..., R, C/8]`` -> uint8 codes ``[..., R, C]`` where nibble i of word c is column 8c+order[i]."""
    *lead, r, c8 = packed.shape
    out = torch.empty((*lead, r, c8, 8), dtype=torch.uint8, device=packed.device)
    for i, col in enumerate(order):
        out[..., col] = ((packed >> (4 * i)) & 0xF).to(torch.uint8)
    return out.reshape(*lead, r, c8 * 8)


def _pack_cols(codes: torch.Tensor, order=range(8)) -> torch.Tensor:
    """Inverse of :func:`_unpack_cols`: codes ``[..., R, C]`` (0..15) -> int32 ``[..., R, C/8]``."""
    *lead, r, c = codes.shape
    if c % 8:
        raise ValueError(f"dimension {c} must be a multiple of 8 to pack 4-bit codes")
    codes = codes.reshape(*lead, r, c // 8, 8)
    acc = torch.zeros((*lead, r, c // 8), dtype=torch.int64, device=codes.device)
    for i, col in enumerate(order):
        acc |= codes[..., col].to(torch.int64) << (4 * i)
    return _wrap_int32(acc)


def _unpack_rows(packed: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """int32 ``[..., R/8, C]`` (nibble i = row 8r+i) -> uint8 codes ``[..., rows, C]``."""
    *lead, r8, c = packed.shape
    out = torch.empty((*lead, r8, 8, c), dtype=torch.uint8, device=packed.device)
    for i in range(8):
        out[..., i, :] = ((packed >> (4 * i)) & 0xF).to(torch.uint8)
    out = out.reshape(*lead, r8 * 8, c)
    return out if rows is None else out[..., :rows, :]


def _pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """codes ``[..., R, C]`` -> int32 ``[..., ceil(R/8), C]``; padding rows hold nibble 0 (as compressed-tensors)."""
    *lead, r, c = codes.shape
    pad = -r % 8
    if pad:
        codes = torch.cat([codes, codes.new_zeros((*lead, pad, c))], dim=-2)
    codes = codes.reshape(*lead, (r + pad) // 8, 8, c)
    acc = torch.zeros((*lead, (r + pad) // 8, c), dtype=torch.int64, device=codes.device)
    for i in range(8):
        acc |= codes[..., i, :].to(torch.int64) << (4 * i)
    return _wrap_int32(acc)


def _wrap_int32(x: torch.Tensor) -> torch.Tensor:
    # words with the top nibble >= 8 are negative int32 values
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def _zero_codes(zeros: torch.Tensor) -> torch.Tensor:
    z = zeros.to(torch.float32)
    codes = z.round()
    if not torch.equal(codes, z) or (codes < 0).any() or (codes > 15).any():
        raise ValueError("zero points must be integers in 0..15 to be stored as 4-bit codes")
    return codes.to(torch.uint8)


def _group_size(module: str, k: int, groups: int) -> int:
    if groups <= 0 or k % groups:
        raise ModelLoadError(f"{module}: {groups} scale groups do not divide the input dimension {k}; only group "
                             "sizes that divide the input dimension are supported")
    return k // groups


# ----------------------------------------------------------------------------- AutoAWQ GEMM
def awq_to_canonical(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                     dtype: torch.dtype | None = None, module: str = "<module>") -> QuantizedWeight:
    """AutoAWQ GEMM tensors of one linear -> canonical (scales/zeros in ``dtype``, default the scales')."""
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32 or qweight.dim() != 2:
        raise ModelLoadError(f"{module}.qweight/qzeros must be 2-D int32 (AutoAWQ GEMM), got "
                             f"{qweight.dtype} {tuple(qweight.shape)} and {qzeros.dtype} {tuple(qzeros.shape)}")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    groups = scales.shape[0]
    if scales.shape != (groups, n) or qzeros.shape != (groups, n // 8):
        raise ModelLoadError(
            f"{module}: shapes qweight {tuple(qweight.shape)}, qzeros {tuple(qzeros.shape)}, scales "
            f"{tuple(scales.shape)} are not the AutoAWQ GEMM layout ([K, N/8], [K/G, N/8], [K/G, N]); "
            "GEMV/Marlin/GPTQ-packed AWQ checkpoints are not supported")
    if k % 8:
        raise ModelLoadError(f"{module}: input dimension {k} is not a multiple of 8")
    g = _group_size(module, k, groups)
    qw = _pack_rows(_unpack_cols(qweight, AWQ_ORDER))
    zeros = _unpack_cols(qzeros, AWQ_ORDER)
    dtype = dtype or scales.dtype
    return QuantizedWeight(qw, scales.to(dtype), zeros.to(dtype), g)


def canonical_to_awq(w: QuantizedWeight, scale_dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """Canonical 2-D weight -> ``{"qweight", "qzeros", "scales"}`` (AutoAWQ GEMM; fp16 scales by convention)."""
    if w.qweight.dim() != 2:
        raise ValueError("canonical_to_awq takes one linear (2-D qweight); split stacked experts first")
    codes = _unpack_rows(w.qweight)
    return {"qweight": _pack_cols(codes, AWQ_ORDER).contiguous(),
            "qzeros": _pack_cols(_zero_codes(w.zeros), AWQ_ORDER).contiguous(),
            "scales": w.scales.to(scale_dtype).contiguous()}


# ----------------------------------------------------------------------------- compressed-tensors
def ct_to_canonical(weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_shape: torch.Tensor,
                    weight_zero_point: torch.Tensor | None = None, weight_g_idx: torch.Tensor | None = None,
                    dtype: torch.dtype | None = None, module: str = "<module>") -> QuantizedWeight:
    """compressed-tensors pack-quantized tensors of one linear -> canonical."""
    shape = [int(v) for v in weight_shape.reshape(-1).tolist()]
    if weight_packed.dtype != torch.int32 or weight_packed.dim() != 2 or len(shape) != 2:
        raise ModelLoadError(f"{module}.weight_packed must be 2-D int32 with a 2-element weight_shape, got "
                             f"{weight_packed.dtype} {tuple(weight_packed.shape)} and weight_shape {shape}")
    n, k = shape
    if weight_packed.shape != (n, k // 8) or k % 8:
        raise ModelLoadError(f"{module}.weight_packed {tuple(weight_packed.shape)} does not hold 4-bit values of "
                             f"weight_shape {shape} (needs [N, K/8] with K a multiple of 8)")
    groups = weight_scale.shape[-1]
    if weight_scale.shape != (n, groups):
        raise ModelLoadError(f"{module}.weight_scale has shape {tuple(weight_scale.shape)}, expected [{n}, K/G] "
                             "(strategy 'group')")
    g = _group_size(module, k, groups)
    if weight_g_idx is not None:
        expected = torch.arange(k, device=weight_g_idx.device) // g
        if not torch.equal(weight_g_idx.to(torch.int64), expected):
            raise ModelLoadError(f"{module}.weight_g_idx reorders input channels (activation ordering 'group'); "
                                 "catengine needs contiguous groups: quantize without actorder or with "
                                 "actorder 'static'")
    dtype = dtype or weight_scale.dtype
    scales = weight_scale.t().contiguous().to(dtype)
    if weight_zero_point is None:
        zeros = torch.full_like(scales, 8)
    else:
        if weight_zero_point.dtype != torch.int32 or weight_zero_point.shape != ((n + 7) // 8, groups):
            raise ModelLoadError(f"{module}.weight_zero_point has {weight_zero_point.dtype} "
                                 f"{tuple(weight_zero_point.shape)}, expected int32 [{(n + 7) // 8}, {groups}]")
        zeros = _unpack_rows(weight_zero_point, n).t().contiguous().to(dtype)
    return QuantizedWeight(weight_packed.t().contiguous(), scales, zeros, g)


def canonical_to_ct(w: QuantizedWeight, symmetric: bool,
                    scale_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Canonical 2-D weight -> compressed-tensors pack-quantized tensors. ``symmetric`` needs every zero = 8."""
    if w.qweight.dim() != 2:
        raise ValueError("canonical_to_ct takes one linear (2-D qweight); split stacked experts first")
    k, n = w.in_features, w.out_features
    out = {"weight_packed": w.qweight.t().contiguous(),
           "weight_scale": w.scales.t().contiguous().to(scale_dtype or w.scales.dtype),
           "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    codes = _zero_codes(w.zeros)
    if symmetric:
        if not bool((codes == 8).all()):
            raise ValueError("symmetric compressed-tensors weights need every zero point to be 8")
    else:
        out["weight_zero_point"] = _pack_rows(codes.t()).contiguous()
    return out


# ----------------------------------------------------------------------------- skip lists
def matches_skip(module: str, patterns: Iterable[str], method: str) -> bool:
    """Whether ``module`` is named by a skip list the way other engines read it: AutoAWQ's
    ``modules_to_not_convert`` by substring; compressed-tensors' ``ignore`` by exact name or ``re:`` regex
    (``re.match``)."""
    for p in patterns:
        if p.startswith("re:"):
            if re.match(p[3:], module):
                return True
        elif p == module or (method == "awq" and p in module):
            return True
    return False
