"""transformers' continuous batching: anylogits processors inside ``generate_batch``, an
``init_continuous_batching`` manager and ``transformers serve --continuous-batching``.

transformers (5.x) builds a continuous-batching manager's processors from the generation
config only, calls ordinary ones with each row's *last input token* (no history), drops
its own history-dependent ones, and takes per-request values for temperature, top-k and
top-p only. :func:`for_continuous_batching` wires one
:class:`ContinuousBatchingHook` into a manager (or into every manager a model makes):

- rows have identities: before each step transformers hands its per-request processors
  the scheduled requests that sample a token, in row order, with their states on the host
  (request id, prompt, generated tokens, ``add_request`` keyword arguments). The hook
  keeps one slot per request id and each request's history
  (:class:`~anylogits.core.persistent_batch.PersistentBatch`), so stateful and structured
  processors run as on every engine; rows that sample nothing (chunked prefill, padding)
  are left as they are; requests join and leave between steps;
- one pipeline for every request (``*processors``) and per-request specs:
  ``manager.add_request(ids, anylogits=to_specs([...]))`` (the servers' wire format);
- the hook sits where ``generate(logits_processor=[...])`` puts a user's processors:
  after transformers' own processors, before its sampling warpers.

On an accelerator transformers replays a step from a CUDA graph (and, with async
batching, prepares step N+1 before N's tokens reach the host): neither runs Python where
the hook reads its rows, so a manager with the hook runs synchronously, graphs and
``torch.compile`` of the step off (said once in the log). On the CPU they are off anyway.

What of transformers this relies on beyond its public API, checked against the installed
version by ``conformance_tests/test_transformers_cb.py``:
``ContinuousBatchingLogitsProcessor`` (``supported_kwargs``, ``ignored_kwargs``,
``fill_defaults``, ``prepare_tensor_args``, ``__call__(scores, tensor_arg)``),
``ContinuousBatchingLogitsProcessorList`` and its constructor arguments, the manager's
``logit_processor``, ``continuous_batching_config``, ``batch_processor``, ``model``,
``generation_config`` and ``add_request``; ``FutureRequestState.state``;
``RequestState.request_id`` / ``initial_tokens`` / ``generated_tokens`` / ``status`` /
``logit_processor_kwargs`` / ``_true_initial_tokens``; ``model._get_logits_processor``.
"""

from __future__ import annotations

import functools
import logging
import re
import weakref
from typing import Any, ClassVar

import torch
import transformers
from transformers import LogitsProcessorList
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.continuous_batching.requests import RequestStatus

from anylogits.core.persistent_batch import PersistentBatch
from anylogits.core.pipeline import Pipeline
from anylogits.core.processor import LogitsProcessor
from anylogits.core.specs import around_checked
from anylogits.core.sync import host_sync_allowed
from anylogits.core.vocab import Vocabulary, hf_vocabulary
from anylogits.core.wire import SPEC_KEY, request_specs

logger = logging.getLogger("anylogits.adapters.transformers_cb")

AROUND_KEY = "anylogits_around"
"""``add_request`` keyword for what a server derives from a request's own generation config
(trusted, not a client's specs): ``{"before": specs, "after": specs}``, run before and after
the request's ``anylogits`` specs (``generate``'s order: its processors, a user's, its
sampling warpers)."""

SUPPORTED_TRANSFORMERS = ((5, 16), (6, 0))
"""transformers releases whose continuous batching the hook is written for: [low, high)."""


def _release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string (``5.24.0``, ``5.25.0.dev0``)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise RuntimeError(f"cannot read transformers' version {version!r}")
    return int(match[1]), int(match[2])


def _spelled(release: tuple[int, int]) -> str:
    return f"{release[0]}.{release[1]}" if release[1] else str(release[0])


SYNCHRONOUS = (
    "anylogits: continuous batching runs synchronously with anylogits processors (CUDA "
    "graphs, async batching and a compiled step off): a replayed step runs no Python, "
    "where the processors read their rows"
)


