"""Rounding a kernel's float32 results to the logits' dtype as torch rounds them."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def to_bfloat16_values(x):
    """float32 rounded to the nearest bfloat16 (ties to even), still float32: a store then
    converts exactly (Triton's interpreter truncates to bfloat16 instead of rounding)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 32767 + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def rounded(x, dtype: tl.constexpr, BFLOAT16: tl.constexpr):
    """``x`` rounded to the logits' ``dtype`` (still float32), as torch rounds a result
    (float32 logits: unchanged)."""
    if BFLOAT16:
        return to_bfloat16_values(x)
    return x.to(dtype).to(tl.float32)
