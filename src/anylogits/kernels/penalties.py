"""The penalties on a row's history, one Triton launch each.

:func:`repetition_penalty`, on rows whose every column is a token, writes ``logits``
into ``out`` with every token of each row's history penalized as
:class:`~anylogits.RepetitionPenalty` (and transformers) penalize it: divided by the
penalty when positive, multiplied when negative, once however often it repeats; an id
past the logits (a model whose embedding is wider than its LM head) is skipped. One
program per block of a row's logits copies the block, then penalizes the history's ids
that fall in it, read from the untouched ``logits``: no sort, no gather over the whole
history, no extra column. :func:`output_penalties` applies OpenAI's presence and
frequency penalties the same way, counting each block's generated ids. The interpreter
tests hold both to the processors.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from anylogits.kernels._rounding import copied_block, rounded, to_bfloat16_values

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
    return _launch(
        _repetition_penalty_rows,
        logits,
        ids,
        out,
        penalty,
        0 if penalty.numel() == 1 else 1,
    )


def output_penalties(
    logits: torch.Tensor,
    ids: torch.Tensor,
    generated: torch.Tensor,
    *,
    presence: torch.Tensor | None,
    frequency: torch.Tensor | None,
    presence_first: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logits`` ``(B, V)`` with OpenAI's presence and frequency penalties (vLLM's
    arithmetic: ``x - presence`` for a token generated at least once, ``x - frequency *
    count``) on the tokens each row generated: the last ``generated[row]`` columns of its
    ``ids`` ``(B, L)``; ids past the logits are skipped. Into ``out`` (a new tensor by
    default; never ``logits`` itself). Penalties: float32 on the device, one per row or
    one for every row; ``None``: not applied. ``presence_first``: the order of the two
    processors in the pipeline (each result is rounded to the logits' dtype, as each
    processor rounds it)."""
    rows, width = logits.shape
    counts = torch.empty(rows, width, dtype=torch.int32, device=logits.device)
    zero = torch.zeros(1, dtype=torch.float32, device=logits.device)
    presence_values = zero if presence is None else presence
    frequency_values = zero if frequency is None else frequency
    return _launch(
        _output_penalty_rows,
        logits,
        ids,
        out,
        counts,
        generated,
        presence_values,
        frequency_values,
        0 if presence_values.numel() == 1 else 1,
        0 if frequency_values.numel() == 1 else 1,
        PRESENCE=presence is not None,
        FREQUENCY=frequency is not None,
        PRESENCE_FIRST=presence_first,
    )


def _launch(
    kernel: Any,
    logits: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor | None,
    *arguments: Any,
    **constexprs: Any,
) -> torch.Tensor:
    """``kernel`` over every block of every row, with what each penalty kernel takes first
    (the logits, the output, the history and their sizes and strides) and then
    ``arguments``; into ``out``, or a new tensor when it is ``None`` or ``logits``."""
    rows, width = logits.shape
    if out is None or out.data_ptr() == logits.data_ptr():
        out = torch.empty_like(logits)
    if rows == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(width))
    kernel[(rows, triton.cdiv(width, block))](
        logits,
        out,
        ids,
        width,
        ids.shape[1],
        logits.stride(0),
        out.stride(0),
        ids.stride(0),
        ids.stride(1),
        *arguments,
        BFLOAT16=logits.dtype == torch.bfloat16,
        BLOCK=block,
        IDS_BLOCK=min(_IDS_BLOCK, triton.next_power_of_2(max(ids.shape[1], 1))),
        enable_fp_fusion=False,  # no fused multiply-add: torch rounds a product first
        **constexprs,
    )
    return out


@triton.jit
def _history_ids(ids_ptr, row, ids_stride, ids_column_stride, first, history, IDS_BLOCK):
    """One block of a row's history: its positions, and its ids (-1 past the history)."""
    positions = first + tl.arange(0, IDS_BLOCK)
    ids = tl.load(
        ids_ptr + row * ids_stride + positions * ids_column_stride,
        mask=positions < history,
        other=-1,
    )
    return positions, ids


@triton.jit
def _repetition_penalty_rows(
    logits_ptr,
    out_ptr,
    ids_ptr,
    width,
    history,
    logits_stride,
    out_stride,
    ids_stride,
    ids_column_stride,
    penalty_ptr,
    parameter_stride,
    BFLOAT16: tl.constexpr,
    BLOCK: tl.constexpr,
    IDS_BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    source, target, start, end = copied_block(
        logits_ptr, out_ptr, row, logits_stride, out_stride, width, BLOCK
    )
    penalty = tl.load(penalty_ptr + row * parameter_stride)
    for first in range(0, history, IDS_BLOCK):
        _, ids = _history_ids(
            ids_ptr, row, ids_stride, ids_column_stride, first, history, IDS_BLOCK
        )
        mine = (ids >= start) & (ids < end)
        seen = tl.load(source + ids, mask=mine, other=0.0).to(tl.float32)
        penalized = tl.where(seen < 0, seen * penalty, seen / penalty)
        if BFLOAT16:
            penalized = to_bfloat16_values(penalized)
        tl.store(target + ids, penalized, mask=mine)


@triton.jit
def _output_penalty_rows(
    logits_ptr,
    out_ptr,
    ids_ptr,
    width,
    history,
    logits_stride,
    out_stride,
    ids_stride,
    ids_column_stride,
    counts_ptr,
    generated_ptr,
    presence_ptr,
    frequency_ptr,
    presence_stride,
    frequency_stride,
    PRESENCE: tl.constexpr,
    FREQUENCY: tl.constexpr,
    PRESENCE_FIRST: tl.constexpr,
    BFLOAT16: tl.constexpr,
    BLOCK: tl.constexpr,
    IDS_BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK
    columns = start + tl.arange(0, BLOCK)
    inside = columns < width
    counts = counts_ptr + row * width
    # This program alone counts the columns of its block: zero them, count the generated
    # ids that fall in it, read the counts back (a barrier between each).
    tl.store(counts + columns, tl.zeros((BLOCK,), dtype=tl.int32), mask=inside)
    tl.debug_barrier()
    end = tl.minimum(start + BLOCK, width)
    first_generated = history - tl.load(generated_ptr + row)
    for first in range(0, history, IDS_BLOCK):
        positions, ids = _history_ids(
            ids_ptr, row, ids_stride, ids_column_stride, first, history, IDS_BLOCK
        )
        mine = (positions >= first_generated) & (ids >= start) & (ids < end)
        tl.atomic_add(counts + ids, tl.full((IDS_BLOCK,), 1, tl.int32), mask=mine)
    tl.debug_barrier()
    count = tl.load(counts + columns, mask=inside, other=0)
    raw = tl.load(logits_ptr + row * logits_stride + columns, mask=inside, other=0.0)
    x = raw.to(tl.float32)
    presence = tl.load(presence_ptr + row * presence_stride)
    frequency = tl.load(frequency_ptr + row * frequency_stride)
    if PRESENCE and PRESENCE_FIRST:
        x = tl.where(count > 0, rounded(x - presence, raw.dtype, BFLOAT16), x)
    if FREQUENCY:
        penalized = rounded(x - frequency * count.to(tl.float32), raw.dtype, BFLOAT16)
        x = tl.where(count > 0, penalized, x)
    if PRESENCE and not PRESENCE_FIRST:
        x = tl.where(count > 0, rounded(x - presence, raw.dtype, BFLOAT16), x)
    tl.store(out_ptr + row * out_stride + columns, x, mask=inside)
