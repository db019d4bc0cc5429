"""What a processor sees about the rows of one call, whatever backend made them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from anylogits.core.transfer import to_device

if TYPE_CHECKING:
    from anylogits.core.vocab import Vocabulary

TokenSource = torch.Tensor | Callable[[], torch.Tensor]


class Batch:
    """The rows of one call: token history, prompt lengths, per-processor states.

    Token history is *right-aligned*: row ``b`` occupies the last ``lengths[b]`` columns
    of :attr:`token_ids`, so "the last n tokens" sit in the same columns for every row.
    Columns left of a row's start are padding (see :attr:`valid_mask`). Backends that do
    not hold a ``(B, L)`` tensor build it only when a processor asks for it.

    Args:
        size: number of rows ``B``.
        token_ids: the ``(B, L)`` int64 history, or a function that builds it on demand.
        lengths: ``(B,)`` number of real tokens per row (or a function building it, called
            with the history); ``None`` means every row is full.
        prompt_lengths: ``(B,)`` prompt length per row (or a function building it), known
            when sequences are tracked.
        states: for each stateful processor, its states in row order.
        vocab: the bound vocabulary, if any.
        device: the logits' device. History, lengths and prompt lengths built on the
            host are copied there once, when first asked for, without blocking the host
            (see :func:`~anylogits.core.transfer.to_device`); ``None`` leaves each where
            its source made it.
    """

    __slots__ = (
        "_host_token_ids",
        "_lengths",
        "_prompt_lengths",
        "_source_token_ids",
        "_states",
        "_token_ids",
        "_token_source",
        "device",
        "rows_are_full",
        "size",
        "vocab",
    )

    def __init__(
        self,
        size: int,
        token_ids: TokenSource | None = None,
        *,
        lengths: TokenSource | None = None,
        prompt_lengths: TokenSource | None = None,
        states: Mapping[int, Sequence[Any]] | None = None,
        vocab: Vocabulary | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.size = size
        self.device = device
        self._token_source = token_ids
        self._token_ids: torch.Tensor | None = None
        # The history as its source made it, before it was placed on ``device``.
        self._source_token_ids: torch.Tensor | None = None
        self._host_token_ids: torch.Tensor | None = None
        self._lengths = lengths
        self._prompt_lengths = prompt_lengths
        self._states = states or {}
        self.vocab = vocab
        # No lengths given: every row fills the history's L columns.
        self.rows_are_full = lengths is None

    @property
    def token_ids(self) -> torch.Tensor:
        """``(B, L)`` int64 token history, right-aligned."""
        if self._token_ids is None:
            self._token_ids = self._placed(self._unplaced_token_ids())
        return self._token_ids

    @property
    def history_on_host(self) -> bool:
        """Whether the history's source is host memory (an engine's token lists), so
        that :attr:`host_token_ids` reads nothing on the device."""
        return self._unplaced_token_ids().device.type == "cpu"

    @property
    def host_token_ids(self) -> torch.Tensor:
        """:attr:`token_ids` on the host, for a processor that must read token values
        there (a CPU generator seeded by them): the history as its source made it when
        that is host memory (see :attr:`history_on_host`), else read back from the
        device once."""
        if self._host_token_ids is None:
            source = self._unplaced_token_ids()
            self._host_token_ids = source if source.device.type == "cpu" else source.cpu()
        return self._host_token_ids

    def _unplaced_token_ids(self) -> torch.Tensor:
        if self._source_token_ids is None:
            source = self._token_source
            if source is None:
                raise RuntimeError(
                    "this backend passed no token history, but a processor asked for it"
                )
            self._source_token_ids = source() if callable(source) else source
        return self._source_token_ids

    @property
    def lengths(self) -> torch.Tensor:
        """``(B,)`` number of real tokens in each row."""
        if callable(self._lengths):
            self._lengths = self._placed(self._lengths())
        elif isinstance(self._lengths, torch.Tensor):
            self._lengths = self._placed(self._lengths)
        if self._lengths is None:
            ids = self.token_ids
            self._lengths = torch.full((ids.shape[0],), ids.shape[1], device=ids.device)
        return self._lengths

    @property
    def valid_mask(self) -> torch.Tensor:
        """``(B, L)`` bool, ``True`` where :attr:`token_ids` holds a real token."""
        ids = self.token_ids
        width = ids.shape[1]
        columns = torch.arange(width, device=ids.device)
        return columns >= (width - self.lengths.to(ids.device))[:, None]

    @property
    def prompt_lengths(self) -> torch.Tensor:
        """``(B,)`` prompt length of each row's sequence."""
        if callable(self._prompt_lengths):
            self._prompt_lengths = self._placed(self._prompt_lengths())
        elif isinstance(self._prompt_lengths, torch.Tensor):
            self._prompt_lengths = self._placed(self._prompt_lengths)
        if self._prompt_lengths is None:
            raise RuntimeError(
                "prompt lengths are only known to processors that set needs_sequences = True"
            )
        return self._prompt_lengths

    @property
    def generated_lengths(self) -> torch.Tensor:
        """``(B,)`` number of tokens generated after the prompt in each row."""
        return self.lengths.to(self.prompt_lengths.device) - self.prompt_lengths

    def _placed(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.device is None else to_device(tensor, self.device)

    def states(self, processor: object) -> Sequence[Any]:
        """The states of ``processor`` (a stateful processor of this call's pipeline) for
        each row, in row order, found by the processor's identity alone."""
        try:
            return self._states[id(processor)]
        except KeyError:
            raise RuntimeError(
                f"{type(processor).__qualname__} has no states in this batch: is it a "
                "StatefulLogitsProcessor that is part of this pipeline?"
            ) from None
