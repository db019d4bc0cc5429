"""A request in an engine's persistent batch: its token buffer (prompt + committed
output), its committed processor states, and where its new tokens come from (an
:class:`OutputFeed` the engine pushes, or a :data:`CommittedReader` read per call)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from anylogits.core.pipeline import Pipeline
from anylogits.core.tracker import SequenceNode, descendant_node, root_node

# Reads committed tokens the engine holds: (slots, start offsets) -> tokens from each
# start to the end of the committed sequence, one list per slot.
CommittedReader = Callable[[list[int], list[int]], list[list[int]]]


class OutputFeed(Protocol):
    """Where a request's generated tokens come from, when the engine pushes them."""

    def read(self) -> tuple[bool, list[int]]:
        """``(restart, tokens)``: the tokens generated since the last read; with
        ``restart`` the engine dropped outputs, and ``tokens`` follow the prompt."""
        ...


class PushedTokens:
    """An :class:`OutputFeed` the engine's adapter pushes each sampled token into."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[int] = []

    def read(self) -> tuple[bool, list[int]]:
        tokens, self.pending = self.pending, []
        return False, tokens


class PipelineGroup:
    """The pipeline shared by every request with the same specs."""

    __slots__ = ("__weakref__", "error", "key", "pipeline")

    def __init__(self, key: str, pipeline: Pipeline | None, error: str | None) -> None:
        self.key = key
        self.pipeline = pipeline
        self.error = error


class SlotRequest:
    """One request: its token buffer (prompt + committed output) and committed states."""

    __slots__ = (
        "_buffer",
        "_unwritten",
        "_written",
        "group",
        "length",
        "node",
        "output",
        "prompt_length",
    )

    def __init__(
        self,
        group: PipelineGroup,
        prompt_ids: Sequence[int] | None,
        prompt_length: int,
        output: OutputFeed | None,
    ) -> None:
        self.group = group
        self.prompt_length = prompt_length
        self._buffer = torch.empty(max(64, 2 * prompt_length), dtype=torch.int64)
        # The buffer holds the first `_written` tokens; the rest, `_unwritten`, are
        # written when the buffer is read (a history): a tensor write per token and row
        # was a third of a step of 32 structured requests, which never read it.
        self._written = 0
        self._unwritten: list[int] = []
        self.length = 0
        if prompt_ids is not None:
            self.append(list(prompt_ids))
        self.output = output
        self.node: SequenceNode | None = None

    def append(self, token_ids: list[int]) -> None:
        self._unwritten.extend(token_ids)
        self.length += len(token_ids)
        if len(self._unwritten) >= _UNWRITTEN:
            self._write()

    @property
    def tokens(self) -> torch.Tensor:
        """The token buffer: prompt and committed output in ``tokens[:length]``."""
        if self._unwritten:
            self._write()
        return self._buffer

    def _write(self) -> None:
        end = self.length
        if end > self._buffer.shape[0]:
            grown = torch.empty(max(2 * self._buffer.shape[0], end), dtype=torch.int64)
            grown[: self._written] = self._buffer[: self._written]
            self._buffer = grown
        self._buffer[self._written : end] = torch.tensor(self._unwritten, dtype=torch.int64)
        self._written, self._unwritten = end, []

    def _truncate(self, length: int) -> None:
        """Drop the tokens after the first ``length``."""
        if length < self._written:
            self._written, self._unwritten = length, []
        else:
            del self._unwritten[length - self._written :]
        self.length = length

    def read_output(self) -> None:
        """Take in the tokens the engine generated since the last read."""
        if self.output is None:
            return
        restart, tokens = self.output.read()
        if restart:
            self._truncate(self.prompt_length)
            self.node = None
        if tokens:
            self.append(tokens)

    def committed_node(self) -> SequenceNode:
        """The processor states after every committed token."""
        node = self.node
        if node is not None:
            behind = self.length - node.length
            if not behind:
                return node
            if behind == 1 and self._unwritten:  # a decoding step: one token more
                node = self.node = self.group.pipeline.child(node, self._unwritten[-1])  # type: ignore[union-attr]
                return node
        else:
            pipeline = self.group.pipeline
            assert pipeline is not None
            node = root_node(pipeline.stateful, self.tokens[: self.prompt_length])
        if node.length < self.length:
            if node.length >= self._written:
                new = self._unwritten[node.length - self._written :]
            else:
                new = self.tokens[node.length : self.length].tolist()
            node = descendant_node(self.group.pipeline.child, node, new)  # type: ignore[union-attr]
        self.node = node
        return node


# Tokens kept unwritten at most (then written in one tensor).
_UNWRITTEN = 256


def read_committed(
    requests: list[SlotRequest], slots: list[int], committed: CommittedReader | None
) -> None:
    if committed is None:
        for request in requests:
            request.read_output()
        return
    # One engine read for the whole group; a request with several rows (draft
    # positions) is read once.
    unique: dict[int, tuple[int, SlotRequest]] = {}
    for slot, request in zip(slots, requests, strict=True):
        if request.output is None:
            unique.setdefault(id(request), (slot, request))
    if not unique:
        return
    pending = list(unique.values())
    new_tokens = committed([slot for slot, _ in pending], [r.length for _, r in pending])
    for (_, request), tokens in zip(pending, new_tokens, strict=True):
        if tokens:
            request.append(list(tokens))


def draft_node(request: SlotRequest, draft: list[int]) -> SequenceNode:
    node = request.committed_node()
    if draft:
        node = descendant_node(request.group.pipeline.child, node, draft)  # type: ignore[union-attr]
    return node


def history_of(requests: list[SlotRequest], drafts: list[list[int]]) -> torch.Tensor:
    lengths = [r.length + len(d) for r, d in zip(requests, drafts, strict=True)]
    width = max(lengths)
    ids = torch.zeros(len(requests), width, dtype=torch.int64)
    for row, (request, draft) in enumerate(zip(requests, drafts, strict=True)):
        end = width - len(draft)
        ids[row, end - request.length : end] = request.tokens[: request.length]
        if draft:
            ids[row, end:] = torch.tensor(draft, dtype=torch.int64)
    return ids
