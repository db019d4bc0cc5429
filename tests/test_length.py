"""anylogits.processors.length without an oracle: ExponentialDecayLength and StopStrings
(validation, strings split across tokens, reordered and resumed rows, specs), against a
naive per-row reading of each docstring."""

from __future__ import annotations

import doctest
import math

import phrase_fixtures as phrases
import pytest
import torch
from sequence_fixtures import (
    FIVE_LETTERS,
    INF,
    TOKENS,
    VOCAB,
    assert_round_trips_and_behaves_the_same,
    forced_rows,
    naive_stopped,
    right_aligned,
    run_stop_strings,
)

import anylogits.processors.length as length_module
from anylogits import Pipeline, Vocabulary
from anylogits.processors import (
    ExponentialDecayLength,
    GenLength,
    MinNewTokens,
    StopStrings,
)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: MinNewTokens(-1), "min_new_tokens must be >= 0, got -1"),
        (lambda: MinNewTokens(1, eos_token_id=[-2]), "eos_token_id must hold token ids"),
        (lambda: ExponentialDecayLength(-1, 1.5), "start_index must be >= 0, got -1"),
        (lambda: ExponentialDecayLength(2, 0.0), "decay_factor must be a finite number > 0"),
        (lambda: ExponentialDecayLength(2, INF), "decay_factor must be a finite number > 0"),
        (lambda: ExponentialDecayLength(2, 1.5, [True]), "eos_token_id must hold token ids"),
        (lambda: StopStrings([""]), r"stop_strings\[0\] must be a non-empty string, got ''"),
        (lambda: StopStrings(["x", 3]), r"stop_strings\[1\] must be a non-empty string, got 3"),
        (lambda: StopStrings({"x": 1}), "stop_strings must be a list of strings"),
        (lambda: StopStrings(["\ud800"]), r"stop_strings\[0\] is not valid text"),
        (lambda: StopStrings(["x"], eos_token_id=-3), "eos_token_id must hold token ids"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    ("processor", "vocab", "message"),
    [
        (MinNewTokens(1, eos_token_id=9), FIVE_LETTERS, "eos_token_id holds token id 9"),
        (ExponentialDecayLength(1, 2.0, 8), VOCAB, "eos_token_id holds token id 8"),
        (StopStrings(["a"], eos_token_id=[4, 8]), VOCAB, "eos_token_id holds token id 8"),
        (StopStrings(["a"]), None, "StopStrings decodes generated tokens with the model's"),
        (
            StopStrings(["a"]),
            Vocabulary(tokens=TOKENS),
            "StopStrings: the vocabulary has no EOS id; pass eos_token_id",
        ),
        (
            ExponentialDecayLength(1, 2.0),
            Vocabulary(tokens=TOKENS),
            "ExponentialDecayLength: the vocabulary has no EOS id",
        ),
    ],
)
def test_problems_with_the_vocabulary_fail_at_bind_time(processor, vocab, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Pipeline([processor], vocab)


def test_min_new_tokens_takes_eos_from_the_vocabulary() -> None:
    pipeline = Pipeline([MinNewTokens(1)], FIVE_LETTERS)
    assert pipeline(torch.zeros(1, 5), torch.tensor([[0, 1]]))[0, 4] == -INF
    assert pipeline(torch.zeros(1, 5), torch.tensor([[0, 1, 2]]))[0, 4] == 0


def test_min_new_tokens_without_any_eos_explains_the_fix() -> None:
    with pytest.raises(ValueError, match="pass eos_token_id"):
        Pipeline([MinNewTokens(1)])(torch.zeros(1, 5), torch.tensor([[0]]))


def test_min_new_tokens_counts_each_row_separately() -> None:
    pipeline = Pipeline([MinNewTokens(2, eos_token_id=0)])
    # Ragged rows as vLLM gives them: row 1 has a longer prompt, row 0 is ahead.
    prompts = torch.tensor([[7, 0], [3, 4]])  # row 0 is [0]; 7 is padding
    pipeline(torch.zeros(2, 3), prompts, lengths=torch.tensor([1, 2]))
    ids = torch.tensor([[0, 1, 2], [3, 4, 5]])
    out = pipeline(torch.zeros(2, 3), ids)
    assert out[:, 0].tolist() == [0, -INF]  # row 0 generated 2, row 1 only 1


def test_decay_without_any_eos_explains_the_fix() -> None:
    with pytest.raises(ValueError, match="pass eos_token_id"):
        Pipeline([ExponentialDecayLength(0, 2.0)])(torch.zeros(1, 5), torch.tensor([[0]]))


def test_decay_counts_generated_tokens_of_each_sequence() -> None:
    pipeline = Pipeline([ExponentialDecayLength(1, 2.0)], VOCAB)
    # Ragged prompts, as vLLM gives them: row 0 is [3], row 1 is [2, 3, 1].
    rows = [[3], [2, 3, 1]]
    ids, lengths = right_aligned(rows, pad=7)
    pipeline(torch.zeros(2, 8), ids, lengths=lengths)
    for step in range(1, 4):
        rows = [rows[0] + [0], rows[1] + [0, 0]]  # row 1 gains two tokens per call
        logits = torch.full((2, 8), -2.0)
        ids, lengths = right_aligned(rows, pad=7)
        out = pipeline(logits.clone(), ids, lengths=lengths)
        for row, generated in ((0, step), (1, 2 * step)):
            growth = 2.0 ** (generated - 1) - 1 if generated > 1 else 0.0
            assert out[row, 4].item() == -2.0 + 2.0 * growth, (step, row)
        assert torch.equal(out[:, :4], logits[:, :4]) and torch.equal(out[:, 5:], logits[:, 5:])


def test_decay_leaves_infinite_eos_logits_alone() -> None:
    pipeline = Pipeline([ExponentialDecayLength(0, 3.0, eos_token_id=[1, 2])])
    pipeline(torch.zeros(1, 3), torch.tensor([[0]]))
    out = pipeline(torch.tensor([[0.0, -INF, -1.0]]), torch.tensor([[0, 0]]))
    assert out.tolist() == [[0.0, -INF, 1.0]]


def test_stop_strings_span_tokens_and_split_characters() -> None:
    stops = ["a ab", "é"]
    generated = [
        [0, 3, 0, 1, 1],  # "a ab" completed by the 4th token
        [1, 5, 6, 1, 1],  # "é" from two byte tokens
        [1, 1, 5, 1, 6],  # the bytes of "é" but not adjacent: never
        [0, 3, 2, 1, 1],  # "a ab" inside "a " + "ab"
    ]
    pipeline = Pipeline([StopStrings(stops)], VOCAB)
    flags = run_stop_strings(pipeline, [[7]] * 4, generated)
    for step, step_flags in enumerate(flags):
        assert step_flags == [naive_stopped(g[:step], stops) for g in generated], step
    assert flags[-1] == [True, True, False, True]
    assert [f[0] for f in flags] == [False, False, False, False, True, True]


def test_stop_strings_ignore_the_prompt() -> None:
    # The prompt "a " plus the generated "ab" reads "a ab", but only "ab" was generated.
    pipeline = Pipeline([StopStrings(["a ab"])], VOCAB)
    flags = run_stop_strings(pipeline, [[0, 3]], [[2, 1, 1]])
    assert not any(f[0] for f in flags)


def test_stop_strings_keep_forcing_eos_after_the_stop() -> None:
    pipeline = Pipeline([StopStrings(["b"], eos_token_id=[4, 2])], VOCAB)
    pipeline(torch.randn(1, 8), torch.tensor([[0]]))
    for ids in ([[0, 1]], [[0, 1, 0]], [[0, 1, 0, 3]]):
        out = pipeline(torch.randn(1, 8), torch.tensor(ids))
        assert out[0, [2, 4]].tolist() == [0, 0]
        assert out[0, [0, 1, 3, 5, 6, 7]].isneginf().all()


def test_stop_strings_follow_reordered_rows() -> None:
    stops = ["bb"]
    pipeline = Pipeline([StopStrings(stops)], VOCAB)
    sequences = [[7, 0, 1, 1], [7, 1, 0, 0], [7, 0, 0, 0]]  # only the first stops
    pipeline(torch.randn(3, 8), torch.tensor([[7], [7], [7]]))
    generator = torch.Generator().manual_seed(1)
    for length in range(2, 5):
        order = torch.randperm(3, generator=generator).tolist()
        ids = torch.tensor([sequences[i][:length] for i in order])
        flags = forced_rows(pipeline(torch.randn(3, 8), ids))
        assert flags == [naive_stopped(sequences[i][1:length], stops) for i in order]
    assert flags[order.index(0)]


def test_stop_strings_replay_resumed_sequences() -> None:
    """Several tokens at once (a resumed sequence): a stop inside them is found."""
    for stop, stopped in (("bc!", True), ("ab!", False)):
        pipeline = Pipeline([StopStrings([stop], eos_token_id=4)], VOCAB)
        pipeline(torch.randn(1, 8), torch.tensor([[3]]))
        pipeline(torch.randn(1, 8), torch.tensor([[3, 0]]))
        # Generated "a", then "b", "c!", "a", "a" in one call: "abc!aa".
        out = pipeline(torch.randn(1, 8), torch.tensor([[3, 0, 1, 7, 0, 0]]))
        assert forced_rows(out) == [stopped], stop


def test_stop_strings_state_keeps_a_bounded_tail() -> None:
    processor = StopStrings(["abc", "zz"])
    Pipeline([processor], VOCAB)
    state = processor.init_state(torch.tensor([0]))
    for token_id in [0, 2, 3, 7, 0, 1, 2, 3] * 50:  # "aab c!abab " again and again
        state = processor.advance(state, token_id)
        assert len(state.tail) <= 2 and not state.stopped
    assert state.tail == b"b "
    assert processor.advance(state, 9) == state  # an id past the vocabulary has no text
    state = processor.advance(processor.advance(state, 0), 1)  # "... ab"
    assert not state.stopped and processor.advance(state, 7).stopped  # "... abc!"


def test_stop_strings_on_padded_logits_wider_than_the_vocabulary() -> None:
    pipeline = Pipeline([StopStrings(["b"])], VOCAB)
    pipeline(torch.zeros(1, 12), torch.tensor([[0]]))
    out = pipeline(torch.zeros(1, 12), torch.tensor([[0, 10]]))  # id 10 has no text
    assert out.eq(0).all()
    out = pipeline(torch.zeros(1, 12), torch.tensor([[0, 10, 1]]))
    assert out[0, 4] == 0 and out[0].isneginf().sum() == 11


EXAMPLES = [
    ExponentialDecayLength(3, 1.5),
    ExponentialDecayLength(0, 0.9, eos_token_id=[4, 2]),
    StopStrings(["ab", "é\n"]),
    StopStrings(["b"], eos_token_id=2),
]


@pytest.mark.parametrize("processor", EXAMPLES, ids=repr)
def test_spec_round_trips_through_json_and_behaves_the_same(processor) -> None:
    assert_round_trips_and_behaves_the_same(processor)


def test_a_single_stop_string_is_one_stop() -> None:
    assert StopStrings("ab").config() == {"stop_strings": ["ab"], "eos_token_id": None}


# --------------------------------------------------------------------------------------
# GenLength: a phrase processor (the phrase vocabulary and sequence harness)
# --------------------------------------------------------------------------------------

GEN_LENGTH_EXAMPLES = [
    GenLength(0.5),
    GenLength(-0.25, p=1, complete_sentences=True, boost_token="<end>"),
    GenLength(1.0, boost_token=phrases.END),
]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: GenLength(math.nan), "boost_factor must be finite, got nan"),
        (lambda: GenLength("1"), "boost_factor must be a number, got '1'"),
        (lambda: GenLength(1.0, p=-1), "p must be >= 0, got -1"),
        (lambda: GenLength(1.0, p=1.5), "p must be an integer, got 1.5"),
        (lambda: GenLength(1.0, boost_token=""), "boost_token must be a token id or a non-empty"),
        (lambda: GenLength(1.0, complete_sentences=None), "complete_sentences must be True or"),
    ],
)
def test_gen_length_bad_arguments_raise_value_errors_naming_the_value(build, message) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_gen_length_rejects_a_boost_token_of_several_tokens_at_bind_time() -> None:
    with pytest.raises(ValueError, match="boost_token 'x z' must be one token"):
        Pipeline([GenLength(1.0, boost_token="x z")], phrases.VOCAB)


