"""Per-architecture rows of the kernels' launch tables (the design notes,
../shared/design/ARCHITECTURE.md and SM70.md).

Every Triton module keys its launch table by one of three rows: 70 (Volta/Turing: no bf16, no
cp.async), 80 (Ampere/Ada) and 90 (Hopper and newer). These helpers map a compute capability or a
device to that row, so that all modules agree on the boundaries. They are also the only place that
asks torch for a device's capability: every choice made by architecture (table rows, PDL, the e5m2
widening, the GDN split/scan form, bf16 support) goes through :func:`arch_of` or :func:`device_key`,
so that ``CATENGINE_ARCH`` (below) moves all of them at once.
"""
from __future__ import annotations

import os

import torch

from ...errors import ConfigError

ARCHES = (70, 80, 90)
INTERPRETER_SMS = 4     # a small chip, so that CPU tests still split K
# Triton's interpreter runs this process's kernels (read once: set before Triton is imported). It cannot
# run inline PTX and stores bf16 as raw bits, so kernels take other paths there.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# CATENGINE_ARCH=70|80|90 (read once, like INTERPRET): every device gets that launch-table row and every
# kernel choice a GPU of that row would get, so the sm_70 path runs end to end on an H200 (mma.m8n8k4
# executes there, emulated). Parsed where it is used (forced_arch), so that a bad value is a ConfigError
# from the engine or `catengine doctor`, not an import failure.
ARCH_OVERRIDE = os.environ.get("CATENGINE_ARCH", "")
# Under the switch a CUDA device also takes the multiprocessor count of that row's reference chip (V100 80,
# A100 108, H100/H200 132) instead of its own: split-K and decode-split counts depend on it, and the point of
# the switch is to run the grids a V100 would launch. Fewer programs than this chip's SMs are still correct
# (only slower), and nothing here needs all programs resident at once (the split reductions use counters).
REFERENCE_SMS = {70: 80, 80: 108, 90: 132}
# Set only by bench/v100_projection.py --dry-cpu, which records launches on CPU tensors and runs none: the sm_70
# launchers' "CUDA only" checks (Gluon has no interpreter) then let CPU tensors through, and a CPU device counts
# the row's REFERENCE_SMS, so that the CPU dry run records the HMMA.884 choices and grids a V100 gets. Nothing
# launched while it is set may run.
RECORD_ONLY_CPU = False


def forced_arch() -> int | None:
    """The row ``CATENGINE_ARCH`` forces (70, 80 or 90), or None when it is unset."""
    value = ARCH_OVERRIDE.strip()
    if not value:
        return None
    if value not in {str(a) for a in ARCHES}:
        raise ConfigError(f"CATENGINE_ARCH={ARCH_OVERRIDE!r} is not a launch-table row; use one of "
                          f"{', '.join(map(str, ARCHES))} (or leave it unset for the GPU's own row)")
    return int(value)


def arch_from_cc(cc: int) -> int:
    """Row of the per-architecture launch tables: 70 (Volta/Turing: no bf16, no cp.async),
    80 (Ampere/Ada), 90 (Hopper and newer). A pure mapping (ahead-of-time builds pass the target's cc):
    the switch acts on devices, in :func:`arch_of` and :func:`device_key`."""
    return 70 if cc < 80 else (80 if cc < 90 else 90)


def device_cc(device) -> int:
    """The real compute capability of a CUDA device as an int (70, 86, 90, ...), whatever the switch says
    (for reports; kernel choices use :func:`arch_of`)."""
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def arch_of(device) -> int:
    """Launch-table row for tensors on ``device`` (``CATENGINE_ARCH`` when set); the interpreter (CPU
    tensors) uses the sm_80 row."""
    forced = forced_arch()
    if forced is not None:
        return forced
    if getattr(device, "type", str(device)) != "cuda":
        return 90 if RECORD_ONLY_CPU else 80   # the dry run's unforced pass stands for the H200
    return arch_from_cc(device_cc(device))


def arch_key(cc: int) -> str:
    """Compute capability as an int (70, 86, 90, ...) -> table key."""
    return "sm70" if cc < 80 else "sm80" if cc < 90 else "sm90"


def device_key(device) -> tuple[str, int]:
    """(table key, multiprocessor count) of a CUDA device; the interpreter (CPU tensors) runs the
    sm_90 table as if on a 4-SM chip. Under ``CATENGINE_ARCH`` the key is that row's and a CUDA device
    counts the row's REFERENCE_SMS (the interpreter keeps its 4)."""
    forced = forced_arch()
    device = torch.device(device)
    if device.type != "cuda":
        if RECORD_ONLY_CPU:   # the projection's dry run records the grids a GPU of the row would launch
            return arch_key(forced or 90), REFERENCE_SMS[forced or 90]
        return arch_key(forced or 90), INTERPRETER_SMS
    if forced is not None:
        return arch_key(forced), REFERENCE_SMS[forced]
    props = torch.cuda.get_device_properties(device)
    return arch_key(props.major * 10 + props.minor), props.multi_processor_count


def cuda_device(device) -> bool:
    """Whether ``device`` is a CUDA device, where the Gluon (HMMA.884) kernels run; any device while
    ``RECORD_ONLY_CPU`` (the projection's CPU dry run records those launches without running them)."""
    return RECORD_ONLY_CPU or torch.device(device).type == "cuda"


def pdl_supported(device) -> bool:
    """Whether kernels on ``device`` may use grid dependency control (programmatic dependent launch): the sm_90
    row on CUDA, not the interpreter (inline PTX)."""
    return not INTERPRET and torch.device(device).type == "cuda" and arch_of(device) >= 90


def bf16_supported(device) -> bool:
    """Whether the row of ``device`` has bf16 (sm_70 has none: a V100, or any GPU under CATENGINE_ARCH=70)."""
    return arch_of(device) >= 80


__all__ = ["ARCHES", "ARCH_OVERRIDE", "REFERENCE_SMS", "arch_from_cc", "arch_of", "arch_key", "bf16_supported",
           "cuda_device", "device_cc", "device_key", "forced_arch", "INTERPRETER_SMS", "INTERPRET", "pdl_supported"]
