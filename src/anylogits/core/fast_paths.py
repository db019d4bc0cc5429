"""Fast paths: hooks a processor opts into for speed, beyond a vectorized ``process``.

A processor is correct with :meth:`~anylogits.LogitsProcessor.process` alone. Where a
profile shows a processor's cost matters (a truncation on a 128k vocabulary, many rows of
one kind in vLLM's batch), it may subclass :class:`FastPaths` and implement what applies:

- :meth:`FastPaths.stack`: one processor for rows of the same kind with different
  parameters (vLLM's grouped rows run in one call);
- :attr:`FastPaths.row_local` / :attr:`FastPaths.keeps_order` with
  :meth:`FastPaths.candidates` and :meth:`FastPaths.process_descending`: after a
  truncation that knows its candidates, followers run on the ``(B, K)`` candidates;
- :meth:`FastPaths.process_into`: the first processor of a pipeline whose caller keeps
  its logits writes the result straight into the output buffer;
- :meth:`FastPaths.fused_form`: a processor a fused kernel applies says which, with its
  parameters (:mod:`anylogits.core.fused_forms`), and runs in that kernel's launch on CUDA;
- :meth:`FastPaths.prepare`: host work that needs the batch but not the logits (a
  grammar's mask) is done before an engine that computes its logits asynchronously
  (MLX) is waited for, overlapping the model's forward.

Each is a promise checked bit for bit against ``process`` (``tests/test_fast_paths.py``,
``tests/test_pipeline.py``). The pipeline reaches every processor through the functions
below, which give a processor without fast paths the plain behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor

if TYPE_CHECKING:
    import torch
    from typing_extensions import Self

    from anylogits.core.batch import Batch
    from anylogits.core.fused_forms import FusedForm


class Candidates(NamedTuple):
    """What a truncation left of each row, as ``(B, K)`` columns and their logits.

    ``values[b]`` holds the logits of row ``b`` at ``columns[b]`` (``-inf`` where the row
    has fewer than ``K`` tokens left); every other column of the row is ``-inf``, except
    in rows where ``exact[b]`` is ``False`` (a tie at the K-th logit kept more than
    ``K`` tokens): those rows must be processed in full. ``descending``: every row of
    ``values`` is in descending order (``-inf`` last, no NaN), as ``torch.topk`` returns
    them; processors may then skip a sort or a maximum (see
    :meth:`FastPaths.process_descending`).
    """

    values: torch.Tensor
    columns: torch.Tensor
    exact: torch.Tensor
    descending: bool = False

    def write(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (in place) holding only the candidates: one fill, one scatter."""
        logits.fill_(float("-inf"))
        return logits.scatter_(-1, self.columns, self.values)


class FastPaths(LogitsProcessor):
    """A processor with fast paths (see the module's docstring for when to use them).

    Attributes:
        row_local: ``True`` when :meth:`process` depends only on each row's finite
            logits (not on their columns, the row's width, the batch or the history) and
            gives the same bits whichever columns hold them. After a truncation that
            returns :meth:`candidates`, the pipeline runs such processors on the
            ``(B, K)`` candidate logits instead of the ``(B, V)`` rows.
        keeps_order: ``True`` when :meth:`process` leaves a row in descending order in
            descending order (truncations, which only set logits to ``-inf``, and
            temperature). Along a run of candidates that stay in descending order the
            pipeline calls :meth:`process_descending`.
        stacks_states: ``True`` for a stateful class whose :meth:`stack` takes the rows'
            states too: the stacked processor reads, as its own state of row ``i``, the
            state ``processors[i]`` keeps for that row's request (grammars: one mask
            fill and one apply for the rows of many requests).
    """

    row_local: bool = False
    keeps_order: bool = False
    stacks_states: bool = False

    def process_into(self, logits: torch.Tensor, batch: Batch, out: torch.Tensor) -> torch.Tensor:
        """:meth:`process` that leaves ``logits`` untouched and returns the result in ``out``.

        ``out`` has the shape and dtype of ``logits`` and does not overlap them. Used for
        the first processor of a pipeline whose caller keeps its logits (transformers).
        The default copies ``logits`` into ``out`` and processes the copy; a processor
        whose first full-width write can read ``logits`` and write ``out`` overrides it,
        so the caller's logits are read once instead of copied and then edited.
        """
        return self.process(out.copy_(logits), batch)

    def process_descending(self, values: torch.Tensor, batch: Batch) -> torch.Tensor:
        """:meth:`process` for rows known to be in descending order (``-inf`` last, no
        NaN): a truncation's candidates. Must give :meth:`process`'s bits; overridden
        where the order spares work (no sort, the maximum is the first column). The
        default calls :meth:`process`."""
        return self.process(values, batch)

    def candidates(self, logits: torch.Tensor, batch: Batch) -> Candidates | None:
        """This truncation's result as :class:`Candidates`, without editing ``logits``;
        ``None`` when it cannot bound the tokens it keeps (the default)."""
        return None

    def prepare(self, batch: Batch) -> None:
        """Do now the work of the next :meth:`process` of ``batch`` that needs no logits.

        Called before the logits exist, by engines that compute them asynchronously
        (:class:`~anylogits.core.pending.PendingLogits`), from the thread that then calls
        :meth:`process` (or :meth:`process_into`) with the same ``batch`` object, which
        must give the bits it gives unprepared. The default does nothing."""

    def fused_form(self) -> FusedForm | None:
        """The kernel that applies this processor, bit for bit as :meth:`process` (within
        float rounding at a top-p or min-p boundary), and its parameters; ``None`` (the
        default) when none does. See :mod:`anylogits.core.fused_forms`."""
        return None

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor | None:
        """One processor applying ``processors[i]`` (all of this class) to row ``i``.

        Engines that batch many requests in slots use it to process rows that run the
        same kind of processor with different parameters in one call. Returns ``None``
        when this class cannot (the rows are then processed group by group). The default
        stacks identical configurations only; stateful processors never stack.
        """
        return _identical(cls, processors)


