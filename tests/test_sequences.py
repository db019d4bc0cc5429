"""Sequence processors without an oracle: validation, strings, ragged / reordered rows,
resumed sequences, specs. Expected values come from a naive per-row reading of each
docstring (written here, not taken from the implementation)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from anylogits import Pipeline, Vocabulary, from_spec
from anylogits.processors import (
    BadWords,
    ExponentialDecayLength,
    SequenceBias,
    StopStrings,
)

INF = math.inf

# Tokens: 0 "a", 1 "b", 2 "ab", 3 " ", 4 "</s>", 5 "\xc3" and 6 "\xa9" (the two bytes of
# "é"), 7 "c!".
TOKENS = (b"a", b"b", b"ab", b" ", b"</s>", b"\xc3", b"\xa9", b"c!")


def greedy_encode(text: str) -> list[int]:
    """Longest-match tokenizer over TOKENS, enough to resolve strings in tests."""
    data, ids = text.encode("utf-8"), []
    while data:
        token_id = max(
            (i for i, token in enumerate(TOKENS) if data.startswith(token)),
            key=lambda i: len(TOKENS[i]),
        )
        ids.append(token_id)
        data = data[len(TOKENS[token_id]) :]
    return ids


VOCAB = Vocabulary(tokens=TOKENS, eos_token_ids=frozenset({4}), encode=greedy_encode)
BYTES_ONLY_VOCAB = Vocabulary(tokens=TOKENS, eos_token_ids=frozenset({4}))


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: BadWords("ab"), "words must be a list of token-id lists or strings, got 'ab'"),
        (lambda: BadWords([[]]), r"words\[0\] must hold at least one token id, got \[\]"),
        (lambda: BadWords([[1], [-1]]), r"words\[1\] must hold token ids .* got -1"),
        (lambda: BadWords([""]), r"words\[0\] is an empty string"),
        (lambda: BadWords([[1.5]]), r"words\[0\] must hold token ids .* got 1.5"),
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
        (BadWords([[1, 9]]), VOCAB, r"words\[0\] holds token id 9, but the vocabulary has only 8"),
        (SequenceBias([[[8], 1.0]]), VOCAB, "biases holds token id 8, but the vocabulary"),
        (ExponentialDecayLength(1, 2.0, 8), VOCAB, "eos_token_id holds token id 8"),
        (StopStrings(["a"], eos_token_id=[4, 8]), VOCAB, "eos_token_id holds token id 8"),
        (BadWords(["ab"]), None, r"words\[0\] 'ab' is text, so it needs the model's tokenizer"),
        (BadWords(["ab"]), BYTES_ONLY_VOCAB, "or pass token ids"),
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


def test_a_string_that_tokenizes_to_nothing_is_rejected() -> None:
    vocab = Vocabulary(tokens=TOKENS, encode=lambda text: [])
    with pytest.raises(ValueError, match=r"words\[0\] 'zz' encodes to no tokens"):
        Pipeline([BadWords(["zz"])], vocab)


@pytest.mark.parametrize(
    "processor",
    [BadWords([[1], [0, 7]]), SequenceBias([[[0, 7], 1.0]])],
    ids=lambda p: type(p).__name__,
)
def test_ids_outside_the_logits_fail_before_processing(processor) -> None:
    with pytest.raises(ValueError, match="holds token id 7, but the logits row has only 4"):
        Pipeline([processor])(torch.zeros(1, 4), torch.tensor([[0]]))


def test_decay_without_any_eos_explains_the_fix() -> None:
    with pytest.raises(ValueError, match="pass eos_token_id"):
        Pipeline([ExponentialDecayLength(0, 2.0)])(torch.zeros(1, 5), torch.tensor([[0]]))


# ---------------------------------------------------------------------------------------
# BadWords and SequenceBias against a naive per-row reading
# ---------------------------------------------------------------------------------------


def naive_sequence_bias(
    logits: torch.Tensor, rows: list[list[int]], biases: list[tuple[list[int], float]]
) -> torch.Tensor:
    """Each row's real tokens, each entry checked by slicing, biases added one by one."""
    out = logits.clone()
    for b, tokens in enumerate(rows):
        for sequence, bias in biases:
            prefix = sequence[:-1]
            if not prefix or (len(tokens) >= len(prefix) and tokens[-len(prefix) :] == prefix):
                out[b, sequence[-1]] += bias
    return out


def right_aligned(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows])
    return ids, torch.tensor([len(row) for row in rows])


def test_bad_words_single_tokens_are_always_banned() -> None:
    out = Pipeline([BadWords([[2], [5]])])(torch.zeros(2, 6), torch.tensor([[0], [1]]))
    assert out.isneginf().nonzero().tolist() == [[0, 2], [0, 5], [1, 2], [1, 5]]


