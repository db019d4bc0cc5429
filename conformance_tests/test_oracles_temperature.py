"""anylogits.processors.temperature against each library's own: transformers'
``TemperatureLogitsWarper`` (hypothesis-drawn pairs, see ``transformers_cases``) and
llama.cpp's ``temp`` sampler (float32 rows, within float32 rounding: it multiplies by
``1 / t``, ours divides), and mlx-lm's ``make_sampler`` (it scales inside the sampler:
the same draws with the same random state)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("hypothesis")

from transformers.generation.logits_process import TemperatureLogitsWarper

from anylogits import Pipeline, Temperature
from conformance_tests.llama_cpp_rows import SEEDS, llama_cpp_apply, ours_row, random_row
from conformance_tests.mlx_rows import (
    mlx_logprobs,
    mlx_modules,
    mlx_row,
)
from conformance_tests.oracle_draws import Draw
from conformance_tests.transformers_cases import (
    Case,
    CaseBuilder,
    FixedExample,
    TransformersPairs,
    one_step,
)


def case_temperature(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    t = draw.float(0.05, 5.0, specials=(1.0, 0.5, 0.7, 2.0, 1.3, 0.1))
    _, steps = one_step(draw, dtype, vocab)
    return Case(Temperature(t), TemperatureLogitsWarper(t), steps)


CASES: dict[str, CaseBuilder] = {
    "Temperature": case_temperature,
}


FIXED_EXAMPLES = {
    "Temperature": FixedExample(
        Temperature(2.0),
        TemperatureLogitsWarper(2.0),
        [[2.0, -4.0, 1.0]],
        [[0]],
        [[1.0, -2.0, 0.5]],
    ),
}


# --------------------------------------------------------------------------------------
# transformers
# --------------------------------------------------------------------------------------


class TestTransformersPairs(TransformersPairs):
    """This module's pairs through the four checks every transformers pair runs."""

    cases = CASES
    fixed_examples = FIXED_EXAMPLES


# --------------------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------------------


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.support("oracle", processor="temperature", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("t", [0.3, 0.7, 1.5])
def test_temperature_matches_llama_cpp(seed: int, t: float) -> None:
    logits = random_row(seed)
    expected = llama_cpp_apply(lambda lib: lib.llama_sampler_init_temp(t), logits)
    np.testing.assert_allclose(ours_row(Temperature(t), logits), expected, rtol=1e-6)


# --------------------------------------------------------------------------------------
# mlx-lm
# --------------------------------------------------------------------------------------


@pytest.mark.only_backend("mlx")
@pytest.mark.support("oracle", processor="temperature", backend="mlx")
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.8])
def test_temperature_draws_the_same_tokens_as_mlx_lm_make_sampler(
    seed: int, temperature: float
) -> None:
    """mlx-lm scales inside its sampler (``logprobs * (1 / temp)``); ours scales first and
    the sampler runs at temperature 1. With the same random state the draws agree."""
    mx, sample_utils = mlx_modules()
    logprobs = np.array(mlx_logprobs(np.concatenate([mlx_row(seed + row) for row in range(64)])))

    def draws(sampler: Any, rows: np.ndarray) -> list[int]:
        mx.random.seed(seed)
        return np.array(sampler(mx.array(rows))).tolist()

    unscaled = draws(sample_utils.make_sampler(temp=1.0), logprobs)
    native = draws(sample_utils.make_sampler(temp=temperature), logprobs)
    assert native != unscaled, "the temperature did not change mlx-lm's draws"
    scaled = Pipeline([Temperature(temperature)])(torch.from_numpy(logprobs), torch.zeros(64, 1))
    assert draws(sample_utils.make_sampler(temp=1.0), scaled.numpy()) == native
