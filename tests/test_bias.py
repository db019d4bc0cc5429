"""anylogits.processors.bias without an oracle: SequenceBias (validation, ragged rows,
specs), against a naive per-row reading of its docstring."""

from __future__ import annotations

import pytest
import torch
from sequence_fixtures import (
    INF,
    VOCAB,
    assert_round_trips_and_behaves_the_same,
    naive_sequence_bias,
    right_aligned,
)

from anylogits import Pipeline
from anylogits.processors import (
    SequenceBias,
)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: SequenceBias({(1,): 2.0}), "biases must be a list of"),
        (lambda: SequenceBias([[[1], 2.0, 3]]), r"biases\[0\] must be a \[token_ids, bias\]"),
        (lambda: SequenceBias([[[], 2.0]]), r"biases\[0\]\[0\] must hold at least one"),
        (lambda: SequenceBias([[[1], "x"]]), r"biases\[0\]\[1\] must be a number, got 'x'"),
        (lambda: SequenceBias([[[1], INF]]), r"biases\[0\]\[1\] must be finite, got inf"),
        (lambda: SequenceBias([[[1], True]]), r"biases\[0\]\[1\] must be a number, got True"),
        (
            lambda: SequenceBias([[[1, 2], 1.0], [[1, 2], 2.0]]),
            r"biases\[1\] repeats the sequence \[1, 2\]",
        ),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    ("processor", "vocab", "message"),
    [
        (SequenceBias([[[8], 1.0]]), VOCAB, "biases holds token id 8, but the vocabulary"),
    ],
)
def test_problems_with_the_vocabulary_fail_at_bind_time(processor, vocab, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Pipeline([processor], vocab)


@pytest.mark.parametrize(
    "processor",
    [
        SequenceBias([[[0, 7], 1.0]]),
    ],
    ids=lambda p: type(p).__name__,
)
def test_ids_outside_the_logits_fail_before_processing(processor) -> None:
    with pytest.raises(ValueError, match="holds token id 7, but the logits row has only 4"):
        Pipeline([processor])(torch.zeros(1, 4), torch.tensor([[0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_sequence_bias_matches_a_naive_reading_on_ragged_rows(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    biases = [([3], 1.5), ([1, 3], 2.0), ([0, 1, 3], -0.75), ([2, 2], 4.0), ([1, 2], -1.0)]
    pipeline = Pipeline([SequenceBias([[s, b] for s, b in biases])])
    for step in range(20):
        lengths = torch.randint(1, 6, (5,), generator=generator).tolist()
        rows = [torch.randint(0, 4, (n,), generator=generator).tolist() for n in lengths]
        ids, lengths = right_aligned(rows, pad=step % 4)
        logits = torch.randn(5, 6, generator=generator).to(dtype)
        out = pipeline(logits.clone(), ids, lengths=lengths)
        # Naive additions in float64, rounded once: exact for these binary fractions.
        expected = naive_sequence_bias(logits.double(), rows, biases).to(dtype)
        assert torch.equal(out, expected), step


EXAMPLES = [
    SequenceBias([[[1, 3], 2.5], [[0], -1.0]]),
]


@pytest.mark.parametrize("processor", EXAMPLES, ids=repr)
def test_spec_round_trips_through_json_and_behaves_the_same(processor) -> None:
    assert_round_trips_and_behaves_the_same(processor)
