"""The processor contract every catalogue entry and user processor implements."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypeVar

from anylogits.core import registry, specs

if TYPE_CHECKING:
    import torch
    from typing_extensions import Self

    from anylogits.core.batch import Batch
    from anylogits.core.vocab import Vocabulary

State = TypeVar("State")


class Candidates(NamedTuple):
    """What a truncation left of each row, as ``(B, K)`` columns and their logits.

    ``values[b]`` holds the logits of row ``b`` at ``columns[b]`` (``-inf`` where the row
    has fewer than ``K`` tokens left); every other column of the row is ``-inf``, except
    in rows where ``exact[b]`` is ``False`` (a tie at the K-th logit kept more than
    ``K`` tokens): those rows must be processed in full. ``descending``: every row of
    ``values`` is in descending order (``-inf`` last, no NaN), as ``torch.topk`` returns
    them; processors may then skip a sort or a maximum (see
    :meth:`LogitsProcessor.process_descending`).
    """

    values: torch.Tensor
    columns: torch.Tensor
    exact: torch.Tensor
    descending: bool = False

    def write(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (in place) holding only the candidates: one fill, one scatter."""
        logits.fill_(float("-inf"))
        return logits.scatter_(-1, self.columns, self.values)


class LogitsProcessor:
    """A logits processor written once in torch, run unchanged on every backend.

    Subclasses implement :meth:`process`, vectorized over the batch. ``process`` may edit
    ``logits`` in place (the pipeline hands it a tensor it owns) and returns the result.

    The constructor arguments are the whole configuration: :meth:`config` returns them as
    a JSON-able dict, which makes :meth:`to_spec` / :func:`anylogits.from_spec` work.

    Class attributes:
        spec_name: the ``"type"`` of this processor in a spec dict; registers the class.
        needs_sequences: ``True`` when :meth:`process` reads prompt lengths or generated
            tokens, so the pipeline must track which sequence each row belongs to.
        argmax_invariant: ``True`` when the highest logit of a row always stays the
            highest (truncation and temperature), so greedy decoding may skip it.
        row_local: ``True`` when :meth:`process` depends only on each row's finite
            logits (not on their columns, the row's width, the batch or the history) and
            gives the same bits whichever columns hold them. After a truncation that
            returns :meth:`candidates`, the pipeline runs such processors on the
            ``(B, K)`` candidate logits instead of the ``(B, V)`` rows.
        keeps_order: ``True`` when :meth:`process` leaves a row in descending order in
            descending order (truncations, which only set logits to ``-inf``, and
            temperature). Along a run of candidates that stay in descending order the
            pipeline calls :meth:`process_descending`.
    """

    spec_name: ClassVar[str | None] = None
    needs_sequences: ClassVar[bool] = False
    argmax_invariant: ClassVar[bool] = False
    row_local: ClassVar[bool] = False
    keeps_order: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        registry.register(cls)

    vocab: Vocabulary | None = None

    def bind(self, vocab: Vocabulary | None) -> None:
        """Attach the model's vocabulary; called once per model by the adapter factory.

        Override to resolve strings to token ids or validate ids against the vocabulary,
        raising ``ValueError`` before generation starts. Call ``super().bind(vocab)``.
        """
        self.vocab = vocab

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Return processed ``logits`` of shape ``(B, V)``; may edit ``logits`` in place."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement process()")

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

    def config(self) -> dict[str, Any]:
        """The constructor arguments, as plain JSON-able values."""
        raise NotImplementedError(
            f"{type(self).__qualname__} must implement config() to be serialized"
        )

    def to_spec(self) -> dict[str, Any]:
        """A plain dict ``{"type": spec_name, **config}``, the wire format for engines in
        other processes."""
        if self.spec_name is None:
            raise TypeError(f"{type(self).__qualname__} has no spec_name, so it has no spec")
        return {"type": self.spec_name, **self.config()}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> LogitsProcessor:
        """Build the processor a spec describes (see :func:`anylogits.from_spec`)."""
        processor = specs.from_spec(spec)
        if not isinstance(processor, cls):
            raise ValueError(
                f"spec type {spec.get('type')!r} builds {type(processor).__qualname__}, "
                f"not {cls.__qualname__}"
            )
        return processor

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor | None:
        """One processor applying ``processors[i]`` (all of this class) to row ``i``.

        Engines that batch many requests in slots use it to process rows that run the
        same kind of processor with different parameters in one call. Returns ``None``
        when this class cannot (the rows are then processed group by group). The default
        stacks identical configurations only; stateful processors never stack.
        """
        first = processors[0]
        if issubclass(cls, StatefulLogitsProcessor):
            return None
        config = first.config()
        return first if all(p.config() == config for p in processors[1:]) else None

    def __repr__(self) -> str:
        try:
            args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        except NotImplementedError:
            args = "..."
        return f"{type(self).__name__}({args})"


class StatefulLogitsProcessor(LogitsProcessor, Generic[State]):
    """A processor that carries an explicit per-sequence state.

    The state is a value: :meth:`advance` returns the next state and must not mutate the
    one it was given, because beam search forks one sequence into several and
    speculative decoding rolls back to earlier states. Processors whose state is costly
    to copy set ``mutable_state = True`` and implement :meth:`fork`; the tracker then
    forks before every advance.

    ``process`` reads the states of its rows with ``batch.states(self)``.
    """

    needs_sequences: ClassVar[bool] = True
    mutable_state: ClassVar[bool] = False

    def init_state(self, prompt_ids: torch.Tensor) -> State:
        """The state of a new sequence whose prompt is the 1-D tensor ``prompt_ids``."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement init_state()")

    def advance(self, state: State, token_id: int) -> State:
        """The state after ``token_id`` was appended to the sequence."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement advance()")

    def fork(self, state: State) -> State:
        """An independent copy of ``state`` (only called when ``mutable_state``)."""
        return state


class RowwiseProcessor(LogitsProcessor):
    """Rows of one batch processed by one function with per-row parameters.

    What :meth:`LogitsProcessor.stack` returns: ``function(logits, batch, **parameters)``
    where each tensor parameter has one entry (or row) per logits row. ``row_local``,
    ``keeps_order``, ``candidates`` and ``descending`` (functions called like
    ``function``: :meth:`candidates` and :meth:`process_descending`) are those of the
    stacked class. Internal: it has no spec.
    """

    def __init__(
        self,
        function: Callable[..., torch.Tensor],
        *,
        row_local: bool = False,
        keeps_order: bool = False,
        candidates: Callable[..., Candidates | None] | None = None,
        descending: Callable[..., torch.Tensor] | None = None,
        **parameters: Any,
    ) -> None:
        self.function = function
        self.row_local = row_local  # type: ignore[misc]
        self.keeps_order = keeps_order  # type: ignore[misc]
        self.candidates_function = candidates
        self.descending_function = descending or function
        self.parameters = parameters

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.function(logits, batch, **self.parameters)

    def process_descending(self, values: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.descending_function(values, batch, **self.parameters)

    def candidates(self, logits: torch.Tensor, batch: Batch) -> Candidates | None:
        if self.candidates_function is None:
            return None
        return self.candidates_function(logits, batch, **self.parameters)

    def __repr__(self) -> str:
        return f"RowwiseProcessor({self.function.__name__})"