def _identical(kind: type, processors: Sequence[LogitsProcessor]) -> LogitsProcessor | None:
    """The first of ``processors`` when all have one configuration (stateful: never)."""
    if issubclass(kind, StatefulLogitsProcessor):
        return None
    config = processors[0].config()
    return processors[0] if all(p.config() == config for p in processors[1:]) else None


def is_row_local(processor: LogitsProcessor) -> bool:
    """:attr:`FastPaths.row_local` of ``processor`` (``False`` without fast paths)."""
    return isinstance(processor, FastPaths) and processor.row_local


def keeps_order(processor: LogitsProcessor) -> bool:
    """:attr:`FastPaths.keeps_order` of ``processor`` (``False`` without fast paths)."""
    return isinstance(processor, FastPaths) and processor.keeps_order


def candidates(processor: LogitsProcessor, logits: torch.Tensor, batch: Batch) -> Candidates | None:
    """:meth:`FastPaths.candidates` of ``processor`` (``None`` without fast paths)."""
    return processor.candidates(logits, batch) if isinstance(processor, FastPaths) else None


def process_descending(
    processor: LogitsProcessor, values: torch.Tensor, batch: Batch
) -> torch.Tensor:
    """:meth:`FastPaths.process_descending` of ``processor`` (else ``process``)."""
    if isinstance(processor, FastPaths):
        return processor.process_descending(values, batch)
    return processor.process(values, batch)


def process_into(
    processor: LogitsProcessor, logits: torch.Tensor, batch: Batch, out: torch.Tensor
) -> torch.Tensor:
    """:meth:`FastPaths.process_into` of ``processor`` (else ``process`` on a copy)."""
    if isinstance(processor, FastPaths):
        return processor.process_into(logits, batch, out)
    return processor.process(out.copy_(logits), batch)


def prepare(processor: LogitsProcessor, batch: Batch) -> None:
    """:meth:`FastPaths.prepare` of ``processor`` (nothing without fast paths)."""
    if isinstance(processor, FastPaths):
        processor.prepare(batch)


def stacks_states(processor: LogitsProcessor) -> bool:
    """:attr:`FastPaths.stacks_states` of ``processor`` (``False`` without fast paths)."""
    return isinstance(processor, FastPaths) and processor.stacks_states


def fused_form(processor: LogitsProcessor) -> FusedForm | None:
    """:meth:`FastPaths.fused_form` of ``processor`` (``None`` without fast paths)."""
    return processor.fused_form() if isinstance(processor, FastPaths) else None


def stack(kind: type[LogitsProcessor], processors: Sequence[Any]) -> LogitsProcessor | None:
    """:meth:`FastPaths.stack` of ``kind`` for ``processors`` (all of that class); without
    fast paths, the first when all share one configuration (stateful: never)."""
    if issubclass(kind, FastPaths):
        return kind.stack(processors)
    return _identical(kind, processors)


class RowwiseProcessor(FastPaths):
    """Rows of one batch processed by one function with per-row parameters.

    What :meth:`FastPaths.stack` returns: ``function(logits, batch, **parameters)``
    where each tensor parameter has one entry (or row) per logits row. ``row_local``,
    ``keeps_order``, ``candidates`` and ``descending`` (functions called like
    ``function``: :meth:`candidates` and :meth:`process_descending`) are those of the
    stacked class; ``fused``: the stacked rows' :meth:`fused_form`, where a kernel
    applies them. Internal: it has no spec.
    """

    def __init__(
        self,
        function: Callable[..., torch.Tensor],
        *,
        row_local: bool = False,
        keeps_order: bool = False,
        candidates: Callable[..., Candidates | None] | None = None,
        descending: Callable[..., torch.Tensor] | None = None,
        fused: FusedForm | None = None,
        **parameters: Any,
    ) -> None:
        self.function = function
        self.row_local = row_local
        self.keeps_order = keeps_order
        self.candidates_function = candidates
        self.descending_function = descending or function
        self.fused = fused
        self.parameters = parameters

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.function(logits, batch, **self.parameters)

    def process_descending(self, values: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.descending_function(values, batch, **self.parameters)

    def candidates(self, logits: torch.Tensor, batch: Batch) -> Candidates | None:
        if self.candidates_function is None:
            return None
        return self.candidates_function(logits, batch, **self.parameters)

    def fused_form(self) -> FusedForm | None:
        return self.fused

    def __repr__(self) -> str:
        return f"RowwiseProcessor({self.function.__name__})"
