"""A request in an engine's persistent batch: its token buffer (prompt + committed
output), its committed processor states, and where its new tokens come from (an
:class:`OutputFeed` the engine pushes, or a :data:`CommittedReader` read per call)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from anylogits.core.pipeline import Pipeline
from anylogits.core.tracker import SequenceNode, child_node, root_node

# Reads committed tokens the engine holds: (slots, start offsets) -> tokens from each
# start to the end of the committed sequence, one list per slot.
CommittedReader = Callable[[list[int], list[int]], list[list[int]]]


class OutputFeed(Protocol):
    """Where a request's generated tokens come from, when the engine pushes them."""

    def read(self) -> tuple[bool, list[int]]:
        """``(restart, tokens)``: the tokens generated since the last read; with
        ``restart`` the engine dropped outputs, and ``tokens`` follow the prompt."""
        ...


class PipelineGroup:
    """The pipeline shared by every request with the same specs."""

    __slots__ = ("error", "key", "pipeline")

    def __init__(self, key: str, pipeline: Pipeline | None, error: str | None) -> None:
        self.key = key
        self.pipeline = pipeline
        self.error = error


class SlotRequest:
    """One request: its token buffer (prompt + committed output) and committed states."""

    __slots__ = ("group", "length", "node", "output", "prompt_length", "tokens")

    def __init__(
        self,
        group: PipelineGroup,
        prompt_ids: Sequence[int] | None,
        prompt_length: int,
        output: OutputFeed | None,
    ) -> None:
        self.group = group
        self.prompt_length = prompt_length
        self.tokens = torch.empty(max(64, 2 * prompt_length), dtype=torch.int64)
        self.length = 0
        if prompt_ids is not None:
            self.append(list(prompt_ids))
        self.output = output
        self.node: SequenceNode | None = None

    def append(self, token_ids: list[int]) -> None:
        end = self.length + len(token_ids)
        if end > self.tokens.shape[0]:
            grown = torch.empty(max(2 * self.tokens.shape[0], end), dtype=torch.int64)
            grown[: self.length] = self.tokens[: self.length]
            self.tokens = grown
        self.tokens[self.length : end] = torch.tensor(token_ids, dtype=torch.int64)
        self.length = end

    def read_output(self) -> None:
        """Take in the tokens the engine generated since the last read."""
        if self.output is None:
            return
        restart, tokens = self.output.read()
        if restart:
            self.length = self.prompt_length
            self.node = None
        if tokens:
            self.append(tokens)

    def committed_node(self) -> SequenceNode:
        """The processor states after every committed token."""
        assert self.group.pipeline is not None
        processors = self.group.pipeline.stateful
        node = self.node
        if node is None:
            node = root_node(processors, self.tokens[: self.prompt_length])
        for token_id in self.tokens[node.length : self.length].tolist():
            node = child_node(processors, node, token_id)
        self.node = node
        return node


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
        processors = request.group.pipeline.stateful  # type: ignore[union-attr]
        for token_id in draft:
            node = child_node(processors, node, token_id)
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