def check_transformers_version(
    version: str | None = None,
    supported: tuple[tuple[int, int], tuple[int, int]] = SUPPORTED_TRANSFORMERS,
    what: str = "continuous batching",
    otherwise: str = "plain generate() works with for_transformers",
) -> None:
    """Raise ``RuntimeError`` unless the installed transformers is a release ``what`` is
    written for (``supported``: [low, high); by default :data:`SUPPORTED_TRANSFORMERS`, its
    continuous batching, whose interface is young and moves)."""
    installed = version or transformers.__version__
    low, high = supported
    if not low <= _release(installed) < high:
        wanted = f"transformers>={_spelled(low)},<{_spelled(high)}"
        raise RuntimeError(
            f"anylogits runs in transformers' {what} of {wanted}; transformers "
            f"{installed} is installed: pip install '{wanted}' ({otherwise})"
        )


class _RequestHistory:
    """A request's generated tokens as transformers' request state holds them (the
    :class:`~anylogits.core.slot_requests.OutputFeed` of its slot). A request transformers
    re-prefills (offloaded, then restored) gets a new state whose prompt holds its earlier
    output: the true prompt length says where output starts. The state is held weakly:
    once transformers drops it (finished, cancelled), the hook forgets the request."""

    __slots__ = ("read_count", "state")

    def __init__(self, state: Any) -> None:
        self.state = weakref.ref(state)
        self.read_count = 0

    @staticmethod
    def prompt_length(state: Any) -> int:
        return state._true_initial_tokens or len(state.initial_tokens)

    def ended(self) -> bool:
        state = self.state()
        return state is None or state.status >= RequestStatus.FINISHED

    def read(self) -> tuple[bool, list[int]]:
        state = self.state()
        if state is None:
            return False, []
        prompt, initial = self.prompt_length(state), state.initial_tokens
        carried = len(initial) - prompt  # output moved into the prompt by a re-prefill
        total = carried + len(state.generated_tokens)
        restart = total < self.read_count
        if restart:
            self.read_count = 0
        start = self.read_count
        new = list(initial[prompt + start : len(initial)]) if start < carried else []
        new += state.generated_tokens[max(start - carried, 0) :]
        self.read_count = total
        return restart, new


class _Slot:
    __slots__ = ("feed", "slot")

    def __init__(self, slot: int, state: Any) -> None:
        self.slot = slot
        self.feed = _RequestHistory(state)


