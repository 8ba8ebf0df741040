"""Per-architecture rows of the kernels' launch tables (the design notes,
../shared/design/ARCHITECTURE.md and SM70.md).

Every Triton module keys its launch table by one of three rows: 70 (Volta/Turing: no bf16, no
cp.async), 80 (Ampere/Ada) and 90 (Hopper and newer). These helpers map a compute capability or a
device to that row, so that all modules agree on the boundaries.
"""
from __future__ import annotations

import os

import torch

INTERPRETER_SMS = 4     # a small chip, so that CPU tests still split K
# Triton's interpreter runs this process's kernels (read once: set before Triton is imported). It cannot
# run inline PTX and stores bf16 as raw bits, so kernels take other paths there.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def arch_from_cc(cc: int) -> int:
    """Row of the per-architecture launch tables: 70 (Volta/Turing: no bf16, no cp.async),
    80 (Ampere/Ada), 90 (Hopper and newer)."""
    return 70 if cc < 80 else (80 if cc < 90 else 90)


def arch_of(device) -> int:
    """Launch-table row for tensors on ``device``; the interpreter (CPU tensors) uses the sm_80 row."""
    if getattr(device, "type", str(device)) != "cuda":
        return 80
    major, minor = torch.cuda.get_device_capability(device)
    return arch_from_cc(10 * major + minor)


def arch_key(cc: int) -> str:
    """Compute capability as an int (70, 86, 90, ...) -> table key."""
    return "sm70" if cc < 80 else "sm80" if cc < 90 else "sm90"


def device_key(device) -> tuple[str, int]:
    """(table key, multiprocessor count) of a CUDA device; the interpreter (CPU tensors) runs the
    sm_90 table as if on a 4-SM chip."""
    device = torch.device(device)
    if device.type != "cuda":
        return "sm90", INTERPRETER_SMS
    props = torch.cuda.get_device_properties(device)
    return arch_key(props.major * 10 + props.minor), props.multi_processor_count


__all__ = ["arch_from_cc", "arch_of", "arch_key", "device_key", "INTERPRETER_SMS", "INTERPRET"]
