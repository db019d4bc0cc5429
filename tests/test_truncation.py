"""Typical, epsilon, eta, top-n-sigma, top-h and XTC without an oracle: validation,
specs, stacking, dtypes, ties, and XTC's per-sequence reproducibility."""

from __future__ import annotations

import json
import math

import pytest
import torch

from anylogits import LogitsProcessor, Pipeline, Vocabulary, from_spec
from anylogits.core.batch import Batch
from anylogits.processors.adaptive_truncation import (
    EpsilonCutoff,
    EtaCutoff,
    TopH,
    TopNSigma,
    TypicalP,
)
from anylogits.processors.xtc import XTC

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
NEG_INF = -math.inf


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
        (lambda: XTC(0.6, 0.5), r"threshold must lie in \(0, 0.5\], got 0.6: above 0.5"),
        (lambda: XTC(0.0, 0.5), r"threshold must lie in \(0, 1\], got 0.0"),
        (lambda: XTC(0.1, 1.5), r"probability must lie in \[0, 1\], got 1.5"),
        (lambda: XTC(0.1, 0.5, seed=-1), "seed must be >= 0, got -1"),
        (lambda: XTC(0.1, 0.5, seed=2**64), "seed must be < 2\\*\\*64"),
        (lambda: XTC(0.1, 0.5, seed=1.5), "seed must be an integer, got 1.5"),
        (lambda: XTC(0.1, 0.5, protected_token_ids=[-1]), "protected_token_ids must hold"),
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
    XTC(0.1, 0.5, seed=12345678901234567890, protected_token_ids=[2, 0]),
]


@pytest.mark.parametrize("processor", PROCESSORS, ids=lambda p: type(p).__name__)
def test_spec_round_trip_rebuilds_an_equal_processor(processor: LogitsProcessor) -> None:
    spec = json.loads(json.dumps(processor.to_spec()))
    rebuilt = from_spec(spec)
    assert type(rebuilt) is type(processor)
    assert rebuilt.config() == processor.config()
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(0)) * 3
    ids = torch.arange(12).reshape(4, 3)
    first = Pipeline([processor])(logits.clone(), ids)
    assert torch.equal(Pipeline([rebuilt])(logits.clone(), ids), first)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("processor", PROCESSORS, ids=lambda p: type(p).__name__)
def test_processors_keep_the_dtype_and_only_remove_tokens(
    processor: LogitsProcessor, dtype: torch.dtype
) -> None:
    logits = (torch.randn(3, 300, generator=torch.Generator().manual_seed(1)) * 2).to(dtype)
    logits[:, :3] = torch.tensor([9.0, 8.5, 8.0])  # XTC has several tokens above 0.1
    out = Pipeline([processor])(logits.clone(), torch.zeros(3, 1, dtype=torch.int64))
    assert out.dtype == dtype and out.shape == logits.shape
    assert bool(((out == logits) | (out == NEG_INF)).all())
    assert bool((out != NEG_INF).any(-1).all())
    if processor.argmax_invariant:
        assert torch.equal(out.argmax(-1), logits.argmax(-1))


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


# XTC


def xtc_row(*probabilities: float) -> torch.Tensor:
    return torch.tensor([probabilities], dtype=torch.float64).log()


def run_xtc(processor: XTC, logits: torch.Tensor, history: list[int] | None = None):
    ids = torch.tensor([history or [1]] * logits.shape[0])
    return Pipeline([processor])(logits.clone(), ids)


def test_xtc_removes_every_token_above_threshold_but_the_least_likely() -> None:
    out = run_xtc(XTC(0.1, 1.0), xtc_row(0.4, 0.05, 0.3, 0.2, 0.05))
    assert (out != NEG_INF).tolist() == [[False, True, False, True, True]]


def test_xtc_needs_two_tokens_above_threshold() -> None:
    logits = xtc_row(0.85, 0.05, 0.05, 0.05)
    assert torch.equal(run_xtc(XTC(0.1, 1.0), logits), logits)


def test_xtc_keeps_every_token_tied_as_the_least_likely() -> None:
    out = run_xtc(XTC(0.15, 1.0), xtc_row(0.5, 0.2, 0.2, 0.1))
    assert (out != NEG_INF).tolist() == [[False, True, True, True]]


def test_xtc_with_probability_zero_never_acts() -> None:
    logits = xtc_row(0.4, 0.35, 0.25)
    assert torch.equal(run_xtc(XTC(0.1, 0.0), logits), logits)


