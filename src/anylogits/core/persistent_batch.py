"""Per-request pipelines for engines that keep a persistent batch of requests in slots.

An engine of this kind puts every request in a slot, gives each its own processor specs,
and says when requests arrive, leave or move between slots. Rows therefore have
identities, and no token-prefix hashing is needed: each request keeps its own token
buffer and its committed processor states (:mod:`~anylogits.core.slot_requests`),
extended as tokens arrive.

Rows whose requests share the same specs form one group and are processed by one
pipeline call (:mod:`~anylogits.core.row_groups`); rows without specs are never touched.
How an engine spells specs and hands over generated tokens is its adapter's business: it
passes the checked specs and an :class:`OutputFeed` or a :data:`CommittedReader`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.device_history import DeviceHistory
from anylogits.core.pending import PendingLogits
from anylogits.core.pipeline import Pipeline, end_sequences
from anylogits.core.row_groups import GROUP_CACHE, PipelineGroups, RowGroup, brief
from anylogits.core.slot_requests import (
    CommittedReader,
    OutputFeed,
    SlotRequest,
    draft_node,
    history_of,
    read_committed,
)
from anylogits.core.transfer import host_tensor_to, to_device
from anylogits.core.vocab import Vocabulary

__all__ = ["GROUP_CACHE", "CommittedReader", "DeviceHistory", "OutputFeed", "PersistentBatch"]

# Per row, speculative tokens that follow the committed sequence; or a function that
# reads them from the engine, called only when a group's processors need them on the host.
Drafts = Sequence[Sequence[int]] | Callable[[], Sequence[Sequence[int]]]


class PersistentBatch:
    """Slot-indexed per-request pipelines, applied group by group to a ``(B, V)`` batch.

    Args:
        vocab: the model's vocabulary, or a function that builds it (called once, at the
            first request that has processors, so an engine pays for it only when used).
        device: the device of the logits (history tensors are built on the CPU and moved
            by the processors that read them).

    Example:
        >>> import torch
        >>> from anylogits import LogitBias, to_specs
        >>> requests = PersistentBatch()
        >>> requests.put(1, to_specs([LogitBias({2: -5.0})]), prompt_ids=[0, 1])
        True
        >>> requests.process(torch.zeros(3, 4))
        tensor([[ 0.,  0.,  0.,  0.],
                [ 0.,  0., -5.,  0.],
                [ 0.,  0.,  0.,  0.]])
    """

    def __init__(self, vocab: Vocabulary | Callable[[], Vocabulary | None] | None = None) -> None:
        # A function builds the vocabulary at first use (None once it has succeeded).
        self._build_vocab: Callable[[], Vocabulary | None] | None = None
        self._vocab: Vocabulary | None = None
        if isinstance(vocab, Vocabulary) or vocab is None:
            self._vocab = vocab
        else:
            self._build_vocab = vocab
        self._groups = PipelineGroups(lambda: self.vocab)
        self._slots: dict[int, SlotRequest] = {}
        self._layout: tuple[tuple[int, tuple[int, ...] | None], list[RowGroup]] | None = None

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, slot: int) -> bool:
        return slot in self._slots

    @property
    def vocab(self) -> Vocabulary | None:
        if self._build_vocab is not None:
            # A failed build raises here (and is tried again next time).
            self._vocab = self._build_vocab()
            self._build_vocab = None
        return self._vocab

    def put(
        self,
        slot: int,
        specs: Sequence[dict[str, Any]] | None,
        *,
        failure: str | None = None,
        prompt_ids: Sequence[int] | None = None,
        prompt_length: int | None = None,
        output: OutputFeed | None = None,
        pipeline: Pipeline | None = None,
    ) -> bool:
        """Put a request in ``slot`` (replacing whatever was there).

        Args:
            slot: the engine's row index for the request.
            specs: the request's checked processor specs (the adapter reads them from the
                engine's request, see :func:`~anylogits.core.specs.parse_specs`); ``None``
                or empty: the slot has no processors.
            failure: why the request's specs could not be read: its rows end the
                sequence and the reason is logged (the request is already scheduled, and
                passing its logits through would hide the failure).
            prompt_ids: the prompt; ``None`` when the engine supplies committed tokens at
                each call instead (see :meth:`process`).
            prompt_length: the prompt length when ``prompt_ids`` is ``None``.
            output: where the request's generated tokens come from; ``None`` when
                committed tokens are read per call.
            pipeline: processors built in this process (objects, not specs) that the
                request runs instead of ``specs``; every request given the same pipeline
                is one group.

        Returns whether the request has processors (a failed one counts: it ends).
        """
        self._layout = None
        if failure is not None:
            group = self._groups.failed(failure)
        elif pipeline is not None:
            group = self._groups.given(pipeline)
        elif not specs:
            self._slots.pop(slot, None)
            return False
        else:
            group = self._groups.group(specs)
        length = len(prompt_ids) if prompt_ids is not None else prompt_length
        if length is None:
            raise ValueError("pass prompt_ids or prompt_length")
        self._slots[slot] = SlotRequest(group, prompt_ids, length, output)
        return True

    def host_state_lengths(self) -> dict[int, int]:
        """Per slot whose processors keep states on the host and whose committed tokens
        are read from the engine (no output feed): how many tokens it has read so far."""
        return {
            slot: request.length
            for slot, request in self._slots.items()
            if request.output is None
            and request.group.pipeline is not None
            and request.group.pipeline.stateful
        }

    def remove(self, slot: int) -> None:
        """Forget the request in ``slot`` (no error when the slot is empty)."""
        self._layout = None
        self._slots.pop(slot, None)

    def move(self, source: int, target: int) -> None:
        """The request of ``source`` now sits in ``target``; ``source`` becomes empty."""
        self._layout = None
        request = self._slots.pop(source, None)
        self._slots.pop(target, None)
        if request is not None:
            self._slots[target] = request

    def swap(self, first: int, second: int) -> None:
        """Exchange the requests of two slots."""
        self._layout = None
        a = self._slots.pop(first, None)
        b = self._slots.pop(second, None)
        if a is not None:
            self._slots[second] = a
        if b is not None:
            self._slots[first] = b

    def process(
        self,
        logits: torch.Tensor | PendingLogits,
        row_slots: Sequence[int] | None = None,
        *,
        drafts: Drafts | None = None,
        committed: CommittedReader | None = None,
        device_history: DeviceHistory | None = None,
    ) -> torch.Tensor:
        """Apply each row's pipeline to ``logits`` in place and return them.

        Args:
            logits: ``(B, V)`` logits the engine lets us edit, or
                :class:`~anylogits.core.pending.PendingLogits`: every group's pipeline
                then prepares (a grammar fills its masks) before they are waited for.
            row_slots: the slot of each row; ``None`` means row ``i`` is slot ``i``.
            drafts: per row, speculative tokens that follow the committed sequence (the
                row scores the position after them); states advance through them without
                being committed. A function is called only when a group's processors keep
                states on the host.
            committed: reads committed tokens from the engine, for requests put without
                an output feed.
            device_history: the rows' histories where the engine keeps them, on the
                device. Groups without stateful processors read them there, so neither
                committed tokens nor drafts come back to the host for them.
        """
        if not self._slots:
            return logits.wait() if isinstance(logits, PendingLogits) else logits
        rows = logits.rows if isinstance(logits, PendingLogits) else logits.shape[0]
        layout = self._row_groups(rows, row_slots, drafts is not None)
        host_drafts = _DraftReader(drafts)
        prepared: list[Batch | Exception | None] = [None] * len(layout)
        if isinstance(logits, PendingLogits):
            for index, row_group in enumerate(layout):
                try:
                    prepared[index] = self._prepare(
                        row_group, committed, host_drafts, device_history, logits.device
                    )
                except Exception as error:  # ends the group below, as _apply's would
                    prepared[index] = error
            logits = logits.wait()
        for row_group, batch in zip(layout, prepared, strict=True):
            if isinstance(batch, Exception):  # its prepare failed
                self._fail(logits, row_group, batch)
                continue
            try:
                self._apply(logits, row_group, committed, host_drafts, device_history, batch)
            except Exception as error:  # one request's failure must not stop the engine
                self._fail(logits, row_group, error)
        return logits

    def _prepare(
        self,
        row_group: RowGroup,
        committed: CommittedReader | None,
        drafts: _DraftReader,
        device_history: DeviceHistory | None,
        device: torch.device,
    ) -> Batch | None:
        """The group's batch, its pipeline prepared for it; ``None`` where it has none."""
        pipeline = row_group.group.pipeline
        if pipeline is None:
            return None
        batch = self._batch(pipeline, row_group, committed, drafts, device_history, device)
        pipeline.prepare(batch)
        return batch

    def _batch(
        self,
        pipeline: Pipeline,
        row_group: RowGroup,
        committed: CommittedReader | None,
        drafts: _DraftReader,
        device_history: DeviceHistory | None,
        device: torch.device,
    ) -> Batch:
        if device_history is not None and not pipeline.stateful:
            return _device_batch(pipeline, row_group, device_history, device)
        return _host_batch(pipeline, row_group, committed, drafts.of(row_group.rows), device)

    def _fail(self, logits: torch.Tensor, row_group: RowGroup, error: Exception) -> None:
        """End the requests of a group whose processors raised, and log why.

        Their rows allow only EOS from now on (this step included); every other row is
        left as it is. Rows stacked into one call (processors of the same kinds, different
        parameters; grammars of different requests) end together: the call cannot say
        which row failed. (A grammar raises only where llguidance itself fails: a spec
        that exhausts its budget ends its own row without raising.)
        """
        self._layout = None
        failed = self._groups.failed(
            f"processors {brief(row_group.group.key)} failed on slot(s) {row_group.slots}: "
            f"{type(error).__name__}: {error}"
        )
        for request in row_group.requests:
            request.group = failed
        rows = host_tensor_to(row_group.rows, logits.device)
        logits.index_copy_(0, rows, self._end_sequences(logits.index_select(0, rows)))

    def _row_groups(
        self,
        batch_size: int,
        row_slots: Sequence[int] | None,
        has_drafts: bool,
    ) -> list[RowGroup]:
        # An engine that names each row's slot names the same ones step after step.
        key = (batch_size, None if row_slots is None else tuple(row_slots))
        cacheable = not has_drafts
        if cacheable and self._layout is not None and self._layout[0] == key:
            return self._layout[1]
        by_key: dict[str, RowGroup] = {}
        slots = range(batch_size) if row_slots is None else row_slots
        for row, slot in enumerate(slots):
            request = self._slots.get(slot)
            if request is None:
                continue
            row_group = by_key.get(request.group.key)
            if row_group is None:
                row_group = by_key[request.group.key] = RowGroup(request.group)
            row_group.rows.append(row)
            row_group.slots.append(slot)
            row_group.requests.append(request)
        layout = self._groups.stack_same_kinds(list(by_key.values()))
        for row_group in layout:
            first, last = row_group.rows[0], row_group.rows[-1]
            if last - first + 1 == len(row_group.rows):
                row_group.span = (first, last + 1)
            else:
                row_group.index = torch.tensor(row_group.rows)
        if cacheable:
            self._layout = (key, layout)
        return layout

    def _apply(
        self,
        logits: torch.Tensor,
        row_group: RowGroup,
        committed: CommittedReader | None,
        drafts: _DraftReader,
        device_history: DeviceHistory | None,
        batch: Batch | None = None,
    ) -> None:
        """``row_group``'s pipeline on its rows of ``logits``; ``batch``: theirs, if
        :meth:`_prepare` made it."""
        pipeline = row_group.group.pipeline
        if row_group.span is not None:
            start, end = row_group.span
            # The whole batch as it is: a slice is the step's first torch op, and costs
            # ~20 us there (caches cold after the forward), against 1 us warm.
            rows = logits if start == 0 and end == logits.shape[0] else logits[start:end]
        else:
            # Kept on the logits' device: the layout is reused while the batch holds.
            index = row_group.index = to_device(row_group.index, logits.device)  # type: ignore[arg-type]
            rows = logits.index_select(0, index)
        if pipeline is None:
            rows = self._end_sequences(rows)
        else:
            pipeline.check_logits(logits)
            if batch is None:
                batch = self._batch(
                    pipeline, row_group, committed, drafts, device_history, logits.device
                )
            result = pipeline.apply(rows, batch)
            if row_group.span is not None and result is rows:
                return
            rows = result
        if row_group.span is not None:
            logits[row_group.span[0] : row_group.span[1]] = rows
        else:
            logits.index_copy_(0, row_group.index, rows)  # type: ignore[arg-type]

    def _end_sequences(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (in place) allowing only the first EOS id; unchanged, with an error
        logged, when the engine knows no EOS (it then stops at ``max_tokens``)."""
        try:
            vocab = self.vocab
        except Exception:  # the engine's tokenizer failed to load: no EOS to force
            vocab = None
        return end_sequences(rows, vocab)


class _DraftReader:
    """The drafts of a call, read from the engine at most once, when first asked for."""

    def __init__(self, drafts: Drafts | None) -> None:
        self._source = drafts
        self._read: Sequence[Sequence[int]] | None = None

    def of(self, rows: Sequence[int]) -> list[list[int]] | None:
        """The drafts of ``rows``; ``None`` when the call has none."""
        if self._source is None:
            return None
        if self._read is None:
            self._read = self._source() if callable(self._source) else self._source
        return [list(self._read[row]) for row in rows]


def _host_batch(
    pipeline: Pipeline,
    row_group: RowGroup,
    committed: CommittedReader | None,
    drafts: list[list[int]] | None,
    device: torch.device,
) -> Batch:
    """The rows' Batch from each request's host token buffer, committed tokens read from
    the engine first (once, and only when a processor or a state needs them)."""
    requests = row_group.requests
    synced = False

    def sync() -> None:
        nonlocal synced
        if not synced:
            read_committed(requests, row_group.slots, committed)
            synced = True

    states: dict[int, Sequence[Any]] = {}
    prompt_lengths: Callable[[], torch.Tensor] | None = None
    if pipeline.tracker is not None:
        sync()
        if drafts is None:  # a decoding step: each request's committed states
            nodes = [request.committed_node() for request in requests]
        else:
            nodes = [
                draft_node(request, draft) for request, draft in zip(requests, drafts, strict=True)
            ]
        states = {
            id(processor): [node.states[k] for node in nodes]
            for k, processor in enumerate(pipeline.stateful)
        }
        prompt_lengths = functools.partial(_prompt_lengths, requests)  # when read

    def history() -> torch.Tensor:
        sync()
        return history_of(requests, drafts or [[] for _ in requests])

    def lengths() -> torch.Tensor:
        sync()
        if drafts is None:
            return torch.tensor([request.length for request in requests])
        return torch.tensor([r.length + len(d) for r, d in zip(requests, drafts, strict=True)])

    return Batch(
        len(requests),
        history,
        lengths=lengths,
        prompt_lengths=prompt_lengths,
        states=states,
        vocab=pipeline.vocab,
        device=device,
    )


def _prompt_lengths(requests: list[SlotRequest]) -> torch.Tensor:
    return torch.tensor([request.prompt_length for request in requests])


def _device_batch(
    pipeline: Pipeline, row_group: RowGroup, history: DeviceHistory, device: torch.device
) -> Batch:
    """The rows' Batch from the engine's device-resident histories: nothing is read back."""
    gathered: tuple[torch.Tensor, torch.Tensor] | None = None

    def rows() -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal gathered
        if gathered is None:
            gathered = history.rows(row_group.rows)
        return gathered

    prompt_lengths = None
    if pipeline.tracker is not None:
        prompt_lengths = _prompt_lengths(row_group.requests)
    return Batch(
        len(row_group.requests),
        lambda: rows()[0],
        lengths=lambda: rows()[1],
        prompt_lengths=prompt_lengths,
        vocab=pipeline.vocab,
        device=device,
    )