class ContinuousBatchingHook(ContinuousBatchingLogitsProcessor):
    """anylogits processors as a per-request processor of transformers' continuous batching.

    Args:
        pipeline: the processors every request runs (``None``: only per-request specs).
        vocab: the model's vocabulary (per-request specs are built for it).

    Built by :func:`for_continuous_batching`; transformers calls
    :meth:`prepare_tensor_args` on the host before each step and the hook itself inside
    the step.
    """

    supported_kwargs: ClassVar[dict[str, type]] = {SPEC_KEY: list, AROUND_KEY: dict}
    ignored_kwargs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, pipeline: Pipeline | None, vocab: Vocabulary | None) -> None:
        self.pipeline = pipeline
        self.vocab = vocab
        self._shared = PersistentBatch(vocab) if pipeline is not None else None
        self._own = PersistentBatch(vocab)
        self._slots: dict[str, _Slot] = {}
        self._next_slot = 0
        self._row_slots: list[int] = []
        self._empty = torch.empty(0, dtype=torch.int32)
        eos = sorted(vocab.eos_token_ids) if vocab is not None else []
        self._eos: int | None = eos[0] if eos else None

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        """Note which request each row is (rows are the requests that sample a token, in
        order), taking in new requests; forget finished ones. The rows' parameters stay
        on the host: transformers' argument row is left empty."""
        slots = self._slots
        row_slots = []
        for future in requests_with_new_token:
            state = future.state
            known = slots.get(state.request_id)
            if known is None or known.feed.state() is not state:
                known = self._admit(state, known)
            row_slots.append(known.slot)
        self._row_slots = row_slots
        self._forget_ended()
        return self._empty

    def _admit(self, state: Any, known: _Slot | None) -> _Slot:
        if known is not None:
            # The same request in a new state (re-prefilled): its history goes on.
            known.feed.state = weakref.ref(state)
            return known
        slot = self._next_slot
        self._next_slot += 1
        entry = self._slots[state.request_id] = _Slot(slot, state)
        prompt = state.initial_tokens[: _RequestHistory.prompt_length(state)]
        if self._shared is not None:
            self._shared.put(
                slot, None, pipeline=self.pipeline, prompt_ids=prompt, output=entry.feed
            )
        arguments = state.logit_processor_kwargs
        raw, around = arguments.get(SPEC_KEY), arguments.get(AROUND_KEY) or {}
        if raw is not None or around:
            specs, failure = None, None
            try:
                own = request_specs({SPEC_KEY: raw}) if raw is not None else None
                before, after = around.get("before", []), around.get("after", [])
                # A request's own specs are built as checked (their grammars found), the
                # pipeline keyed by their text and the config's specs around them.
                if own is None:
                    specs = [*before, *after] or None
                else:
                    specs = around_checked(before, own, after)
            except ValueError as error:  # add_request checks first; a manager may not
                failure = str(error)
            self._own.put(slot, specs, failure=failure, prompt_ids=prompt, output=entry.feed)
        return entry

    def _forget_ended(self) -> None:
        ended = [request_id for request_id, entry in self._slots.items() if entry.feed.ended()]
        for request_id in ended:
            slot = self._slots.pop(request_id).slot
            self._own.remove(slot)
            if self._shared is not None:
                self._shared.remove(slot)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        rows = scores[: len(self._row_slots)]  # the others sample nothing
        if self._shared is not None:
            self._shared.process(rows, self._row_slots)
        self._own.process(rows, self._row_slots)
        self._end_rows_left_empty(rows)
        return scores

    def _end_rows_left_empty(self, rows: torch.Tensor) -> None:
        """Rows whose processors left no token (conflicting constraints a client asked
        for) end their sequence: transformers samples the whole batch in one call, which
        raises on such a row and stops the manager for every request. Decided on the device
        (no host read); said in the log where reading is free."""
        eos = self._eos
        if eos is None or rows.shape[0] == 0:
            return
        empty = torch.amax(rows, dim=1, keepdim=True) == float("-inf")
        column = rows[:, eos : eos + 1]
        column.copy_(torch.where(empty, torch.zeros_like(column), column))
        if host_sync_allowed(rows) and bool(empty.any()):
            ended = [self._row_slots[row] for row in empty.flatten().nonzero().flatten().tolist()]
            logger.error(
                "anylogits: the processors of slot(s) %s left no token to sample; those "
                "requests are ended (end of sequence)",
                ended,
            )

    def __len__(self) -> int:
        """The requests the hook keeps a history for."""
        return len(self._slots)

    def __repr__(self) -> str:
        shared = list(self.pipeline.processors) if self.pipeline is not None else []
        return f"ContinuousBatchingHook({shared!r}, per-request specs: {SPEC_KEY}=...)"


def _checked_add_request(add_request: Any) -> Any:
    """``manager.add_request`` refusing bad specs before the request is queued (transformers
    checks only the type of ``anylogits=``, in its generation thread)."""

    @functools.wraps(add_request)
    def checked(*args: Any, **kwargs: Any) -> Any:
        raw = kwargs.get(SPEC_KEY)
        if raw is not None:
            if not isinstance(raw, list):
                raise ValueError(
                    f"{SPEC_KEY}= must be a list of processor specs (anylogits.to_specs), got "
                    f"{type(raw).__name__}"
                )
            request_specs({SPEC_KEY: raw})  # bounded, and every spec built: raises naming it
        return add_request(*args, **kwargs)

    checked.anylogits_checked = True  # type: ignore[attr-defined]
    return checked


def attach(manager: Any, pipeline: Pipeline | None, vocab: Vocabulary | None) -> Any:
    """Wire a :class:`ContinuousBatchingHook` into ``manager`` (not started yet) and return
    the hook; a manager that has one already keeps it."""
    existing = getattr(manager, "anylogits_hook", None)
    if existing is not None:
        return existing
    if manager.batch_processor is not None:
        raise ValueError(
            "for_continuous_batching: this manager has started (or warmed up) already: wire "
            "the processors in before manager.start() / warmup(), or pass the model"
        )
    hook = ContinuousBatchingHook(pipeline, vocab)
    # Where generate(logits_processor=[...]) puts a user's processors: after transformers'
    # own, before the sampling warpers.
    processors = manager.model._get_logits_processor(
        manager.generation_config, logits_processor=LogitsProcessorList([hook])
    )
    per_request = manager.continuous_batching_config.per_request_processors
    listed = ContinuousBatchingLogitsProcessorList(
        processors,
        per_request_processors=per_request,
        drop_unsupported_processors=manager.continuous_batching_config.drop_unsupported_processors,
    )
    # One argument row per per-request processor; transformers counts only the ones it
    # converted itself.
    listed.tensors_required = sum(
        isinstance(p, ContinuousBatchingLogitsProcessor) for p in listed.logits_processor
    )
    manager.logit_processor = listed
    config = manager.continuous_batching_config
    if any(config.cuda_graph_booleans) or config.use_async_batching:
        logger.info(SYNCHRONOUS)
    config.use_cuda_graph = (False, False)
    config.use_async_batching = False
    config.varlen_compile_config = None
    config.decode_compile_config = None
    if not getattr(manager.add_request, "anylogits_checked", False):
        manager.add_request = _checked_add_request(manager.add_request)
    manager.anylogits_hook = hook
    return hook


