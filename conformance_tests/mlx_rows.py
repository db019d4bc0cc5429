"""mlx-lm's own logits processors and sampling filters on rows of logits, and ours on the
same rows. mlx and mlx-lm are imported by the tests that use them (``mlx_modules``), so a
``test_oracles_<module>`` file runs, and skips these, under any interpreter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from anylogits import LogitsProcessor, Pipeline

MLX_VOCAB = 2_000


def mlx_modules() -> tuple[Any, Any]:
    """``mlx.core`` and ``mlx_lm.sample_utils``."""
    return pytest.importorskip("mlx.core"), pytest.importorskip("mlx_lm.sample_utils")


def mlx_row(seed: int, vocab: int = MLX_VOCAB) -> np.ndarray:
    """``(1, vocab)`` float32 logits, continuous (no ties)."""
    return (np.random.default_rng(seed).standard_normal((1, vocab)) * 3).astype(np.float32)


def ours_after(processor: LogitsProcessor, logits: np.ndarray, history: list[int]) -> np.ndarray:
    """Ours on ``(1, V)`` logits after ``history``."""
    result = Pipeline([processor])(torch.from_numpy(logits.copy()), torch.tensor([history]))
    return result.numpy()


def assert_matches_mlx_processor(
    processor: LogitsProcessor, seed: int, history: list[int], **settings: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Ours against mlx-lm's own processor, ``make_logits_processors(**settings)``
    (settings that make exactly one), on ``mlx_row(seed)`` after ``history``, within
    float32 rounding; returns the logits and mlx-lm's result."""
    mx, sample_utils = mlx_modules()
    logits = mlx_row(seed)
    (native,) = sample_utils.make_logits_processors(**settings)
    expected = np.array(native(mx.array(history), mx.array(logits)))
    np.testing.assert_allclose(ours_after(processor, logits, history), expected, rtol=1e-6)
    return logits, expected


def mlx_logprobs(logits: np.ndarray) -> Any:
    """What mlx-lm's samplers take: log-probabilities, as an ``mx.array``."""
    mx, _ = mlx_modules()
    native = mx.array(logits)
    return native - mx.logsumexp(native, axis=-1, keepdims=True)


def kept_ids(masked: np.ndarray) -> set[int]:
    """The ids left finite in row 0."""
    return set(np.flatnonzero(np.isfinite(masked[0])).tolist())
