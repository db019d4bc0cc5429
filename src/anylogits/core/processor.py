"""The processor contract every catalogue entry and user processor implements."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    import torch

    from anylogits.core.batch import Batch
    from anylogits.core.vocab import Vocabulary

State = TypeVar("State")

# The registry and the spec format stand above this interface: they use it, it names
# neither. Each installs itself here when imported, and ``anylogits.core`` imports both
# with the package, so before any processor class can be defined.
_subclass_watchers: list[Callable[[type[LogitsProcessor]], None]] = []
_spec_builder: Callable[[dict[str, Any]], LogitsProcessor] | None = None


def watch_subclasses(watcher: Callable[[type[LogitsProcessor]], None]) -> None:
    """Call ``watcher`` with every :class:`LogitsProcessor` subclass: at once with each
    one defined so far, then with each new one as it is defined (an error it raises
    fails the class statement)."""
    pending = list(LogitsProcessor.__subclasses__())
    while pending:
        cls = pending.pop(0)
        watcher(cls)
        pending.extend(cls.__subclasses__())
    _subclass_watchers.append(watcher)


def build_specs_with(builder: Callable[[dict[str, Any]], LogitsProcessor]) -> None:
    """Make :meth:`LogitsProcessor.from_spec` build processors with ``builder`` (the spec
    format's :func:`anylogits.core.specs.from_spec`)."""
    global _spec_builder
    _spec_builder = builder


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

    Processors that need speed beyond a vectorized :meth:`process` opt into the hooks of
    :class:`~anylogits.core.fast_paths.FastPaths` (docs: "Fast paths").
    """

    spec_name: ClassVar[str | None] = None
    needs_sequences: ClassVar[bool] = False
    argmax_invariant: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for watcher in _subclass_watchers:
            watcher(cls)

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
        if _spec_builder is None:
            raise RuntimeError("no spec format is installed: import anylogits.core.specs")
        processor = _spec_builder(spec)
        if not isinstance(processor, cls):
            raise ValueError(
                f"spec type {spec.get('type')!r} builds {type(processor).__qualname__}, "
                f"not {cls.__qualname__}"
            )
        return processor

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
