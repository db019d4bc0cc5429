"""Token histories an engine keeps on the device, read where they are.

vLLM's V2 model runner keeps every request's committed tokens in a ``(slots, max_len)``
device buffer and this step's draft tokens in the per-row input ids; the exact length
of each row's sequence is ``pos + 1``, on the device too. Reading them back to the host
every step would stall the stream. :class:`SlotHistory` gathers the right-aligned
``(B, W)`` history of any rows with fixed-shape tensor operations instead: only the
width ``W``, an upper bound the engine knows on the host, decides a shape.

Under speculative decoding vLLM marks the draft rows of a request still inside its prefill
with placeholder inputs (``-1``, ``gather_draft_sampled``); those rows are rejected, and a
history never holds a placeholder: such a row sees its request's committed tokens alone.

Processors that keep states on the host need each step's new committed tokens there:
:class:`CommittedReads` reads them in per-request windows bounded on the host, copied
without blocking before the engine queues the forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from anylogits.core.transfer import HostCopy, host_tensor_to


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
            token for offset 0, the row's last draft token otherwise); a negative id at
            a positive offset is a placeholder: the row sees no draft token.
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

        A placeholder draft (``-1``) leaves the row its committed tokens:

        >>> history.row_inputs = torch.tensor([9, 7, -1])
        >>> [t.tolist() for t in history.rows([2])]
        [[[0, 5, 6, 7]], [3]]
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
        offsets = self.row_offsets.index_select(0, index).to(torch.int64)
        # vLLM marks every draft of a request in prefill, so a row's own input tells.
        placeholder = (offsets > 0) & (self.row_inputs.index_select(0, index) < 0)
        positions = self.row_positions.index_select(0, index).to(torch.int64)
        positions = torch.where(placeholder, positions - offsets, positions)
        offsets = torch.where(placeholder, 0, offsets)
        lengths = positions + 1
        committed_lengths = lengths - offsets
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


def committed_window(
    committed: torch.Tensor,
    committed_lengths: torch.Tensor,
    slots: Sequence[int],
    starts: Sequence[int],
    window: int,
) -> torch.Tensor:
    """``(len(slots), 1 + window)``: per slot, its committed length, then its tokens from
    its start on (``window`` of them, past the end where the slot holds fewer), gathered
    on the device with no read.

    Args:
        committed: ``(slots, max_len)`` committed token ids per slot, on the device.
        committed_lengths: ``(slots,)`` committed tokens per slot, on the device.
        slots: the slots to read.
        starts: per slot, the first position not read yet.
        window: how many tokens to take per slot: the largest count any slot can have
            gained, known on the host (so that the read needs no length first).

    Example:
        >>> committed_window(
        ...     torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]), torch.tensor([3, 2]), [0, 1], [1, 2], 2
        ... ).tolist()
        [[3, 6, 7], [2, 0, 0]]
    """
    device = committed.device
    index = host_tensor_to(list(slots), device, torch.int64)
    ends = committed_lengths.index_select(0, index).to(torch.int64)
    columns = host_tensor_to(list(starts), device, torch.int64)[:, None] + torch.arange(
        max(window, 0), device=device
    )
    tokens = committed[index[:, None], columns.clamp(max=committed.shape[1] - 1)]
    return torch.cat([ends[:, None], tokens.to(torch.int64)], dim=1)


def _new_tokens(row: list[int], start: int) -> list[int]:
    """The tokens of a :func:`committed_window` row read from ``start``."""
    return row[1 : 1 + max(row[0] - start, 0)]


class CommittedReads:
    """The new committed tokens of requests whose processors keep states on the host.

    An engine that keeps committed tokens on the device (vLLM's V2 runner) gives each
    slot an upper bound of its length on the host: the committed length at admission,
    then, after each step it takes part in, the step's bound on its sequence plus the
    token it samples. Each read takes only the tokens a slot can have gained since the
    last one (per-request windows, not the longest sequence's), and :meth:`start` queues
    it before the engine queues the forward: :meth:`read`, called from the step, then
    waits for that copy only. A slot the started read does not cover, or whose length
    passed its bound, is read at once (a blocking read: counted by the accelerator level).

    Args:
        committed: returns the ``(slots, max_len)`` committed token ids, on the device.
        committed_lengths: returns the ``(slots,)`` committed lengths, on the device.

    Example:
        >>> import torch
        >>> tokens, lengths = torch.tensor([[5, 6, 7, 0]]), torch.tensor([2])
        >>> reads = CommittedReads(lambda: tokens, lambda: lengths)
        >>> reads.admit(0, committed_length=2)
        >>> reads.start({0: 0})
        >>> reads.read([0], [0])
        [[5, 6]]
        >>> lengths[0] = 3  # the step sampled token 7
        >>> reads.grow([0], [2])
        >>> reads.start({0: 2})
        >>> reads.read([0], [2])
        [[7]]
    """

    def __init__(
        self,
        committed: Callable[[], torch.Tensor],
        committed_lengths: Callable[[], torch.Tensor],
    ) -> None:
        self._committed = committed
        self._committed_lengths = committed_lengths
        self._bounds: dict[int, int] = {}
        # The read started for this step: per slot still covered, (its row in the copy,
        # its start); the window; the copy.
        self._started: tuple[dict[int, tuple[int, int]], int, HostCopy] | None = None

    def _drop_started(self, slots: Sequence[int]) -> None:
        """The started copy no longer holds these slots' tokens."""
        if self._started is not None:
            for slot in slots:
                self._started[0].pop(slot, None)

    def admit(self, slot: int, committed_length: int) -> None:
        """A request entered ``slot`` holding ``committed_length`` committed tokens."""
        self._bounds[slot] = committed_length
        self._drop_started([slot])

    def forget(self, slot: int) -> None:
        self._bounds.pop(slot, None)

    def grow(self, slots: Sequence[int], sequence_bounds: Sequence[int]) -> None:
        """This step scores, per slot, at most ``sequence_bounds`` tokens: afterwards the
        slot holds at most one more (the sampled token)."""
        bounds = self._bounds
        # A started copy holds a slot's tokens until the slot takes part in a step (vLLM
        # may call apply() on several chunks of one step).
        self._drop_started(slots)
        for slot, bound in zip(slots, sequence_bounds, strict=True):
            known = bounds.get(slot)
            if known is not None and bound + 1 > known:
                bounds[slot] = int(bound) + 1

    def start(self, starts: dict[int, int]) -> None:
        """Queue the read of each slot's tokens from its start up to its bound (with its
        length, which :meth:`read` checks against the bound)."""
        pending = {slot: start for slot, start in starts.items() if slot in self._bounds}
        self._started = None
        if pending:
            window = self._window(pending)
            values = self._gather(list(pending), list(pending.values()), window)
            covered = {slot: (row, start) for row, (slot, start) in enumerate(pending.items())}
            self._started = (covered, window, HostCopy(values))

    def read(self, slots: list[int], starts: list[int]) -> list[list[int]]:
        """Each slot's committed tokens from its start on (a
        :data:`~anylogits.core.slot_requests.CommittedReader`)."""
        result: list[list[int]] = [[] for _ in slots]
        late: dict[int, int] = {}
        covered, window, copy = self._started or ({}, 0, None)
        copied = copy.wait().tolist() if copy is not None and covered else []
        for k, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            at = covered.get(slot)
            if at is not None and at[1] == start and copied[at[0]][0] <= start + window:
                result[k] = _new_tokens(copied[at[0]], start)
            else:
                late[k] = start
        if late:
            self._read_now(slots, late, result)
        return result

    def _window(self, starts: dict[int, int]) -> int:
        return max(max(self._bounds.get(slot, 0) - start for slot, start in starts.items()), 0)

    def _gather(self, slots: list[int], starts: list[int], window: int) -> torch.Tensor:
        return committed_window(self._committed(), self._committed_lengths(), slots, starts, window)

    def _read_now(self, slots: list[int], late: dict[int, int], result: list[list[int]]) -> None:
        """Read ``late`` rows at once: within their bounds, then (once, only where a length
        passed its bound) as far as their lengths say."""
        starts = {slots[k]: start for k, start in late.items()}
        window = self._window(starts)
        rows = dict(
            zip(
                starts,
                self._gather(list(starts), list(starts.values()), window).tolist(),
                strict=True,
            )
        )
        beyond = {slot: start for slot, start in starts.items() if rows[slot][0] > start + window}
        if beyond:
            window = max(rows[slot][0] - start for slot, start in beyond.items())
            again = self._gather(list(beyond), list(beyond.values()), window).tolist()
            rows.update(zip(beyond, again, strict=True))
        for slot, row in rows.items():
            if slot in self._bounds:
                self._bounds[slot] = max(self._bounds[slot], row[0])
        for k, start in late.items():
            result[k] = _new_tokens(rows[slots[k]], start)
