"""Level 2 on llama.cpp: each processor against llama.cpp's own sampler on identical
logits, through the low-level ``llama_sampler_init_*`` / ``llama_sampler_apply`` API.

Semantic differences found, each tested in the configuration where the two agree and
pinned where they do not:
- top-k: llama.cpp keeps exactly k candidates (ties cut arbitrarily); ours keeps every
  token tied with the k-th, like transformers. Compared on tie-free logits.
- repetition penalty: llama.cpp penalizes only the last ``penalty_last_n`` tokens it was
  told about with ``llama_sampler_accept``, and llama-cpp-python accepts only generated
  tokens, never the prompt; ours counts the prompt too (transformers' semantics), the
  whole history by default and the last ``context_size`` tokens with it. Equal when
  every history token is accepted and ``context_size == penalty_last_n``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")

from anylogits import (  # noqa: E402
    LogitBias,
    LogitsProcessor,
    MinP,
    Pipeline,
    RepetitionPenalty,
    Temperature,
    TopK,
    TopP,
)
from test_support.native_samplers import LlamaCppSampler  # noqa: E402

pytestmark = pytest.mark.only_backend("llama_cpp")

VOCAB = 2_000


def native(
    make_sampler: Callable[[], Any], logits: np.ndarray, history: Sequence[int] = ()
) -> np.ndarray:
    """llama.cpp's sampler applied to ``logits``: removed candidates come back -inf."""
    return LlamaCppSampler(make_sampler(), len(logits), history)(logits)


def ours(
    processor: LogitsProcessor, logits: np.ndarray, history: Sequence[int] = (0,)
) -> np.ndarray:
    ids = torch.tensor([list(history)], dtype=torch.int64)
    return Pipeline([processor])(torch.from_numpy(logits.copy())[None], ids)[0].numpy()


def random_logits(seed: int, scale: float = 3.0) -> np.ndarray:
    generator = np.random.default_rng(seed)
    return (generator.standard_normal(VOCAB) * scale).astype(np.float32)


SEEDS = range(8)


# Truncation samplers: (ours, llama.cpp's sampler, parameter values, how many tokens the
# native one keeps: exactly k for top-k, else fewer than the vocabulary, so the test can fail).
TRUNCATIONS: dict[str, tuple[Any, Callable[[Any], Any], list[Any], Callable[[int, Any], bool]]] = {
    "top_k": (
        TopK,
        lambda k: llama_cpp.llama_sampler_init_top_k(k),
        [1, 5, 40, 1_000],
        lambda kept, k: kept == k,  # continuous logits: no ties at the k-th
    ),
    "top_p": (
        TopP,
        lambda p: llama_cpp.llama_sampler_init_top_p(p, 1),
        [0.1, 0.5, 0.9, 0.95],
        lambda kept, p: kept < VOCAB,
    ),
    "min_p": (
        MinP,
        lambda p: llama_cpp.llama_sampler_init_min_p(p, 1),
        [0.01, 0.05, 0.2, 0.5],
        lambda kept, p: kept < VOCAB,
    ),
}


@pytest.mark.support("oracle", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, (_, _, values, _) in TRUNCATIONS.items() for value in values],
)
def test_truncation_matches(name: str, value: Any, seed: int) -> None:
    processor, sampler, _, kept_as_expected = TRUNCATIONS[name]
    logits = random_logits(seed)
    expected = native(lambda: sampler(value), logits)
    assert kept_as_expected(np.isfinite(expected).sum(), value)
    np.testing.assert_array_equal(ours(processor(value), logits), expected)


@pytest.mark.support("oracle", processor="temperature", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("t", [0.3, 0.7, 1.5])
def test_temperature_matches(seed: int, t: float) -> None:
    logits = random_logits(seed)
    expected = native(lambda: llama_cpp.llama_sampler_init_temp(t), logits)
    np.testing.assert_allclose(ours(Temperature(t), logits), expected, rtol=1e-6)


def _logit_bias_sampler(bias: dict[int, float]) -> Any:
    entries = (llama_cpp.llama_logit_bias * len(bias))(
        *(llama_cpp.llama_logit_bias(token=token, bias=value) for token, value in bias.items())
    )
    return llama_cpp.llama_sampler_init_logit_bias(VOCAB, len(bias), entries)  # copies them


@pytest.mark.support("oracle", processor="logit_bias", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
def test_logit_bias_matches(seed: int) -> None:
    logits = random_logits(seed)
    logits[11] = -np.inf  # a removed token stays removed under any bias
    bias = {3: 2.5, 11: 7.0, 77: -4.0, VOCAB - 1: 0.125}
    expected = native(lambda: _logit_bias_sampler(bias), logits)
    assert not np.array_equal(expected, logits)
    np.testing.assert_array_equal(ours(LogitBias(bias), logits), expected)


def _history(seed: int, length: int) -> list[int]:
    generator = np.random.default_rng(seed + 100)
    return generator.integers(0, 50, length).tolist()  # few ids: they repeat


@pytest.mark.support("oracle", processor="repetition_penalty", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_matches_when_the_window_covers_the_history(
    seed: int, penalty: float
) -> None:
    logits = random_logits(seed)
    logits[:50:7] = 0.0  # llama.cpp tests `<= 0`, transformers `< 0`: same at zero
    history = _history(seed, 40)
    expected = native(
        lambda: llama_cpp.llama_sampler_init_penalties(VOCAB, len(history), penalty, 0.0, 0.0),
        logits,
        history,
    )
    assert not np.array_equal(expected, logits)
    np.testing.assert_allclose(
        ours(RepetitionPenalty(penalty), logits, history), expected, rtol=1e-6
    )


@pytest.mark.support("oracle", processor="repetition_penalty", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("last_n", [1, 5, 17])
def test_repetition_penalty_context_size_matches_penalty_last_n(seed: int, last_n: int) -> None:
    logits = random_logits(seed)
    logits[:50:7] = 0.0
    history = _history(seed, 40)
    expected = native(
        lambda: llama_cpp.llama_sampler_init_penalties(VOCAB, last_n, 1.5, 0.0, 0.0),
        logits,
        history,
    )
    whole = ours(RepetitionPenalty(1.5), logits, history)
    assert not np.array_equal(expected, whole), "the window made no difference"
    np.testing.assert_allclose(
        ours(RepetitionPenalty(1.5, context_size=last_n), logits, history), expected, rtol=1e-6
    )
