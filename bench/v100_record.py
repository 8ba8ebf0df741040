"""Launch recording for bench/v100_projection.py: which Triton / Gluon kernels a launcher starts, with which
constexprs, launch options, grid and tensors, so that the same configurations can be compiled ahead of time
for another architecture (catengine/kernels/common/aot.py) without a copy of each launcher's table logic.

``recording(run=False)`` replaces ``JITFunction.run`` (the target of ``kernel[grid](...)`` for ``@triton.jit``
and ``@gluon.jit`` alike, Triton 3.5-3.9): each launch is recorded and, with ``run=False``, not executed, so the
sm_70 choices of a launcher are read on an H200 without running the emulated mma.m8n8k4 (the launchers read
nothing back from the device to size their grids).
"""
from __future__ import annotations

import contextlib
import inspect
import numbers
from dataclasses import dataclass

import torch

from catengine.kernels.common.aot import AotConfig

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
           torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
           torch.bool: "i1", torch.float8_e5m2: "fp8e5", torch.float8_e4m3fn: "fp8e4nv"}
# launch options Triton takes as keyword arguments beside the kernel's own parameters
DEFAULT_WARPS, DEFAULT_STAGES = 4, 3


@dataclass(frozen=True)
class TensorArg:
    dtype: torch.dtype
    nbytes: int
    ptr: int


@dataclass(frozen=True)
class Launch:
    module: str
    kernel: str
    args: dict              # parameter name -> value (TensorArg for tensors)
    grid: tuple
    num_warps: int
    num_stages: int
    constexpr_names: tuple
    nospec: tuple           # parameters marked do_not_specialize

    @property
    def programs(self) -> int:
        n = 1
        for g in self.grid:
            n *= int(g)
        return n

    def tensor_bytes(self) -> int:
        """Bytes of the distinct tensors handed to the launch (aliases counted once)."""
        seen = {}
        for v in self.args.values():
            if isinstance(v, TensorArg):
                seen[v.ptr] = max(seen.get(v.ptr, 0), v.nbytes)
        return sum(seen.values())

    def aot_config(self) -> AotConfig:
        """The launch as an AotConfig: tensors as pointers of their dtype, ints as i32 (i64 beyond), integer
        arguments that are multiples of 16 hinted as such (Triton specialises on that at run time)."""
        sig, consts, div16 = {}, {}, []
        for name, v in self.args.items():
            if name in self.constexpr_names or v is None:
                sig[name] = "constexpr"
                consts[name] = v
            elif isinstance(v, TensorArg):
                sig[name] = "*" + _DTYPES[v.dtype]
            elif isinstance(v, bool):
                sig[name] = "i1"
            elif isinstance(v, numbers.Integral):
                sig[name] = "i32" if -2**31 <= v < 2**31 else "i64"
                if v % 16 == 0 and name not in self.nospec:
                    div16.append(name)
            elif isinstance(v, numbers.Real):
                sig[name] = "fp32"
            else:
                raise TypeError(f"{self.kernel}: argument {name} of type {type(v).__name__} has no signature type")
        return AotConfig(self.kernel, sig, consts, self.num_warps, self.num_stages, self.kernel, tuple(div16))


def _value(v):
    if isinstance(v, torch.Tensor):
        return TensorArg(v.dtype, v.numel() * v.element_size(), v.data_ptr())
    if hasattr(v, "value") and type(v).__name__ == "constexpr":
        return v.value
    return v


def _launch(fn, args, grid, kwargs) -> Launch:
    pyfn = fn.fn
    params = inspect.signature(pyfn).parameters
    own = {k: v for k, v in kwargs.items() if k in params}
    bound = inspect.signature(pyfn).bind(*args, **own)
    bound.apply_defaults()
    values = {k: _value(v) for k, v in bound.arguments.items()}
    if callable(grid):
        grid = grid({**bound.arguments, **kwargs})
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    constexprs = tuple(p.name for p in fn.params if p.is_constexpr)
    nospec = tuple(p.name for p in fn.params if getattr(p, "do_not_specialize", False))
    return Launch(pyfn.__module__, pyfn.__name__, values, grid, int(kwargs.get("num_warps", DEFAULT_WARPS)),
                  int(kwargs.get("num_stages", DEFAULT_STAGES)), constexprs, nospec)


@contextlib.contextmanager
def recording(run: bool):
    """Yields the list that every kernel launch inside the block is appended to; run=False skips the launches."""
    from triton.runtime.jit import JITFunction
    original = JITFunction.run
    launches: list[Launch] = []

    def run_(self, *args, grid, warmup, **kwargs):
        if not warmup:
            launches.append(_launch(self, args, grid, kwargs))
            if not run:
                return None
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction.run = run_
    try:
        yield launches
    finally:
        JITFunction.run = original


@contextlib.contextmanager
def arch_row(arch: int | None):
    """Every launcher takes the launch-table row (and the reference SM count) of ``arch`` inside the block, as
    under CATENGINE_ARCH (which is read once at import; arch.forced_arch reads the module global)."""
    from catengine.kernels.common import arch as arch_mod
    saved = arch_mod.ARCH_OVERRIDE
    arch_mod.ARCH_OVERRIDE = "" if arch is None else str(arch)
    _clear_row_caches()
    try:
        yield
    finally:
        arch_mod.ARCH_OVERRIDE = saved
        _clear_row_caches()


# launchers that cache their row per device (the switch is read once in a normal run, so that is right there):
# a row change at run time must drop what they cached
ROW_CACHES = (("catengine.kernels.gdn.table", "device_table"), ("catengine.kernels.gdn.conv1d", "device_table"))


def _clear_row_caches():
    import importlib
    for name, attr in ROW_CACHES:
        try:
            fn = getattr(importlib.import_module(name), attr, None)
        except ImportError:
            continue
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()