def test_bad_words_ban_the_last_token_only_after_the_prefix() -> None:
    words = [[1, 2, 3], [2, 4], [0, 1, 2, 5]]
    rows = [[0, 1, 2], [7, 1, 2], [2], [1], [1, 2, 7]]
    ids, lengths = right_aligned(rows, pad=7)
    out = Pipeline([BadWords(words)])(torch.zeros(5, 8), ids, lengths=lengths)
    expected = naive_sequence_bias(torch.zeros(5, 8), rows, [(w, -INF) for w in words])
    assert torch.equal(out, expected)
    assert out[0].isneginf().nonzero().flatten().tolist() == [3, 4, 5]
    assert out[4].isneginf().sum() == 0


def test_bad_words_ignore_padding_of_ragged_rows() -> None:
    # Row 0 is just [2]: the padding [1] before it must not complete the prefix [1, 2].
    ids = torch.tensor([[1, 2], [1, 2]])
    out = Pipeline([BadWords([[1, 2, 3]])])(torch.zeros(2, 4), ids, lengths=torch.tensor([1, 2]))
    assert out[:, 3].tolist() == [0, -INF]


def test_a_prefix_longer_than_the_history_never_matches() -> None:
    out = Pipeline([BadWords([[5, 5, 1, 2]])])(torch.zeros(1, 6), torch.tensor([[1]]))
    assert out.eq(0).all()


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


def test_strings_are_tokenized_with_the_bound_vocabulary() -> None:
    pipeline = Pipeline([BadWords(["b c!", "é"])], VOCAB)  # [1, 3, 7] and [5, 6]
    out = pipeline(torch.zeros(3, 8), torch.tensor([[0, 1, 3], [2, 2, 5], [0, 1, 5]]))
    assert out.isneginf().nonzero().tolist() == [[0, 7], [1, 6], [2, 6]]


def test_bad_words_may_mix_strings_and_ids() -> None:
    out = Pipeline([BadWords(["ab", [0]])], VOCAB)(torch.zeros(1, 8), torch.tensor([[1]]))
    assert out.isneginf().nonzero().tolist() == [[0, 0], [0, 2]]


# ---------------------------------------------------------------------------------------
# ExponentialDecayLength
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# StopStrings
# ---------------------------------------------------------------------------------------


def forced_rows(out: torch.Tensor, eos: int = 4) -> list[bool]:
    """Which rows allow EOS only (EOS logit 0, every other logit -inf)."""
    others = torch.cat([out[:, :eos], out[:, eos + 1 :]], 1)
    return [bool(o.isneginf().all()) and out[b, eos].item() == 0 for b, o in enumerate(others)]


def naive_stopped(generated: list[int], stops: list[str]) -> bool:
    text = b"".join(TOKENS[t] for t in generated)
    return any(stop.encode() in text for stop in stops)


def run_stop_strings(pipeline: Pipeline, prompts: list[list[int]], generated: list[list[int]]):
    """Call the pipeline as generation would; the forced flags after each call."""
    flags = []
    for step in range(len(generated[0]) + 1):
        ids = torch.tensor([p + g[:step] for p, g in zip(prompts, generated, strict=True)])
        flags.append(forced_rows(pipeline(torch.randn(len(prompts), 8), ids)))
    return flags


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


# ---------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------

EXAMPLES = [
    BadWords([[1], [0, 2, 3], "ab"]),
    SequenceBias([[[1, 3], 2.5], [[0], -1.0]]),
    ExponentialDecayLength(3, 1.5),
    ExponentialDecayLength(0, 0.9, eos_token_id=[4, 2]),
    StopStrings(["ab", "é\n"]),
    StopStrings(["b"], eos_token_id=2),
]


@pytest.mark.parametrize("processor", EXAMPLES, ids=repr)
def test_spec_round_trips_through_json_and_behaves_the_same(processor) -> None:
    spec = processor.to_spec()
    rebuilt = from_spec(json.loads(json.dumps(spec)))
    assert type(rebuilt) is type(processor) and rebuilt.to_spec() == spec
    generator = torch.Generator().manual_seed(0)
    pipelines = [Pipeline([processor], VOCAB), Pipeline([rebuilt], VOCAB)]
    ids = torch.tensor([[0, 1], [2, 0]])
    changed = False
    for _ in range(5):
        logits = torch.randn(2, 8, generator=generator)
        outs = [pipeline(logits.clone(), ids) for pipeline in pipelines]
        assert torch.equal(outs[0], outs[1])
        changed |= not torch.equal(outs[0], logits)
        ids = torch.cat([ids, torch.tensor([[2], [1]])], 1)  # row 0 generates "ab", row 1 "b"
    assert changed, "the example never changed the logits"


def test_a_single_stop_string_is_one_stop() -> None:
    assert StopStrings("ab").config() == {"stop_strings": ["ab"], "eos_token_id": None}