def _install_on_model(model: Any, pipeline: Pipeline | None, vocab: Vocabulary | None) -> None:
    """Every manager ``model`` makes from now on (``init_continuous_batching``, which
    ``generate_batch`` and ``transformers serve`` call) gets the hook."""
    if getattr(model, "anylogits_pipeline", None) is not None:
        raise ValueError(
            "for_continuous_batching: this model runs anylogits processors in continuous "
            "batching already; remove_continuous_batching(model) first"
        )
    init = type(model).init_continuous_batching

    @functools.wraps(init)
    def init_continuous_batching(*args: Any, **kwargs: Any) -> Any:
        manager = init(model, *args, **kwargs)
        attach(manager, pipeline, vocab)
        return manager

    model.init_continuous_batching = init_continuous_batching
    model.anylogits_pipeline = pipeline


def remove_continuous_batching(model: Any) -> None:
    """Undo :func:`for_continuous_batching` on ``model``: its next managers run without
    anylogits (one it cached, ``persistent_manager=True``, keeps its hook)."""
    model.__dict__.pop("init_continuous_batching", None)
    model.__dict__.pop("anylogits_pipeline", None)


def _vocabulary(target: Any, tokenizer: Any) -> Vocabulary | None:
    """The tokenizer's vocabulary, its end-of-sequence ids joined by the generation
    config's (transformers stops on those too; Llama 3 has several)."""
    if tokenizer is None:
        return None
    model = getattr(target, "model", target)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    extra = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None:
        extra.append(tokenizer.eos_token_id)
    ids = sorted({token for token in extra if token >= 0})
    return hf_vocabulary(tokenizer, eos_token_ids=ids) if ids else hf_vocabulary(tokenizer)


def for_continuous_batching(
    target: Any, *processors: LogitsProcessor | Pipeline, tokenizer: Any = None
) -> ContinuousBatchingHook | None:
    """Run anylogits processors inside transformers' continuous batching.

    Args:
        target: a model (every continuous-batching manager it makes from now on runs the
            processors: ``model.generate_batch``, ``model.init_continuous_batching``,
            ``transformers serve --continuous-batching``) or one manager from
            ``init_continuous_batching`` that has not started.
        *processors: processors every request runs, in order (none: only the specs each
            request names with ``add_request(..., anylogits=to_specs([...]))``).
        tokenizer: the model's tokenizer: per-request specs and processors that use the
            vocabulary are built for it.

    Returns the manager's :class:`ContinuousBatchingHook`; ``None`` for a model.

    Example::

        from anylogits import NoRepeatNGram, TopK, for_continuous_batching, to_specs

        for_continuous_batching(model, NoRepeatNGram(3), tokenizer=tokenizer)
        outputs = model.generate_batch(prompts, generation_config=config)

        manager = model.init_continuous_batching(generation_config=config)
        manager.start()
        manager.add_request(ids, max_new_tokens=32, anylogits=to_specs([TopK(5)]))
    """
    check_transformers_version()
    vocab = _vocabulary(target, tokenizer)
    pipeline = Pipeline(processors, vocab) if processors else None
    if hasattr(target, "add_request") and hasattr(target, "logit_processor"):
        return attach(target, pipeline, vocab)
    if not hasattr(type(target), "init_continuous_batching"):
        raise ValueError(
            f"for_continuous_batching takes a transformers model or its continuous-batching "
            f"manager, got {type(target).__qualname__}"
        )
    _install_on_model(target, pipeline, vocab)
    return None
