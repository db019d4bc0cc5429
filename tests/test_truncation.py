"""anylogits.processors.truncation (TopK, TopP, MinP) without an oracle: validation, ties
at the top-p boundary, top-p's chunk growth (the oracles are in
conformance_tests/test_oracles_truncation.py)."""

from __future__ import annotations

import pytest
import torch

from anylogits import MinP, Pipeline, TopK, TopP


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TopK(0), "top_k must be >= 1, got 0"),
        (lambda: TopK(3, min_tokens_to_keep=0), "min_tokens_to_keep must be >= 1, got 0"),
        (lambda: TopP(1.5), r"top_p must lie in \(0, 1\], got 1.5"),
        (lambda: TopP(0.0), r"top_p must lie in \(0, 1\], got 0.0"),
        (lambda: MinP(-0.1), r"min_p must lie in \[0, 1\], got -0.1"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_top_p_keeps_every_token_tied_at_the_boundary() -> None:
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0]])
    out = Pipeline([TopP(0.5)])(logits)
    assert torch.isfinite(out).tolist() == [[True, True, True, True, False]]


def test_top_p_grows_its_chunk_until_the_mass_is_reached() -> None:
    logits = torch.zeros(2, 1000)  # uniform: 900 tokens are needed for 0.9
    logits[1, 0] = 100.0  # one certain token
    out = Pipeline([TopP(0.9)])(logits)
    assert torch.isfinite(out).sum(-1).tolist() == [1000, 1]
