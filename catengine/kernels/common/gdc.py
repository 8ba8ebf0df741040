"""Grid dependency control for Gluon kernels: ``tl.extra.cuda``'s gdc_wait / gdc_launch_dependents, which take
Triton's semantic, as Gluon functions (the same PTX).

A kernel launched with ``launch_pdl=True`` (a programmatic dependent launch, sm_90) may start while the kernel
before it still runs: it may read only what no kernel writes (weights, scales, zeros) before ``gdc_wait`` (that
kernel complete, its stores visible), and writes nothing before it. ``gdc_launch_dependents`` lets the next
PDL-launched kernel start once every program has called it. Both are no-ops in a kernel launched without PDL.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def gdc_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def gdc_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)
