"""The llama-cpp-python hook: a ``LogitsProcessorList`` entry that runs a pipeline, forces
end-of-sequence when it fails, and has the model's ``generate`` re-raise the failure
(see the package's docstring for what it relies on)."""

from __future__ import annotations

import functools
from collections.abc import Generator
from typing import Any

import llama_cpp
import numpy as np
import torch

from anylogits.adapters._hook import PipelineHook
from anylogits.core.arrays import from_torch, to_torch
from anylogits.core.fast_paths import Candidates
from anylogits.core.pipeline import Pipeline


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


def guard_generate(model: llama_cpp.Llama) -> HookFailures:
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
