"""What the kernels share: rounding float32 results to the logits' dtype as torch rounds
them, and the copy of a program's block of a row that a scatter then changes."""

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


@triton.jit
def copied_block(logits_ptr, out_ptr, row, logits_stride, out_stride, width, BLOCK: tl.constexpr):
    """This program's block of ``row`` copied from the logits into the output, stored
    before the caller writes any changed value of it (another thread may write the same
    column): ``(source row, target row, first column, end column)``."""
    start = tl.program_id(1) * BLOCK
    columns = start + tl.arange(0, BLOCK)
    source = logits_ptr + row * logits_stride
    target = out_ptr + row * out_stride
    tl.store(
        target + columns, tl.load(source + columns, mask=columns < width), mask=columns < width
    )
    tl.debug_barrier()
    return source, target, start, tl.minimum(start + BLOCK, width)
