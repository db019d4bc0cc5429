"""Logit biases and banned ids, one Triton launch for a run of them.

:func:`bias_and_bans` writes ``logits`` into ``out`` with, in each row, a value added at
the ids of its bias list (:class:`~anylogits.LogitBias`, and vLLM's rows of several
stacked) and ``-inf`` at the ids of its ban list (:class:`~anylogits.SuppressTokens`,
stacked or not). Each list is read in CSR form: the ids (and values) of every row one
after another, with ``offsets[row]`` and ``offsets[row + 1]`` bounding a row's (one list
for every row: two offsets and a row stride of 0). One program per block of a row
copies the block, then applies the entries that fall in it: no full-row pass per list,
no index tensors built per call. A kind absent is an empty list the caller passes:
two offsets 0 and 0, one id (and value) slot never read. A ban wins over a bias on the
same id in either order (``-inf`` plus a finite bias is ``-inf``); a bias is added in
the logits' dtype, as the processors add it. ``out`` may be ``logits`` itself (each id
is read once, before it is written). The interpreter tests hold it to the processors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from anylogits.kernels._rounding import copied_block, rounded

BLOCK = 4096
_ENTRIES_BLOCK = 256


class RowLists:
    """A list of ids per row (and a value per id) in CSR form on the device: ``ids``
    int64, ``values`` in the logits' dtype (or ``None`` for bans), ``offsets`` int64
    ``(B + 1,)``, or ``(2,)`` for one list every row shares."""

    def __init__(
        self, ids: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor | None = None
    ) -> None:
        self.ids, self.offsets, self.values = ids, offsets, values

    @property
    def row_stride(self) -> int:
        return 0 if self.offsets.numel() == 2 else 1


def bias_and_bans(
    logits: torch.Tensor,
    *,
    bias: RowLists,
    bans: RowLists,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logits`` ``(B, V)`` (float32, float16 or bfloat16) with each row's ``bias``
    added and its ``bans`` set to ``-inf`` (an empty list: none; a bias has values),
    into ``out`` (a new tensor by default; ``logits`` itself works). Every id must lie in
    the row (the processors check it before)."""
    rows, width = logits.shape
    if out is None:
        out = torch.empty_like(logits)
    if rows == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(width))
    _bias_and_bans_rows[(rows, triton.cdiv(width, block))](
        logits,
        out,
        width,
        logits.stride(0),
        out.stride(0),
        bias.ids,
        bias.values,
        bias.offsets,
        bias.row_stride,
        bans.ids,
        bans.offsets,
        bans.row_stride,
        BFLOAT16=logits.dtype == torch.bfloat16,
        BLOCK=block,
        ENTRIES=_ENTRIES_BLOCK,
        enable_fp_fusion=False,
    )
    return out


@triton.jit
def _in_block(ids_ptr, position, last, start, end, ENTRIES: tl.constexpr):
    """A block of a row's list: its positions, its ids, and which of them fall in the
    columns ``[start, end)`` this program writes."""
    positions = position + tl.arange(0, ENTRIES)
    ids = tl.load(ids_ptr + positions, mask=positions < last, other=-1)
    return positions, ids, (positions < last) & (ids >= start) & (ids < end)


@triton.jit
def _bias_and_bans_rows(
    logits_ptr,
    out_ptr,
    width,
    logits_stride,
    out_stride,
    bias_ids_ptr,
    bias_values_ptr,
    bias_offsets_ptr,
    bias_row_stride,
    ban_ids_ptr,
    ban_offsets_ptr,
    ban_row_stride,
    BFLOAT16: tl.constexpr,
    BLOCK: tl.constexpr,
    ENTRIES: tl.constexpr,
):
    row = tl.program_id(0)
    source, target, start, end = copied_block(
        logits_ptr, out_ptr, row, logits_stride, out_stride, width, BLOCK
    )
    first = tl.load(bias_offsets_ptr + row * bias_row_stride)
    last = tl.load(bias_offsets_ptr + row * bias_row_stride + 1)
    for position in range(first, last, ENTRIES):
        positions, ids, mine = _in_block(bias_ids_ptr, position, last, start, end, ENTRIES)
        raw = tl.load(source + ids, mask=mine, other=0.0)
        value = tl.load(bias_values_ptr + positions, mask=mine, other=0.0).to(tl.float32)
        tl.store(target + ids, rounded(raw.to(tl.float32) + value, raw.dtype, BFLOAT16), mask=mine)
    # Bans last: a biased id that is also banned ends at -inf.
    tl.debug_barrier()
    first = tl.load(ban_offsets_ptr + row * ban_row_stride)
    last = tl.load(ban_offsets_ptr + row * ban_row_stride + 1)
    for position in range(first, last, ENTRIES):
        _, ids, mine = _in_block(ban_ids_ptr, position, last, start, end, ENTRIES)
        tl.store(target + ids, tl.full((ENTRIES,), float("-inf"), tl.float32), mask=mine)
