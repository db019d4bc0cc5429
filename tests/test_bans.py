"""anylogits.processors.bans without an oracle: BadWords (validation, strings, ragged rows,
specs). Expected values come from a naive per-row reading of each docstring (written
here, not taken from the implementation); SuppressTokens and NoRepeatNGram are compared
with transformers in the conformance suite."""

from __future__ import annotations

import pytest
import torch
from sequence_fixtures import (
    BYTES_ONLY_VOCAB,
    FIVE_LETTERS,
    INF,
    TOKENS,
    VOCAB,
    assert_round_trips_and_behaves_the_same,
    naive_sequence_bias,
    right_aligned,
)

from anylogits import Pipeline, Vocabulary
from anylogits.processors import (
    BadWords,
    NoRepeatNGram,
    SuppressTokens,
)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: NoRepeatNGram(0), "ngram_size must be >= 1, got 0"),
        (lambda: SuppressTokens("abc"), "token_ids must be a list of token ids"),
        (lambda: SuppressTokens([1.5]), r"token_ids must hold token ids .* got 1.5"),
        (lambda: BadWords("ab"), "words must be a list of token-id lists or strings, got 'ab'"),
        (lambda: BadWords([[]]), r"words\[0\] must hold at least one token id, got \[\]"),
        (lambda: BadWords([[1], [-1]]), r"words\[1\] must hold token ids .* got -1"),
        (lambda: BadWords([""]), r"words\[0\] is an empty string"),
        (lambda: BadWords([[1.5]]), r"words\[0\] must hold token ids .* got 1.5"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    ("processor", "vocab", "message"),
    [
        (
            SuppressTokens([7]),
            FIVE_LETTERS,
            "token_ids holds token id 7, but the vocabulary has only 5",
        ),
        (BadWords([[1, 9]]), VOCAB, r"words\[0\] holds token id 9, but the vocabulary has only 8"),
        (BadWords(["ab"]), None, r"words\[0\] 'ab' is text, so it needs the model's tokenizer"),
        (BadWords(["ab"]), BYTES_ONLY_VOCAB, "or pass token ids"),
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
    [
        SuppressTokens([7]),
        BadWords([[1], [0, 7]]),
    ],
    ids=lambda p: type(p).__name__,
)
def test_ids_outside_the_logits_fail_before_processing(processor) -> None:
    with pytest.raises(ValueError, match="holds token id 7, but the logits row has only 4"):
        Pipeline([processor])(torch.zeros(1, 4), torch.tensor([[0]]))


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


def test_strings_are_tokenized_with_the_bound_vocabulary() -> None:
    pipeline = Pipeline([BadWords(["b c!", "é"])], VOCAB)  # [1, 3, 7] and [5, 6]
    out = pipeline(torch.zeros(3, 8), torch.tensor([[0, 1, 3], [2, 2, 5], [0, 1, 5]]))
    assert out.isneginf().nonzero().tolist() == [[0, 7], [1, 6], [2, 6]]


def test_bad_words_may_mix_strings_and_ids() -> None:
    out = Pipeline([BadWords(["ab", [0]])], VOCAB)(torch.zeros(1, 8), torch.tensor([[1]]))
    assert out.isneginf().nonzero().tolist() == [[0, 0], [0, 2]]


EXAMPLES = [
    BadWords([[1], [0, 2, 3], "ab"]),
]


@pytest.mark.parametrize("processor", EXAMPLES, ids=repr)
def test_spec_round_trips_through_json_and_behaves_the_same(processor) -> None:
    assert_round_trips_and_behaves_the_same(processor)


def test_no_repeat_ngram_ignores_windows_in_the_padding() -> None:
    # Padding "5 6" would ban 6 after 5, but row 0 is only [5].
    ids = torch.tensor([[5, 6, 5], [5, 6, 5]])
    out = Pipeline([NoRepeatNGram(2)])(torch.zeros(2, 8), ids, lengths=torch.tensor([1, 3]))
    assert out[0].eq(0).all()
    assert out[1].tolist() == [0, 0, 0, 0, 0, 0, -INF, 0]


def test_no_repeat_ngram_ignores_history_ids_beyond_the_logits_width() -> None:
    # An embedding wider than the LM head: ids 5 and 6 have no logit. Row 1 has no
    # usable id at all and must come back unchanged.
    ids = torch.tensor([[0, 5, 0, 5], [6, 5, 6, 5]])
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    banned = Pipeline([NoRepeatNGram(2)])(logits.clone(), ids)
    assert banned.tolist() == [[-INF, 2.0, 3.0], [1.0, 2.0, 3.0]]
