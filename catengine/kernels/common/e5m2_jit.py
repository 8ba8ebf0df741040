"""Triton side of the fp8 e5m2 KV bytes: the integer narrowing the cache store uses (no
``.to(tl.float8e5)``, which does not compile for sm_70 and rounds differently across architectures in
Triton 3.6) and the exact widening the attention kernels use. Torch twins: :mod:`.e5m2`.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fp16_to_e5m2_bits(x):
    """fp16 (or anything cast to it) -> uint8 e5m2 bits, round to nearest even, NaN -> 0x7F|sign."""
    bits = x.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.int32)
    rounded = (bits + 0x7F + ((bits >> 8) & 1)) >> 8
    nan = ((bits & 0x8000) >> 8) | 0x7F
    return tl.where((bits & 0x7FFF) > 0x7C00, nan, rounded & 0xFF).to(tl.uint8)


# e5m2 -> fp16 on one 32-bit register holding two int16 byte pairs, i.e. four e5m2 bytes b0..b3 (ldmatrix
# leaves the MMA operands that way: a register is two consecutive k of one operand row). The fp16 pair
# (b0 << 8, b2 << 8) is one byte permute and the pair (b1 << 8, b3 << 8) one mask, where the shift widening
# costs ~7 instructions per register (per-half shifts, masks and repacking). prmt d, a, b, sel: byte i of d
# is byte sel[4i+3:4i] of {b, a} (0-3 from a, 4-7 from b, here b = 0).
E5M2_EVEN_PTX = tl.constexpr("prmt.b32 $0, $1, 0, 0x2404;")
E5M2_ODD_PTX = tl.constexpr("and.b32 $0, $1, 0xFF00FF00;")


@triton.jit
def e5m2_pair(b_x, dtype, ASM: tl.constexpr):
    """int16 words holding two e5m2 bytes -> (even, odd) elements, exactly (an e5m2 byte is the top
    byte of an fp16). Kept 16-bit wide so the dot operands load from shared memory with ldmatrix.
    ASM: the inline-PTX widening (two separate one-result ops, so that Triton still moves the operand
    layout conversion above them onto the int16 tile); bit-identical to the shifts."""
    if ASM:
        b_lo = tl.inline_asm_elementwise(E5M2_EVEN_PTX, "=r,r", [b_x], dtype=tl.float16, is_pure=True,
                                         pack=2).to(dtype)
        b_hi = tl.inline_asm_elementwise(E5M2_ODD_PTX, "=r,r", [b_x], dtype=tl.float16, is_pure=True,
                                         pack=2).to(dtype)
    else:
        b_u = b_x.to(tl.uint16, bitcast=True)
        b_lo = (b_u << 8).to(tl.uint16).to(tl.float16, bitcast=True).to(dtype)
        b_hi = (b_u & 0xFF00).to(tl.uint16).to(tl.float16, bitcast=True).to(dtype)
    return b_lo, b_hi
