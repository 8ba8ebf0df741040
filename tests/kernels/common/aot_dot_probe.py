"""A plain Triton ``tl.dot`` kernel for the AOT tests: Triton >= 3.3 lowers it to FMA on sm_70, so its build must
report ``gluon`` and ``mma884`` False (the flag is not a constant)."""
import triton
import triton.language as tl

from catengine.kernels.common.aot import AotConfig


@triton.jit
def dot_probe_kernel(a_ptr, b_ptr, c_ptr, B: tl.constexpr):
    o = tl.arange(0, B)
    # [B, B]
    b_a = tl.load(a_ptr + o[:, None] * B + o[None, :])
    # [B, B]
    b_b = tl.load(b_ptr + o[:, None] * B + o[None, :])
    tl.store(c_ptr + o[:, None] * B + o[None, :], tl.dot(b_a, b_b).to(tl.float16))


def aot_configs(cc: int) -> list[AotConfig]:
    return [AotConfig("dot_probe_kernel", {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "B": "constexpr"},
                      {"B": 32}, 4, 1, "tl.dot probe")]
