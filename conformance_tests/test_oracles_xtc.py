"""anylogits.processors.xtc against its native oracles, on identical rows:

* llama.cpp's ``xtc`` sampler through llama-cpp-python's ctypes API
  (``llama_sampler_init_xtc`` + ``llama_sampler_apply`` on one float32 row, with
  probability 1.0, so its coin always says "act");
* mlx-lm's ``sample_utils.apply_xtc`` (probability 1.0) on the same rows as ``mx.array``.

Semantic differences, pinned by the ``test_known_difference_*`` tests: llama.cpp keeps
exactly one of several tokens tied as the least likely one above the threshold (by sort
order); mlx-lm and ours keep them all. mlx-lm removes only ``p > threshold``; llama.cpp,
koboldcpp, text-generation-webui and ours ``p >=``. mlx-lm's ``xtc_special_tokens`` (its
CLI passes newline + EOS) are never removed, like our ``protected_token_ids``; llama.cpp
has none; text-generation-webui skips the whole step instead. The coins: llama.cpp one
mt19937 per sampler (per sequence), mlx-lm and text-generation-webui one draw per call for
the whole batch, ours a hash of (seed, the sequence's tokens).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anylogits.processors.xtc import XTC
from conformance_tests.llama_cpp_rows import (
    LLAMA_VOCAB,
    SEEDS,
    llama_cpp_apply,
    ours,
    ours_row,
    random_row,
)


def peaked_row(seed: int) -> np.ndarray:
    """A random row whose five top tokens share most of the mass, so XTC has 2+ tokens
    above usual thresholds."""
    generator = np.random.default_rng(seed)
    row = random_row(seed)
    row[generator.choice(LLAMA_VOCAB, 5, replace=False)] = generator.uniform(8, 12, 5)
    return row


# --------------------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------------------


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.support("oracle", processor="xtc", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.2, 0.5])
def test_xtc_matches_llama_cpp(seed: int, threshold: float) -> None:
    logits = peaked_row(seed)
    expected = llama_cpp_apply(lambda lib: lib.llama_sampler_init_xtc(1.0, threshold, 1, 7), logits)
    np.testing.assert_array_equal(ours_row(XTC(threshold, 1.0), logits), expected)


@pytest.mark.only_backend("llama_cpp")
def test_xtc_llama_cpp_cases_do_remove_tokens() -> None:
    """Most of the rows above do lose tokens, so the agreement is not vacuous."""
    removing = [
        not np.array_equal(
            llama_cpp_apply(lambda lib, t=t: lib.llama_sampler_init_xtc(1.0, t, 1, 7), row), row
        )
        for row in (peaked_row(seed) for seed in SEEDS)
        for t in (0.05, 0.1)
    ]
    assert sum(removing) >= 0.75 * len(removing)


def _tied_row() -> np.ndarray:
    """Probabilities 0.5, 0.125, 0.125, then 0.25 spread over the rest (exact in float32)."""
    row = np.full(LLAMA_VOCAB, np.log(0.25 / (LLAMA_VOCAB - 3)), dtype=np.float64)
    row[:3] = np.log([0.5, 0.125, 0.125])
    return row.astype(np.float32)


@pytest.mark.only_backend("llama_cpp")
def test_known_difference_xtc_ties_llama_cpp_keeps_one() -> None:
    """Tokens 1 and 2 tie as the least likely above the threshold: llama.cpp keeps one of
    them (by its sort order), ours keeps both. Both remove token 0."""
    logits = _tied_row()
    expected = llama_cpp_apply(lambda lib: lib.llama_sampler_init_xtc(1.0, 0.1, 1, 7), logits)
    got = ours_row(XTC(0.1, 1.0), logits)
    assert np.isneginf(expected[0]) and np.isneginf(got[0])
    assert np.isfinite(expected[1:3]).sum() == 1
    assert np.isfinite(got[1:3]).all()
    np.testing.assert_array_equal(got[3:], expected[3:])


# --------------------------------------------------------------------------------------
# mlx-lm
# --------------------------------------------------------------------------------------


def mlx_xtc(logits: np.ndarray, threshold: float, special: list[int]) -> np.ndarray:
    mx = pytest.importorskip("mlx.core")
    sample_utils = pytest.importorskip("mlx_lm.sample_utils")
    return np.array(sample_utils.apply_xtc(mx.array(logits), 1.0, threshold, special))


@pytest.mark.only_backend("mlx")
@pytest.mark.support("oracle", processor="xtc", backend="mlx")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.2, 0.5])
@pytest.mark.parametrize("protect", [False, True], ids=["plain", "protected"])
def test_xtc_matches_mlx_lm(seed: int, threshold: float, protect: bool) -> None:
    rows = np.stack([peaked_row(seed * 4 + i) for i in range(4)])  # one coin for all rows
    # mlx-lm's CLI protects newline and EOS; here the likeliest token of row 0 and two
    # arbitrary ids, so protection visibly changes something.
    special = [int(rows[0].argmax()), 3, 11] if protect else []
    expected = mlx_xtc(rows, threshold, special)
    got = ours(XTC(threshold, 1.0, protected_token_ids=special), torch.from_numpy(rows)).numpy()
    np.testing.assert_array_equal(got, expected)


@pytest.mark.only_backend("mlx")
def test_xtc_mlx_cases_do_remove_tokens() -> None:
    rows = np.stack([peaked_row(seed) for seed in SEEDS])
    assert (np.isneginf(mlx_xtc(rows, 0.1, [])).sum(-1) > 0).mean() >= 0.75


@pytest.mark.only_backend("mlx")
def test_known_difference_xtc_mlx_lm_needs_more_than_threshold() -> None:
    """Probabilities exactly 0.5, 0.25, 0.25 and threshold 0.25: ours (like llama.cpp)
    counts the 0.25 tokens as reaching it and removes the 0.5 one; mlx-lm compares with
    ``>`` and removes nothing."""
    logits = np.log(np.array([[0.5, 0.25, 0.25]])).astype(np.float32)
    assert torch.softmax(torch.from_numpy(logits), -1).tolist() == [[0.5, 0.25, 0.25]]
    np.testing.assert_array_equal(mlx_xtc(logits, 0.25, []), logits)
    got = ours(XTC(0.25, 1.0), torch.from_numpy(logits)).numpy()
    np.testing.assert_array_equal(got, [[-np.inf, logits[0, 1], logits[0, 2]]])
