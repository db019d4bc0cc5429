"""llama.cpp's own samplers on one row of logits, through the low-level
``llama_sampler_init_*`` / ``llama_sampler_apply`` API, and ours on the same row.

llama-cpp-python is imported by the tests that use it (``llama_cpp_apply``, or the
``llama_cpp`` fixture), so a ``test_oracles_<module>`` file runs, and skips these, under any
interpreter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from anylogits import LogitsProcessor, Pipeline

LLAMA_VOCAB = 2_000
SEEDS = range(8)


@pytest.fixture(scope="module")
def llama_cpp() -> Any:
    """llama-cpp-python (a fixture of every conformance module: conftest.py imports it)."""
    return pytest.importorskip("llama_cpp")


def llama_cpp_apply(
    make_sampler: Callable[[Any], Any], logits: np.ndarray, history: Sequence[int] = ()
) -> np.ndarray:
    """llama.cpp's sampler (``make_sampler(llama_cpp)``), told about ``history`` with
    ``llama_sampler_accept``, on one row of candidates ``(id, logit, p=0)`` in id order;
    the candidates left afterwards, by id, with removed ones ``-inf``."""
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp_result(make_sampler(llama_cpp), logits, history)


def llama_cpp_result(sampler: Any, logits: np.ndarray, accepted: Sequence[int]) -> np.ndarray:
    """llama.cpp's ``sampler`` applied after ``llama_sampler_accept`` of ``accepted``."""
    from test_support.native_samplers import LlamaCppSampler

    return LlamaCppSampler(sampler, len(logits), accepted)(logits)


def ours(processor: LogitsProcessor, logits: torch.Tensor) -> torch.Tensor:
    """Ours on ``(B, V)`` logits after a one-token history."""
    ids = torch.zeros(logits.shape[0], 1, dtype=torch.int64)
    return Pipeline([processor])(logits.clone(), ids)


def ours_row(
    processor: LogitsProcessor, logits: np.ndarray, history: Sequence[int] = (0,)
) -> np.ndarray:
    ids = torch.tensor([list(history)], dtype=torch.int64)
    return Pipeline([processor])(torch.from_numpy(logits.copy())[None], ids)[0].numpy()


def random_row(seed: int, scale: float = 3.0) -> np.ndarray:
    """Continuous logits: no ties, no underflowing probability (llama.cpp's typical
    entropy is NaN on a zero probability)."""
    return (np.random.default_rng(seed).standard_normal(LLAMA_VOCAB) * scale).astype(np.float32)
