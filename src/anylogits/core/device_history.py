"""Token histories an engine keeps on the device, read where they are.

vLLM's V2 model runner keeps every request's committed tokens in a ``(slots, max_len)``
device buffer and this step's draft tokens in the per-row input ids; the exact length
of each row's sequence is ``pos + 1``, on the device too. Reading them back to the host
every step would stall the stream. :class:`SlotHistory` gathers the right-aligned
``(B, W)`` history of any rows with fixed-shape tensor operations instead: only the
width ``W``, an upper bound the engine knows on the host, decides a shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from anylogits.core.transfer import host_tensor_to


class DeviceHistory(Protocol):
    """Token histories of a step's rows, on the device."""

    def rows(self, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(token_ids, lengths)`` of these rows: ``(B, W)`` right-aligned history
        (drafts included) and ``(B,)`` real tokens per row, on the logits' device."""
        ...


class SlotHistory:
    """Histories gathered from an engine's per-slot committed tokens and per-row inputs.

    Args:
        committed: ``(slots, max_len)`` committed token ids per slot.
        row_slots: ``(rows,)`` the slot of each row of the step.
        row_offsets: ``(rows,)`` each row's draft position among its request's rows
            (0: the row after the committed tokens).
        row_inputs: ``(rows,)`` the token fed at each row's position (the last committed
            token for offset 0, the row's last draft token otherwise).
        row_positions: ``(rows,)`` the position of each row's input token: the row's
            sequence holds ``row_positions + 1`` tokens.
        width: an upper bound of every row's length, known on the host.

    Example:
        >>> import torch
        >>> committed = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
        >>> history = SlotHistory(
        ...     committed,
        ...     row_slots=torch.tensor([1, 0, 0]),
        ...     row_offsets=torch.tensor([0, 0, 1]),
        ...     row_inputs=torch.tensor([9, 7, 3]),
        ...     row_positions=torch.tensor([1, 2, 3]),
        ...     width=4,
        ... )
        >>> ids, lengths = history.rows([0, 2])
        >>> ids.tolist(), lengths.tolist()
        ([[0, 0, 8, 9], [5, 6, 7, 3]], [2, 4])
    """

    def __init__(
        self,
        committed: torch.Tensor,
        *,
        row_slots: torch.Tensor,
        row_offsets: torch.Tensor,
        row_inputs: torch.Tensor,
        row_positions: torch.Tensor,
        width: int,
    ) -> None:
        self.committed = committed
        self.row_slots = row_slots
        self.row_offsets = row_offsets
        self.row_inputs = row_inputs
        self.row_positions = row_positions
        self.width = max(int(width), 1)

    def rows(self, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.committed.device
        index = host_tensor_to(list(rows), device, torch.int64)
        positions = self.row_positions.index_select(0, index).to(torch.int64)
        lengths = positions + 1
        committed_lengths = lengths - self.row_offsets.index_select(0, index).to(torch.int64)
        # Right-aligned: column j of a row holds its token at position lengths - W + j.
        columns = torch.arange(self.width, device=device)
        token_positions = lengths[:, None] - self.width + columns
        slots = self.row_slots.index_select(0, index).to(torch.int64)
        max_position = self.committed.shape[1] - 1
        from_committed = self.committed[
            slots[:, None], token_positions.clamp(min=0, max=max_position)
        ].to(torch.int64)
        # Draft tokens sit in the inputs of the rows just before (same request, lower
        # offset): the token at position i of row r was the input of row r - (pos_r - i).
        input_rows = index[:, None] - (positions[:, None] - token_positions)
        from_inputs = self.row_inputs.to(torch.int64)[
            input_rows.clamp(min=0, max=self.row_inputs.shape[0] - 1)
        ]
        is_draft = token_positions >= committed_lengths[:, None]
        ids = torch.where(is_draft, from_inputs, from_committed)
        return torch.where(token_positions >= 0, ids, 0), lengths


def committed_since(
    committed: torch.Tensor,
    committed_lengths: torch.Tensor,
    slots: Sequence[int],
    starts: Sequence[int],
    width: int,
) -> list[list[int]]:
    """Each slot's committed tokens from its start on, for requests whose processors keep
    states on the host: one read of ``(lengths, tokens)`` for all of them.

    Args:
        committed: ``(slots, max_len)`` committed token ids per slot, on the device.
        committed_lengths: ``(slots,)`` committed tokens per slot, on the device.
        slots: the slots to read.
        starts: per slot, the first position not read yet.
        width: an upper bound of every slot's length, known on the host (so that the
            read needs no length first).

    Example:
        >>> committed_since(
        ...     torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]), torch.tensor([3, 2]), [0, 1], [1, 2], 4
        ... )
        [[6, 7], []]
    """
    device = committed.device
    index = host_tensor_to(list(slots), device, torch.int64)
    ends = committed_lengths.index_select(0, index).to(torch.int64)
    window = max(max(width - start for start in starts), 0)
    columns = host_tensor_to(list(starts), device, torch.int64)[:, None] + torch.arange(
        window, device=device
    )
    tokens = committed[index[:, None], columns.clamp(max=committed.shape[1] - 1)]
    read = torch.cat([ends[:, None], tokens.to(torch.int64)], dim=1).tolist()
    return [row[1 : 1 + max(row[0] - start, 0)] for row, start in zip(read, starts, strict=True)]