def test_gen_length_without_a_known_eos_explains_the_fix() -> None:
    with pytest.raises(ValueError, match="does not know the EOS id"):
        Pipeline([GenLength(1.0)])(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), torch.tensor([[0]]))


@pytest.mark.parametrize("processor", GEN_LENGTH_EXAMPLES, ids=repr)
def test_gen_length_specs_round_trip_through_json(processor: GenLength) -> None:
    assert processor.spec_name == "gen_length"
    phrases.assert_spec_round_trips_through_json(processor)


def test_length_doctests_pass() -> None:
    result = doctest.testmod(length_module)
    assert result.attempted > 0 and result.failed == 0


def test_gen_length_boost_grows_per_row_and_stops_after_the_boosted_token() -> None:
    pipeline = Pipeline([GenLength(0.5, p=2)], phrases.VOCAB)
    # Prompts of lengths 2 and 1; 15 and 4 generated tokens; the third row generated EOS.
    prompts = [[16, 17], [16], [16]]
    ids = torch.zeros(3, 17, dtype=torch.int64)
    pipeline(
        torch.zeros(3, phrases.V),
        torch.tensor([[16, 17], [0, 16], [0, 16]]),
        lengths=torch.tensor([2, 1, 1]),
    )
    rows = [prompts[0] + [22] * 15, prompts[1] + [22] * 4, prompts[2] + [phrases.EOS, 22, 22]]
    for row, tokens in enumerate(rows):
        ids[row, 17 - len(tokens) :] = torch.tensor(tokens)
    lengths = torch.tensor([len(tokens) for tokens in rows])
    out = pipeline(torch.zeros(3, phrases.V), ids, lengths=lengths)
    expected = [0.5 * 15**2 / 100, 0.5 * 4**2 / 100, 0.0]
    assert out[:, phrases.EOS].tolist() == pytest.approx(expected, rel=1e-6)
    out[:, phrases.EOS] = 0.0
    assert torch.equal(out, torch.zeros(3, phrases.V))


