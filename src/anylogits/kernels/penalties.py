"""The repetition penalty in one Triton launch, on rows whose every column is a token.

:func:`repetition_penalty` writes ``logits`` into ``out`` with every token of each row's
history penalized as :class:`~anylogits.RepetitionPenalty` (and transformers) penalize
it: divided by the penalty when positive, multiplied when negative, once however often
it repeats; an id past the logits (a model whose embedding is wider than its LM head) is
skipped. One program per block of a row's logits copies the block, then penalizes the
history's ids that fall in it, read from the untouched ``logits``: no sort, no gather
over the whole history, no extra column. The interpreter tests hold it to the processor.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from anylogits.kernels._rounding import to_bfloat16_values

BLOCK = 4096
_IDS_BLOCK = 512


def repetition_penalty(
    logits: torch.Tensor,
    ids: torch.Tensor,
    penalty: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logits`` ``(B, V)`` with the ids of ``ids`` ``(B, L)`` penalized, into ``out``
    (a new tensor by default; never ``logits`` itself: the penalty reads the originals).
    ``penalty``: float32 on the device, one per row or one for every row."""
    rows, width = logits.shape
    if out is None or out.data_ptr() == logits.data_ptr():
        out = torch.empty_like(logits)
    if rows == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(width))
    _repetition_penalty_rows[(rows, triton.cdiv(width, block))](
        logits,
        out,
        ids,
        penalty,
        width,
        ids.shape[1],
        logits.stride(0),
        out.stride(0),
        ids.stride(0),
        ids.stride(1),
        0 if penalty.numel() == 1 else 1,
        BFLOAT16=logits.dtype == torch.bfloat16,
        BLOCK=block,
        IDS_BLOCK=min(_IDS_BLOCK, triton.next_power_of_2(max(ids.shape[1], 1))),
    )
    return out


@triton.jit
def _repetition_penalty_rows(
    logits_ptr: Any,
    out_ptr: Any,
    ids_ptr: Any,
    penalty_ptr: Any,
    width: Any,
    history: Any,
    logits_stride: Any,
    out_stride: Any,
    ids_stride: Any,
    ids_column_stride: Any,
    parameter_stride: Any,
    BFLOAT16: tl.constexpr,
    BLOCK: tl.constexpr,
    IDS_BLOCK: tl.constexpr,
) -> None:
    row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK
    columns = start + tl.arange(0, BLOCK)
    source = logits_ptr + row * logits_stride
    target = out_ptr + row * out_stride
    tl.store(
        target + columns, tl.load(source + columns, mask=columns < width), mask=columns < width
    )
    # The copy is stored before any penalized value of the block (another thread may
    # write the same column).
    tl.debug_barrier()
    penalty = tl.load(penalty_ptr + row * parameter_stride)
    end = tl.minimum(start + BLOCK, width)
    for first in range(0, history, IDS_BLOCK):
        positions = first + tl.arange(0, IDS_BLOCK)
        ids = tl.load(
            ids_ptr + row * ids_stride + positions * ids_column_stride,
            mask=positions < history,
            other=-1,
        )
        mine = (ids >= start) & (ids < end)
        seen = tl.load(source + ids, mask=mine, other=0.0).to(tl.float32)
        penalized = tl.where(seen < 0, seen * penalty, seen / penalty)
        if BFLOAT16:
            penalized = to_bfloat16_values(penalized)
        tl.store(target + ids, penalized, mask=mine)
