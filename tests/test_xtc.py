"""anylogits.processors.xtc without an oracle (llama.cpp's and mlx-lm's are compared in
conformance_tests/test_oracles_xtc.py): validation, specs, dtypes, ties, protected tokens,
and the per-sequence reproducibility of its coin."""

from __future__ import annotations

import pytest
import torch
from truncation_fixtures import NEG_INF, RemovingProcessorChecks

from anylogits import Pipeline, Vocabulary
from anylogits.processors.xtc import XTC


@pytest.mark.parametrize(
    ("build", "message"),
    [
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


PROCESSORS = [XTC(0.1, 0.5, seed=12345678901234567890, protected_token_ids=[2, 0])]


class TestRemovingProcessors(RemovingProcessorChecks):
    processors = PROCESSORS


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
