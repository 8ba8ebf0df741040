"""The MoE block's last step in one launch (twin: ``moe.naive.shared_expert_add``): the routed sum plus the shared
expert times the sigmoid of its gate logit, fp32 out. In torch this was four kernels (the logit's and the shared
expert's fp32 copies, the sigmoid, the addcmul), each a launch on every MoE layer of a decode step."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import KernelContractError
from ..common.aot import AotConfig

BLOCK = 1024    # columns per program


@triton.jit
def shared_add_kernel(r_ptr, g_ptr, s_ptr, out_ptr, H, stride_g, stride_s, BLOCK: tl.constexpr):
    i_t, i_b = tl.program_id(0), tl.program_id(1)
    o_n = i_b * BLOCK + tl.arange(0, BLOCK)
    m_n = o_n < H
    b_g = tl.sigmoid(tl.load(g_ptr + i_t * stride_g).to(tl.float32))
    # [BLOCK]
    b_r = tl.load(r_ptr + i_t * H + o_n, mask=m_n, other=0.0)
    b_s = tl.load(s_ptr + i_t * stride_s + o_n, mask=m_n, other=0.0).to(tl.float32)
    tl.store(out_ptr + i_t * H + o_n, b_r + b_g * b_s, mask=m_n)


def shared_expert_add(routed, gate_logit, shared):
    """Triton twin of :func:`catengine.kernels.moe.naive.shared_expert_add`."""
    t, h = routed.shape
    if (routed.dtype != torch.float32 or not routed.is_contiguous() or gate_logit.shape != (t, 1)
            or shared.shape != (t, h) or shared.stride(-1) != 1):
        raise KernelContractError(f"shared_expert_add takes routed [T, H] fp32 contiguous, gate_logit [T, 1] and "
                                  f"shared [T, H] with contiguous rows; got {tuple(routed.shape)} {routed.dtype}, "
                                  f"{tuple(gate_logit.shape)}, {tuple(shared.shape)} stride {shared.stride()}")
    out = torch.empty_like(routed)
    if t:
        shared_add_kernel[(t, triton.cdiv(h, BLOCK))](routed, gate_logit, shared, out, h, gate_logit.stride(0),
                                                      shared.stride(0), BLOCK=BLOCK, num_warps=4)
    return out


def aot_configs(cc: int) -> list[AotConfig]:
    """fp16 (and bf16 from sm_80) logits and shared-expert rows."""
    out = []
    for dt in ("fp16",) + (("bf16",) if cc >= 80 else ()):
        sig = {"r_ptr": "*fp32", "g_ptr": f"*{dt}", "s_ptr": f"*{dt}", "out_ptr": "*fp32", "H": "i32",
               "stride_g": "i32", "stride_s": "i32", "BLOCK": "constexpr"}
        out.append(AotConfig("shared_add_kernel", sig, dict(BLOCK=BLOCK), 4, 1, f"shared_add {dt}"))
    return out
