"""llama.cpp (llama-cpp-python): a ``LogitsProcessorList`` entry for every completion API.

llama-cpp-python calls the hook from inside llama.cpp's sampler chain (a ctypes
callback) as ``scores[:] = hook(input_ids, scores)``: ``input_ids`` is the 1-D int32
history (prompt included, a slice of a buffer it reuses), ``scores`` a 1-D float32
strided view into llama.cpp's candidate records. Edits in place reach llama.cpp.

Two failure modes of that callback are closed here: an exception raised inside it is
printed and swallowed (generation would go on with unprocessed logits), and a ``None``
result turns every logit into NaN. A failing hook therefore forces end-of-sequence, and
the model's ``generate`` (which ``create_completion``, ``__call__`` and
``create_chat_completion`` all run through) re-raises the original exception.

That callback is the first sampler of llama.cpp's chain, and edited logits alone would
leave llama.cpp normalizing and drawing over every token of the vocabulary, the ones our
processors set to ``-inf`` included. When a ``logits_processor`` list holds our hook, the
callback therefore also tells llama.cpp which candidates are left (see
:class:`CandidateSetSampler`), as its own truncating samplers do; the list's processors
then get a contiguous copy of the logits (of llama.cpp's logits row, which the
candidates repeat in token order) instead of the strided view.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Callable, Generator
from typing import Any

import llama_cpp
import numpy as np
import torch

from anylogits.adapters._hook import PipelineHook
from anylogits.core.arrays import from_torch, to_torch
from anylogits.core.pipeline import Pipeline
from anylogits.core.processor import Candidates, LogitsProcessor
from anylogits.core.vocab import Vocabulary


class HookFailures:
    """The first processor error of the running generation of one model."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def record(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error

    def raise_if_any(self) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error


class LlamaCppLogitsProcessor(PipelineHook):
    """The llama-cpp-python hook around an anylogits :class:`~anylogits.Pipeline`.

    Args:
        pipeline: the processors to run.
        eos_token_id: forced when a processor fails, so generation stops.
        failures: where a failure is recorded for the model's ``generate`` to re-raise.
    """

    def __init__(self, pipeline: Pipeline, eos_token_id: int, failures: HookFailures) -> None:
        super().__init__(pipeline)
        self.eos_token_id = eos_token_id
        self.failures = failures

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        try:
            converted = to_torch(scores)
            result = self.pipeline(converted.tensor, _history(input_ids))
            return from_torch(result, converted, in_place=True)
        except BaseException as error:
            return self._stop(error, scores)

    def compact(self, input_ids: np.ndarray, scores: torch.Tensor) -> Candidates | None:
        """Process ``scores`` (1-D float32, contiguous, ours to edit); when the pipeline
        ends on a truncation's candidates they are returned and ``scores`` are not written
        (see :meth:`~anylogits.Pipeline.compact`), otherwise ``scores`` hold the result."""
        try:
            result = self.pipeline.compact(scores[None], _history(input_ids))
            if isinstance(result, Candidates):
                return result
            if result.data_ptr() != scores.data_ptr():
                scores.copy_(result[0])
        except BaseException as error:
            self._stop(error, scores.numpy())
        return None

    def _stop(self, error: BaseException, scores: np.ndarray) -> np.ndarray:
        # Raising here would be swallowed by the ctypes callback and generation would
        # go on unconstrained: stop it instead and let generate() re-raise.
        self.failures.record(error)
        scores[:] = -np.inf
        scores[self.eos_token_id] = 0.0
        return scores


def _history(input_ids: np.ndarray) -> torch.Tensor:
    # int32 -> int64 copies, which also detaches us from llama's reused buffer.
    return torch.from_numpy(np.asarray(input_ids, dtype=np.int64))[None]