def test_xtc_never_removes_protected_tokens() -> None:
    out = run_xtc(XTC(0.1, 1.0, protected_token_ids=[0]), xtc_row(0.4, 0.35, 0.25))
    assert (out != NEG_INF).tolist() == [[True, False, True]]


def test_xtc_protected_ids_are_checked_against_the_vocabulary_and_the_logits() -> None:
    vocab = Vocabulary(tokens=tuple(bytes([97 + i]) for i in range(3)))
    with pytest.raises(ValueError, match="protected_token_ids holds token id 5, but the voc"):
        Pipeline([XTC(0.1, 1.0, protected_token_ids=[5])], vocab)
    with pytest.raises(ValueError, match="holds token id 5, but the logits row has only 3"):
        run_xtc(XTC(0.1, 1.0, protected_token_ids=[5]), xtc_row(0.4, 0.35, 0.25))


def test_xtc_state_is_the_same_however_the_history_was_split() -> None:
    xtc = XTC(0.1, 0.5, seed=9)
    history = torch.randint(0, 2**31, (300,), generator=torch.Generator().manual_seed(4))
    for split in (0, 1, 150, 299):
        state = xtc.init_state(history[:split])
        for token_id in history[split:].tolist():
            state = xtc.advance(state, token_id)
        assert state == xtc.init_state(history), split


def test_xtc_acts_on_about_probability_of_the_steps() -> None:
    """2000 distinct histories at probability 0.3: the count is binomial (mean 600,
    sd 20.5); 5 sd either side."""
    xtc = XTC(0.1, 0.3, seed=5)
    start = xtc.init_state(torch.tensor([17, 4]))
    acting = sum(xtc.applies(xtc.advance(start, token_id)) for token_id in range(2000))
    assert 497 <= acting <= 703, acting


def test_xtc_decisions_depend_on_the_seed() -> None:
    histories = [torch.tensor([7, token_id]) for token_id in range(200)]
    first, second = XTC(0.1, 0.5, seed=0), XTC(0.1, 0.5, seed=1)
    decisions = [
        (first.applies(first.init_state(h)), second.applies(second.init_state(h)))
        for h in histories
    ]
    agree = sum(a == b for a, b in decisions)
    assert 60 < agree < 140, agree  # independent coins agree about half the time


def _peaked_logits(sequence: int, step: int, vocab: int = 50) -> torch.Tensor:
    """A row with three likely tokens (XTC at 0.1 always has something to remove)."""
    generator = torch.Generator().manual_seed(1000 * sequence + step)
    row = torch.randn(vocab, generator=generator)
    row[torch.randperm(vocab, generator=generator)[:3]] = torch.tensor([6.0, 5.5, 5.0])
    return row


def test_xtc_decision_depends_on_the_sequence_not_its_row_or_batch() -> None:
    """Twelve sequences, six steps. One pipeline sees them all, in a new order at each
    step; one pipeline per sequence sees it alone. Every sequence gets the same output at
    every step, and both decisions occur (the comparison is not vacuous)."""
    sequences = 12
    histories = [[s % 5, s // 5, 7] for s in range(sequences)]  # distinct 3-token prompts
    batched = Pipeline([XTC(0.1, 0.5, seed=3)])
    alone = [Pipeline([XTC(0.1, 0.5, seed=3)]) for _ in range(sequences)]
    shuffle = torch.Generator().manual_seed(6)
    acted = 0
    for step in range(6):
        logits = torch.stack([_peaked_logits(s, step) for s in range(sequences)])
        order = torch.randperm(sequences, generator=shuffle)
        ids = torch.tensor([histories[s] for s in order.tolist()])
        out = torch.empty_like(logits)
        out[order] = batched(logits[order].clone(), ids)
        for s in range(sequences):
            own = alone[s](logits[s : s + 1].clone(), torch.tensor([histories[s]]))
            assert torch.equal(out[s : s + 1], own), (step, s)
            acted += not torch.equal(own, logits[s : s + 1])
            histories[s].append(int(torch.randint(0, 50, (1,), generator=shuffle)))
    assert 0.2 * sequences * 6 < acted < 0.8 * sequences * 6, acted


def test_xtc_acts_only_on_the_rows_whose_coin_says_so() -> None:
    xtc = XTC(0.1, 0.5, seed=8)
    ids = torch.arange(40).reshape(20, 2)
    logits = torch.stack([_peaked_logits(s, 0) for s in range(20)])
    out = Pipeline([xtc])(logits.clone(), ids)
    expected = [xtc.applies(xtc.init_state(row)) for row in ids]
    changed = [not torch.equal(out[r], logits[r]) for r in range(20)]
    assert changed == expected
    assert 0 < sum(expected) < 20
