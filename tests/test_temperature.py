"""anylogits.processors.temperature without an oracle: validation (the oracles of
transformers, llama.cpp and mlx-lm are in conformance_tests/test_oracles_temperature.py)."""

from __future__ import annotations

import pytest

from anylogits import Temperature


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Temperature(0), "temperature must be a finite number > 0, got 0"),
        (lambda: Temperature("hot"), "temperature must be a number, got 'hot'"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()
