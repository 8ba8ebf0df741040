"""The one tiny kernel ``catengine doctor`` builds ahead of time for sm_70 (through
:mod:`catengine.kernels.common.aot`, in a subprocess): it compiles only if Triton's ptxas still targets Volta
(CUDA 13's ptxas does not)."""
from __future__ import annotations

import triton
import triton.language as tl

from ..kernels.common.aot import AotConfig


@triton.jit
def probe_kernel(x, y, n, BLOCK: tl.constexpr):
    i_b = tl.program_id(0)
    o_x = i_b * BLOCK + tl.arange(0, BLOCK)
    m_x = o_x < n
    # [BLOCK]
    b_x = tl.load(x + o_x, mask=m_x, other=0.0)
    tl.store(y + o_x, b_x * 2, mask=m_x)


def aot_configs(cc: int) -> list[AotConfig]:
    return [AotConfig("probe_kernel", {"x": "*fp16", "y": "*fp16", "n": "i32", "BLOCK": "constexpr"},
                      {"BLOCK": 128}, num_warps=4, num_stages=1, name="doctor probe")]