@pytest.mark.parametrize("p", [0, 1, 2, 3, 4, 6, 9])
def test_gen_length_powers_are_pythons_exact_integer_powers(p: int) -> None:
    # Taken where the lengths are (no host read): exact in int64 while n ** p < 2**63,
    # rounded to float64 once, as Python's float(n ** p); beyond, within an ulp of it.
    largest = length_module._largest_exact_base(p)
    if largest is not None:
        assert largest**p < 2**63 <= (largest + 1) ** p
    lengths = [0, 1, 2, 3, 10, 99, 1000, 65_535, 2**20 + 1, 2_097_151, 3_000_000_000]
    exact = [n for n in lengths if largest is None or n <= largest] + [largest or 7]
    powers = length_module._exact_powers(torch.tensor(exact), p)
    assert powers.tolist() == [float(n**p) for n in exact]
    beyond = [n for n in lengths if largest is not None and n > largest]
    approximate = length_module._exact_powers(torch.tensor(beyond, dtype=torch.int64), p)
    for n, power in zip(beyond, approximate.tolist(), strict=True):
        assert math.isclose(power, float(n**p), rel_tol=2**-52)


def test_gen_length_reads_nothing_on_the_device() -> None:
    # Logits on `meta` hold no values: a read of one fails, where a GPU's would stall.
    pipeline = Pipeline([GenLength(0.5, p=3)], phrases.VOCAB)
    pipeline(torch.empty(2, phrases.V, device="meta"), torch.tensor([[16, 17], [16, 18]]))
    ids = torch.tensor([[16, 17, 22, 22], [16, 18, 22, phrases.EOS]])
    out = pipeline(torch.empty(2, phrases.V, device="meta"), ids)
    assert out.device.type == "meta"


def test_gen_length_complete_sentences_boosts_only_after_a_sentence_end() -> None:
    pipeline = Pipeline(
        [GenLength(1.0, p=1, complete_sentences=True, boost_token="<end>")], phrases.VOCAB
    )
    pipeline(torch.zeros(2, phrases.V), torch.tensor([[16, 17]] * 2))
    # Probe sentences "It is a sentence." / "It is a new line\n" end in "." and "\n".
    ids = torch.tensor([[16, 17, 22, phrases.DOT], [16, 17, phrases.DOT, 22]])
    out = pipeline(torch.zeros(2, phrases.V), ids)
    assert out[:, phrases.END].tolist() == pytest.approx([0.2, 0.0])


@phrases.across_sequence_checks(GEN_LENGTH_EXAMPLES)
def test_gen_length_sequences_match_however_their_rows_move_and_calls_skip(
    check: phrases.SequenceCheck, processor: GenLength, seed: int
) -> None:
    check(processor, seed)