class AnyLogitsProcessorList(llama_cpp.LogitsProcessorList):
    """The list ``for_llama_cpp`` returns.

    ``extend`` returns a new list and leaves this one unchanged. llama-cpp-python 0.3.x
    runs ``logits_processor = logits_processor.extend(bias_list)`` when ``logit_bias`` is
    given; with ``list.extend`` (which returns ``None``) that silently dropped every
    processor, and it would also append a bias to this list on every call.
    """

    def extend(self, processors: Any) -> AnyLogitsProcessorList:  # type: ignore[override]
        return AnyLogitsProcessorList([*self, *processors])


def for_llama_cpp(
    *processors: LogitsProcessor | Pipeline, model: llama_cpp.Llama
) -> AnyLogitsProcessorList:
    """A ``llama_cpp.LogitsProcessorList`` that runs ``processors`` in order.

    Args:
        *processors: anylogits processors (or pipelines), applied in the order given.
        model: the ``llama_cpp.Llama`` that will generate; its own vocabulary is used,
            and its ``generate`` is wrapped (once) so that a processor error stops the
            generation and is raised to the caller instead of being swallowed. Its
            ``_init_sampler`` is wrapped (once) too, so that llama.cpp samples only from
            the candidates the processors leave (:class:`CandidateSetSampler`).

    Example::

        from llama_cpp import Llama
        from anylogits import NoRepeatNGram, RepetitionPenalty, for_llama_cpp

        llm = Llama(model_path="model.gguf")
        hook = for_llama_cpp(RepetitionPenalty(1.3), NoRepeatNGram(3), model=llm)
        llm.create_completion("Once upon a time", logits_processor=hook, max_tokens=32)
    """
    if not processors:
        raise ValueError("for_llama_cpp needs at least one processor")
    if not isinstance(model, llama_cpp.Llama):
        raise ValueError(
            f"model must be a llama_cpp.Llama, got {type(model).__qualname__}; pass "
            "model=Llama(model_path=...)"
        )
    vocab = vocabulary_of(model)
    hook = LlamaCppLogitsProcessor(Pipeline(processors, vocab), model.token_eos(), _guard(model))
    _shrink_candidates(model)
    return AnyLogitsProcessorList([hook])


