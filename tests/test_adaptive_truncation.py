"""anylogits.processors.adaptive_truncation without an oracle (transformers' and
llama.cpp's are compared in conformance_tests/test_oracles_adaptive_truncation.py): typical,
epsilon, eta, top-n-sigma and top-h. Validation, specs, stacking, dtypes, ties."""

from __future__ import annotations

import math

import pytest
import torch
from truncation_fixtures import DTYPES, NEG_INF, RemovingProcessorChecks

from anylogits import Pipeline
from anylogits.core.batch import Batch
from anylogits.processors.adaptive_truncation import (
    EpsilonCutoff,
    EtaCutoff,
    TopH,
    TopNSigma,
    TypicalP,
)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TypicalP(0.0), r"mass must lie in \(0, 1\], got 0.0"),
        (lambda: TypicalP(1.5), r"mass must lie in \(0, 1\], got 1.5"),
        (lambda: TypicalP(0.5, min_tokens_to_keep=0), "min_tokens_to_keep must be >= 1, got 0"),
        (lambda: EpsilonCutoff(-0.1), r"epsilon must lie in \(0, 1\], got -0.1"),
        (lambda: EpsilonCutoff("small"), "epsilon must be a number, got 'small'"),
        (lambda: EtaCutoff(2.0), r"epsilon must lie in \(0, 1\], got 2.0"),
        (lambda: EtaCutoff(1e-3, min_tokens_to_keep=1.5), "min_tokens_to_keep must be an integer"),
        (lambda: TopNSigma(0), "n must be a finite number > 0, got 0"),
        (lambda: TopNSigma(math.inf), "n must be a finite number > 0, got inf"),
        (lambda: TopH(0.0), r"top_h must lie in \(0, 1\], got 0.0"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


PROCESSORS = [
    TypicalP(0.9, min_tokens_to_keep=2),
    EpsilonCutoff(3e-4),
    EtaCutoff(2e-3, min_tokens_to_keep=3),
    TopNSigma(1.5),
    TopH(0.4),
]


class TestRemovingProcessors(RemovingProcessorChecks):
    processors = PROCESSORS


# Stacking: one call with per-row parameters gives, bit for bit, each row's own result.


STACKABLE = {
    "TypicalP": lambda i: TypicalP([0.2, 0.9, 1.0, 0.5, 0.99][i], min_tokens_to_keep=1 + i % 3),
    "EpsilonCutoff": lambda i: EpsilonCutoff([3e-4, 0.01, 0.05, 0.3, 1e-6][i], 1 + (i == 2) * 4),
    "EtaCutoff": lambda i: EtaCutoff([3e-4, 0.01, 0.05, 0.3, 0.123][i], 1 + (i == 1) * 2),
    "TopNSigma": lambda i: TopNSigma([0.5, 1.0, 1.7, 3.0, 0.1][i]),
    "TopH": lambda i: TopH([0.1, 0.4, 0.77, 1.0, 0.3][i]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(STACKABLE))
def test_stack_matches_each_row_processed_alone(name: str, dtype: torch.dtype) -> None:
    processors = [STACKABLE[name](i) for i in range(5)]
    generator = torch.Generator().manual_seed(2)
    logits = (torch.randn(5, 500, generator=generator, dtype=torch.float64) * 2).to(dtype)
    logits[3, 250:] = NEG_INF
    stacked = type(processors[0]).stack(processors)
    assert stacked is not None
    out = stacked.process(logits.clone(), Batch(5))
    for row, processor in enumerate(processors):
        alone = Pipeline([processor])(logits[row : row + 1].clone())
        assert torch.equal(out[row : row + 1], alone), (row, processor)
    assert not torch.equal(out, logits)


def test_typical_grows_its_chunk_to_the_exact_full_sort_result() -> None:
    """A flat row (typical set of thousands of tokens): a first chunk of 2 grows until
    it holds the mass, and gives the result of sorting everything at once."""
    logits = torch.randn(3, 5000, generator=torch.Generator().manual_seed(3)) * 0.3
    growing, sorting = TypicalP(0.9), TypicalP(0.9)
    growing.first_chunk, sorting.first_chunk = 2, 10**9
    out = Pipeline([growing])(logits.clone())
    assert torch.equal(out, Pipeline([sorting])(logits.clone()))
    assert 1000 < int((out != NEG_INF).sum()) < 3 * 5000


def test_typical_mass_one_keeps_everything() -> None:
    logits = torch.randn(2, 50)
    assert torch.equal(Pipeline([TypicalP(1.0)])(logits.clone()), logits)


def test_typical_keeps_rank_ties_together() -> None:
    """Probabilities 0.4, 0.2, 0.2, 0.2: the three 0.2 tokens tie in rank |-log p - H| and
    are ranked first; mass 0.1 is reached by the first of them, the tie keeps all three."""
    logits = torch.tensor([[0.4, 0.2, 0.2, 0.2]]).log()
    out = Pipeline([TypicalP(0.1)])(logits.clone())
    assert (out != NEG_INF).tolist() == [[False, True, True, True]]


def test_epsilon_and_eta_keep_min_tokens_with_ties() -> None:
    logits = torch.tensor([[5.0, 0.0, 0.0, -1.0]])
    for processor in (EpsilonCutoff(0.5, min_tokens_to_keep=2), EtaCutoff(0.5, 2)):
        out = Pipeline([processor])(logits.clone())
        assert (out != NEG_INF).tolist() == [[True, True, True, False]], processor


def test_top_n_sigma_uses_the_population_deviation_of_finite_logits() -> None:
    """Finite logits 3, 2, 0, -1: mean 1, population variance (4 + 1 + 1 + 4) / 4 = 2.5.
    n = 1.2 puts the threshold at 3 - 1.2 * 1.581 = 1.10 (the sample deviation, 1.826,
    would give 0.81; counting the -inf would give nan)."""
    logits = torch.tensor([[3.0, 2.0, 0.0, -1.0, NEG_INF, NEG_INF]])
    out = Pipeline([TopNSigma(1.2)])(logits.clone())
    assert out.tolist() == [[3.0, 2.0, NEG_INF, NEG_INF, NEG_INF, NEG_INF]]
    # n = 1.89 and 1.9 put the threshold at +0.012 and -0.004: the logit 0 pins sigma
    # between 3 / 1.9 and 3 / 1.89.
    out = Pipeline([TopNSigma(1.89)])(logits.clone())
    assert out.tolist() == [[3.0, 2.0, NEG_INF, NEG_INF, NEG_INF, NEG_INF]]
    out = Pipeline([TopNSigma(1.9)])(logits.clone())
    assert out.tolist() == [[3.0, 2.0, 0.0, NEG_INF, NEG_INF, NEG_INF]]


def test_top_h_keeps_the_whole_tie_at_its_boundary() -> None:
    """Entropy of (1/2, 1/4, 1/4) is 1.5 ln 2; top_h 0.5 allows 0.75 ln 2, the first token
    (0.5 ln 2) fits, the first 1/4 token would make 1.0 ln 2. The 1/4 pair is dropped
    together, never split."""
    logits = torch.tensor([[0.5, 0.25, 0.25]]).log()
    assert (Pipeline([TopH(0.5)])(logits.clone()) != NEG_INF).tolist() == [[True, False, False]]
    assert (Pipeline([TopH(0.9)])(logits.clone()) != NEG_INF).tolist() == [[True, True, True]]


def test_top_h_considers_only_its_candidates() -> None:
    """Beyond the 100 candidates nothing is kept, however flat the row."""
    logits = torch.zeros(1, 1000)
    logits[0, :100] = 1.0
    out = Pipeline([TopH(1.0)])(logits.clone())
    assert int((out != NEG_INF).sum()) == 100
