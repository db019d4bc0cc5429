"""llama.cpp's candidate array shrunk to the tokens the processors leave (see the package's
docstring for what it relies on)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import llama_cpp
import numpy as np
import torch

from anylogits.adapters.llama_cpp.hook import LlamaCppLogitsProcessor


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
    When more are left (a ban of a few tokens), moving them would cost several times
    what llama.cpp saves, so the logits are written back whole, ``-inf`` where removed
    (measured on the benchmarks page, "Measurements behind the code").

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
        :meth:`sampling` noted it (faster than gathering the records' strided column),
        else of the column (torch copies strided memory faster than numpy)."""
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


def use_candidate_sets(model: llama_cpp.Llama) -> None:
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