class CandidateSetSampler:
    """The callback of the custom sampler llama-cpp-python builds for a ``logits_processor``
    list, with llama.cpp's candidate array shrunk to the tokens the processors left.

    It runs the list as llama-cpp-python does (each processor gets the history and the
    logits, and returns the new logits), on a contiguous copy of the logits: of the row
    llama.cpp built the candidates from, when the chain's ``sample`` named it (see
    :meth:`sampling`), else of the records' logit column. When
    the processors leave at most one token in :data:`SHRINK_BELOW`, it moves the
    candidates whose logit is not ``-inf`` to the front of llama.cpp's array, in their
    order, and sets its ``size``; llama.cpp's samplers then work on those few candidates.
    A removed candidate had probability zero in every sampler after ours (penalties,
    grammar, truncations, temperature, ``dist``, greedy), and the kept ones keep their
    order, so the sampled token is the one the full array gives under the same seed.
    When more are left (a ban of a few tokens), moving them would cost more than
    llama.cpp saves (~3 ms against ~0.4 ms at 128k), so the logits are written back
    whole, ``-inf`` where removed.

    When our hook is the list's only processor and its pipeline ends on a truncation's
    candidates (:meth:`~anylogits.Pipeline.compact`), the array is built from those
    directly: no full row written, none scanned for the tokens left.

    Args:
        model: the model whose history (``_input_ids``) the processors are given.
        processors: the ``logits_processor`` list.
    """

    def __init__(self, model: llama_cpp.Llama, processors: list[Any]) -> None:
        self.model = model
        self.processors = processors
        self._logits_row: tuple[Any, int] | None = None

    def sampling(self, sample: Callable[..., int]) -> Callable[..., int]:
        """``LlamaSampler.sample`` noting the context and row llama.cpp reads the logits
        from: our sampler is the first of the chain, so its candidates are that row's
        logits in token order, and the row is contiguous."""

        @functools.wraps(sample)
        def sample_noting_the_row(ctx: Any, idx: int = -1) -> int:
            self._logits_row = (ctx.ctx, idx)
            try:
                return sample(ctx, idx)
            finally:
                self._logits_row = None

        return sample_noting_the_row

    def __call__(self, candidates_pointer: Any) -> None:
        candidates = candidates_pointer.contents
        records = _candidate_records(candidates)
        # The processors run on a contiguous copy (only the kept candidates need writing
        # back).
        scores = self._logits(records)
        input_ids = self.model._input_ids
        if len(self.processors) == 1 and isinstance(self.processors[0], LlamaCppLogitsProcessor):
            # Ours alone: a pipeline ending on candidates hands them over, unwritten.
            kept = self.processors[0].compact(input_ids, scores)
            if kept is not None:
                # At most K candidates: numpy's calls cost less than torch's on so few.
                values, columns = kept.values.numpy()[0], kept.columns.numpy()[0]
                finite = values != -np.inf
                if kept.descending:  # the finite values come first
                    count = np.count_nonzero(finite)
                    values, columns = values[:count], columns[:count]
                else:
                    values, columns = values[finite], columns[finite]
                order = columns.argsort()
                _hand_over(candidates, records, columns[order], values[order])
                return
        else:
            logits = scores.numpy()
            for processor in self.processors:
                logits[:] = processor(input_ids, logits)
        finite = scores != float("-inf")
        if not 0 < int(finite.sum()) <= len(scores) // SHRINK_BELOW:
            torch.from_numpy(records["logit"]).copy_(scores)
            return
        positions = finite.nonzero().squeeze(1)
        _hand_over(candidates, records, positions.numpy(), scores[positions].numpy())

    def _logits(self, records: np.ndarray) -> torch.Tensor:
        """A contiguous copy of the candidates' logits: of llama.cpp's logits row when
        :meth:`sampling` noted it (~4x faster than gathering the records' strided
        column), else of the column (torch copies strided memory ~2x faster than numpy)."""
        if self._logits_row is not None:
            pointer = llama_cpp.llama_get_logits_ith(*self._logits_row)
            if pointer:
                row = (ctypes.c_float * len(records)).from_address(
                    ctypes.addressof(pointer.contents)
                )
                return torch.frombuffer(row, dtype=torch.float32).clone()
        column = torch.from_numpy(records["logit"])
        return column.clone(memory_format=torch.contiguous_format)


# llama.cpp's array is shrunk when at most one token in this many is left.
SHRINK_BELOW = 8


def _hand_over(
    candidates: Any, records: np.ndarray, positions: np.ndarray, values: np.ndarray
) -> None:
    """llama.cpp's array with ``values`` at token ids ``positions`` (ascending) and no other
    candidate: shrunk to them (moved to the front) when they are few, else every logit
    written, ``-inf`` elsewhere."""
    count = len(positions)
    if count == 0 or count > len(records) // SHRINK_BELOW:
        column = records["logit"]
        column[:] = -np.inf
        column[positions] = values
        return
    # The records as (id, logit, p) int32 rows: moved ~5x faster than structured records.
    table = records.view(np.int32).reshape(len(records), 3)
    front = table.take(positions, axis=0)
    front[:, 1] = values.astype(np.float32, copy=False).view(np.int32)
    table[:count] = front
    candidates.size = count


_CANDIDATE_RECORD = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


def _candidate_records(candidates: Any) -> np.ndarray:
    """llama.cpp's ``llama_token_data`` records, ``(id, logit, p)``, as a numpy view."""
    size = candidates.size
    address = ctypes.addressof(candidates.data.contents)
    buffer = (ctypes.c_char * (size * _CANDIDATE_RECORD.itemsize)).from_address(address)
    return np.frombuffer(buffer, dtype=_CANDIDATE_RECORD)


