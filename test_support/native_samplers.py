"""Backends' own sampling code, callable on plain arrays: the oracles of the conformance
suite and the peers of the benchmarks. Each backend library is imported on first use."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np


class LlamaCppSampler:
    """One of llama.cpp's own samplers applied to a row of logits, as its sampler chain
    applies it (``llama_sampler_apply`` on ``(id, logit, p)`` candidates in id order).

    Args:
        sampler: a ``llama_sampler_init_*`` result; freed with this object.
        vocab: number of candidates.
        history: tokens to ``llama_sampler_accept`` first (penalties keep their own
            window of accepted tokens).
    """

    def __init__(self, sampler: Any, vocab: int, history: Sequence[int] = ()) -> None:
        import llama_cpp

        self._llama_cpp = llama_cpp
        self.sampler = sampler
        for token in history:
            llama_cpp.llama_sampler_accept(sampler, int(token))
        self._data = (llama_cpp.llama_token_data * vocab)()
        self.records = np.ctypeslib.as_array(self._data)
        self._ids = np.arange(vocab, dtype=np.int32)
        self._pointer = ctypes.cast(self._data, llama_cpp.llama_token_data_p)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """The candidates' logits afterwards, in id order; removed candidates are -inf."""
        records = self.records
        records["id"] = self._ids
        records["logit"] = logits
        records["p"] = 0.0
        candidates = self._llama_cpp.llama_token_data_array(
            data=self._pointer, size=len(records), selected=-1, sorted=False
        )
        self._llama_cpp.llama_sampler_apply(self.sampler, ctypes.byref(candidates))
        # Read from where ``candidates.data`` points now: XTC drops the top candidates by
        # advancing that pointer rather than moving the records.
        data_address = ctypes.cast(candidates.data, ctypes.c_void_p).value
        assert data_address is not None  # llama_sampler_apply never empties the array
        moved = data_address - ctypes.addressof(self._data)
        start = moved // ctypes.sizeof(self._llama_cpp.llama_token_data)
        kept = records[start : start + candidates.size]
        out = np.full(len(records), -np.inf, dtype=np.float32)
        out[kept["id"]] = kept["logit"]
        return out

    def __del__(self) -> None:
        sampler, self.sampler = getattr(self, "sampler", None), None
        if sampler is not None:
            self._llama_cpp.llama_sampler_free(sampler)
