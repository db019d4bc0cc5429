"""anylogits.processors.bias without an oracle: SequenceBias (validation, ragged rows,
specs), against a naive per-row reading of its docstring."""

from __future__ import annotations

import doctest
import math

import phrase_fixtures as phrases
import pytest
import torch
from sequence_fixtures import (
    FIVE_LETTERS,
    INF,
    VOCAB,
    assert_round_trips_and_behaves_the_same,
    naive_sequence_bias,
    right_aligned,
)

import anylogits.processors.bias as bias_module
from anylogits import Pipeline
from anylogits.processors import (
    CiteFromPrompt,
    LogitBias,
    SequenceBias,
)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LogitBias({1: INF}), r"bias\[1\] must be finite, got inf"),
        (lambda: LogitBias({1: 1.0, "1": 2.0}), "names token id 1 twice"),
        (lambda: LogitBias([1]), "bias must be a dict"),
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
        (LogitBias({5: 1.0}), FIVE_LETTERS, "bias holds token id 5, but the vocabulary has only 5"),
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


# --------------------------------------------------------------------------------------
# CiteFromPrompt: a phrase processor (the phrase vocabulary and sequence harness)
# --------------------------------------------------------------------------------------

CITE_EXAMPLES = [
    CiteFromPrompt(1.5, conditional_boost_factor=2.0),
    CiteFromPrompt(-1.0, boost_eos=False, eos_token_id=1),
]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: CiteFromPrompt(conditional_boost_factor=math.inf), "conditional_boost_factor"),
        (lambda: CiteFromPrompt(boost_eos="yes"), "boost_eos must be True or False, got 'yes'"),
    ],
)
def test_cite_from_prompt_bad_arguments_raise_value_errors_naming_the_value(
    build, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_cite_from_prompt_rejects_an_eos_id_outside_the_vocabulary_at_bind_time() -> None:
    outside = phrases.V + 1
    with pytest.raises(ValueError, match=f"eos_token_id holds token id {outside}"):
        Pipeline([CiteFromPrompt(eos_token_id=[outside])], phrases.VOCAB)


def test_cite_from_prompt_without_a_known_eos_explains_the_fix() -> None:
    with pytest.raises(ValueError, match="does not know the EOS id"):
        Pipeline([CiteFromPrompt()])(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), torch.tensor([[0]]))


@pytest.mark.parametrize("processor", CITE_EXAMPLES, ids=repr)
def test_cite_from_prompt_specs_round_trip_through_json(processor: CiteFromPrompt) -> None:
    assert processor.spec_name == "cite_from_prompt"
    phrases.assert_spec_round_trips_through_json(processor)


def test_bias_doctests_pass() -> None:
    result = doctest.testmod(bias_module)
    assert result.attempted > 0 and result.failed == 0


def test_cite_from_prompt_boosts_each_rows_prompt_and_what_follows_the_last_token() -> None:
    pipeline = Pipeline([CiteFromPrompt(1.0, conditional_boost_factor=10.0)], phrases.VOCAB)
    ids = torch.tensor([[0, 4, 5, 4, 6], [7, 8, 9, 8, 7]])
    out = pipeline(torch.zeros(2, phrases.V), ids)
    assert phrases.only_boosted(out[0]) == {4: 1.0, 5: 1.0, 6: 1.0, 0: 1.0, phrases.EOS: 1.0}
    assert phrases.only_boosted(out[1]) == {7: 1.0, 8: 1.0, 9: 1.0, phrases.EOS: 1.0}
    out = pipeline(torch.zeros(2, phrases.V), torch.cat([ids, torch.tensor([[4], [22]])], 1))
    # Row 0 generated 4, which the prompt follows with 5 and 6; 22 is not in row 1's prompt.
    assert phrases.only_boosted(out[0]) == {4: 1.0, 5: 11.0, 6: 11.0, 0: 1.0, phrases.EOS: 1.0}
    assert phrases.only_boosted(out[1]) == {7: 1.0, 8: 1.0, 9: 1.0, phrases.EOS: 1.0}


@phrases.across_sequence_checks(CITE_EXAMPLES)
def test_cite_from_prompt_sequences_match_however_their_rows_move_and_calls_skip(
    check: phrases.SequenceCheck, processor: CiteFromPrompt, seed: int
) -> None:
    check(processor, seed)