def _shrink_candidates(model: llama_cpp.Llama) -> None:
    """Wrap ``model._init_sampler`` once: a sampler chain built for a ``logits_processor``
    list that holds our hook runs it through :class:`CandidateSetSampler`."""
    if model.__dict__.get("_anylogits_candidate_sets"):
        return
    original = model._init_sampler

    @functools.wraps(original)
    def init_sampler(*args: Any, **kwargs: Any) -> Any:
        sampler = original(*args, **kwargs)
        processors = kwargs.get("logits_processor")
        if processors is not None and any(
            isinstance(processor, LlamaCppLogitsProcessor) for processor in processors
        ):
            # llama-cpp-python adds the list's custom sampler first in the chain; its C
            # callback calls the `apply_func` attribute, looked up on every call.
            position, custom = sampler.custom_samplers[0]
            if position == 0:
                candidate_sets = CandidateSetSampler(model, processors)
                custom.apply_func = candidate_sets
                sampler.sample = candidate_sets.sampling(sampler.sample)
        return sampler

    model._init_sampler = init_sampler  # type: ignore[method-assign]
    model._anylogits_candidate_sets = True  # type: ignore[attr-defined]


def _guard(model: llama_cpp.Llama) -> HookFailures:
    """Wrap ``model.generate`` once so that recorded processor errors are re-raised."""
    failures = model.__dict__.get("_anylogits_failures")
    if failures is not None:
        return failures
    failures = HookFailures()
    original = model.generate

    @functools.wraps(original)
    def generate(*args: Any, **kwargs: Any) -> Generator[int, Any, None]:
        failures.error = None  # an error already raised belongs to an earlier call
        return _checked(original(*args, **kwargs), failures)

    model.generate = generate  # type: ignore[method-assign]
    model._anylogits_failures = failures  # type: ignore[attr-defined]
    return failures


def _checked(
    tokens: Generator[int, Any, None], failures: HookFailures
) -> Generator[int, Any, None]:
    """Pass tokens (and ``send`` values) through; raise a recorded processor error."""
    sent = None
    while True:
        try:
            token = tokens.send(sent)
        except StopIteration:
            failures.raise_if_any()
            return
        if failures.error is not None:
            tokens.close()
            failures.raise_if_any()
        sent = yield token


_VOCABULARIES: weakref.WeakKeyDictionary[Any, Vocabulary] = weakref.WeakKeyDictionary()


def vocabulary_of(model: llama_cpp.Llama) -> Vocabulary:
    """The model's own vocabulary, read through llama.cpp (``llama_token_to_piece``).

    End-of-sequence ids are every end-of-generation token (``llama_vocab_is_eog``:
    e.g. Llama 3's ``<|end_of_text|>``, ``<|eot_id|>``, ``<|eom_id|>``), since llama.cpp
    stops on any of them; a Hugging Face tokenizer usually names only one.
    """
    cached = _VOCABULARIES.get(model)
    if cached is not None:
        return cached
    handle = model._model.vocab
    size = model.n_vocab()
    buffer = ctypes.create_string_buffer(256)
    tokens: list[bytes] = []
    eos: set[int] = set()
    special: set[int] = set()
    for token_id in range(size):
        length = llama_cpp.llama_token_to_piece(handle, token_id, buffer, len(buffer), 0, True)
        if length < 0:
            buffer = ctypes.create_string_buffer(-length)
            length = llama_cpp.llama_token_to_piece(handle, token_id, buffer, -length, 0, True)
        tokens.append(buffer.raw[:length])
        if llama_cpp.llama_vocab_is_eog(handle, token_id):
            eos.add(token_id)
        if llama_cpp.llama_vocab_is_control(handle, token_id):
            special.add(token_id)
    bos = model.token_bos()
    model_ref = weakref.ref(model)

    def encode(text: str) -> list[int]:
        live = model_ref()
        if live is None:
            raise RuntimeError("the llama.cpp model this vocabulary came from no longer exists")
        return list(live.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    vocab = Vocabulary(
        tokens=tuple(tokens),
        eos_token_ids=frozenset(eos),
        special_token_ids=frozenset(special),
        bos_token_id=bos if bos >= 0 else None,
        encode=encode,
    )
    _VOCABULARIES[model] = vocab
    return vocab
