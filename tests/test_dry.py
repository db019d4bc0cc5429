"""DRY (anylogits.processors.dry) without a backend: validation, specs, and DRY against a
direct transcription of its definition on ragged batches (the llama.cpp comparison is in
conformance_tests/test_oracles_dry.py).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from sequence_fixtures import right_aligned
from test_penalties import assert_spec_round_trips

from anylogits import Pipeline, Vocabulary
from anylogits.processors.dry import DRY, breaker_table


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DRY(-1), r"multiplier must be >= 0.0, got -1"),
        (lambda: DRY(math.inf), "multiplier must be finite, got inf"),
        (lambda: DRY(1, base=0.5), r"base must be >= 1.0, got 0.5"),
        (lambda: DRY(1, allowed_length=-1), "allowed_length must be >= 0, got -1"),
        (lambda: DRY(1, allowed_length=1.5), "allowed_length must be an integer, got 1.5"),
        (lambda: DRY(1, sequence_breakers="\n"), "sequence_breakers must be a list of strings"),
        (lambda: DRY(1, sequence_breakers=["\n", ""]), "non-empty strings, got ''"),
        (lambda: DRY(1, sequence_breakers=[10]), "non-empty strings, got 10"),
        (lambda: DRY(1, penalty_last_n=-2), "penalty_last_n must be >= -1, got -2"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    "processor",
    [
        DRY(0.8),
        DRY(1.5, base=2.0, allowed_length=0, sequence_breakers=["\n\n", "é"], penalty_last_n=64),
    ],
    ids=repr,
)
def test_specs_round_trip_through_json(processor) -> None:
    assert_spec_round_trips(processor)


# --------------------------------------------------------------------------------------
# DRY against its definition, on one-character tokens (each breaker is one token).
# --------------------------------------------------------------------------------------

LETTERS = "abcdefgh\n:"
TOY = Vocabulary(tuple(ch.encode() for ch in LETTERS))
NEWLINE, COLON = LETTERS.index("\n"), LETTERS.index(":")


def dry_by_definition(
    logits: np.ndarray,
    history: list[int],
    multiplier: float,
    base: float,
    allowed: int,
    breakers: set[int],
    last_n: int,
) -> np.ndarray:
    """One row, straight from the definition (quadratic, float32 like llama.cpp)."""
    out = logits.copy()
    window = [] if last_n == 0 or multiplier == 0 else history[-last_n:] if last_n > 0 else history
    n = len(window)
    limit = n
    for position in range(n - 1, -1, -1):
        if window[position] in breakers:
            limit = n - 1 - position
            break
    longest: dict[int, int] = {}
    for j in range(n - 1):
        length = 0
        while length <= j and window[j - length] == window[n - 1 - length]:
            length += 1
        length = min(length, limit)
        follower = window[j + 1]
        if length >= allowed and follower not in breakers:
            longest[follower] = max(longest.get(follower, -1), length)
    for token, length in longest.items():
        if token < len(out):
            m, b = float(np.float32(multiplier)), float(np.float32(base))
            penalty = np.float32(m * b ** (length - allowed))
            out[token] = np.float32(out[token] - penalty)
    return out


def random_history(rng: random.Random) -> list[int]:
    letters = rng.randint(2, len(LETTERS))
    history = [rng.randrange(letters) for _ in range(rng.randint(1, 30))]
    if rng.random() < 0.6:  # loops, the case DRY is for
        segment = [rng.randrange(letters) for _ in range(rng.randint(1, 6))]
        history += segment * rng.randint(2, 12)
    return history


@pytest.mark.parametrize("seed", range(40))
def test_dry_matches_its_definition_on_ragged_batches(seed: int) -> None:
    rng = random.Random(seed)
    breakers = rng.choice([("\n", ":"), (), ("\n",)])
    dry = DRY(
        rng.choice([0.5, 0.8, 1.3]),
        base=rng.choice([1.0, 1.75, 2.5]),
        allowed_length=rng.randint(0, 4),
        sequence_breakers=breakers,
        penalty_last_n=rng.choice([-1, -1, 0, 1, 5, 20]),
    )
    histories = [random_history(rng) for _ in range(rng.randint(1, 5))]
    width = rng.choice([len(LETTERS), len(LETTERS) + 3])  # padded logits too
    logits = torch.randn(len(histories), width, generator=torch.Generator().manual_seed(seed))
    ids, lengths = right_aligned(histories)
    ours = Pipeline([dry], TOY)(logits.clone(), ids, lengths=lengths)
    breaker_ids = {LETTERS.index(b) for b in breakers}
    for row, history in enumerate(histories):
        expected = dry_by_definition(
            logits[row].numpy(),
            history,
            dry.multiplier,
            dry.base,
            dry.allowed_length,
            breaker_ids,
            dry.penalty_last_n,
        )
        np.testing.assert_array_equal(ours[row].numpy(), expected)


def test_dry_generated_cases_do_penalize() -> None:
    """Most of the seeded cases above change the logits: agreement is not vacuous."""
    changed = 0
    for seed in range(40):
        rng = random.Random(seed)
        history = random_history(rng)
        logits = np.zeros(len(LETTERS), dtype=np.float32)
        changed += not np.array_equal(
            dry_by_definition(logits, history, 0.8, 1.75, 2, {NEWLINE, COLON}, -1), logits
        )
    assert changed >= 20


def test_dry_penalty_grows_with_the_repeat_length() -> None:
    a, b, c, d = 0, 1, 2, 3
    dry = Pipeline([DRY(1.0, base=2.0, allowed_length=1, sequence_breakers=())])
    # "abcd abc": d would make "abc" (3 tokens) a 4-token repeat: 1 * 2 ** (3 - 1).
    out = dry(torch.zeros(1, 5), torch.tensor([[a, b, c, d, a, b, c]]))
    assert out[0].tolist() == [0.0, 0.0, 0.0, -4.0, 0.0]


def test_dry_repeats_stop_at_breakers_and_breakers_are_never_penalized() -> None:
    a, b, c = 0, 1, 2
    history = torch.tensor([[a, b, NEWLINE, a, b, c, a, b]])
    with_breakers = Pipeline([DRY(1.0)], TOY)(torch.zeros(1, len(LETTERS)), history)
    # "ab" repeats twice: the newline after the first is a breaker, c after the second.
    assert with_breakers[0].tolist() == [0.0, 0.0, -1.0] + [0.0] * (len(LETTERS) - 3)
    without = Pipeline([DRY(1.0, sequence_breakers=())], TOY)(torch.zeros(1, len(LETTERS)), history)
    assert without[0, NEWLINE] == -1.0


def test_dry_breakers_spanning_tokens_use_the_tokenizer() -> None:
    """Breaker "\\n##": a token ending in "\\n" followed by the tokens of "##"."""
    pieces = ["a", "b", "c", "x\n", "##", "#"]

    def encode(text: str) -> list[int]:  # greedy longest match: "##" -> [4]
        ids, rest = [], text
        while rest:
            piece = max((p for p in pieces if rest.startswith(p)), key=len)
            ids.append(pieces.index(piece))
            rest = rest[len(piece) :]
        return ids

    vocab = Vocabulary(tuple(p.encode() for p in pieces), encode=encode)
    table = breaker_table(vocab, ("\n##",))
    assert table.single == frozenset() and table.tails == {(4,): frozenset({3})}
    a, b, c, x_newline, hashes = 0, 1, 2, 3, 4
    # "ab x\n ## c ab x\n ## c": the whole second half repeats the first, but the breaker
    # "x\n ##" leaves only "c" after it: a 1-token repeat, below allowed_length 2.
    history = torch.tensor([[a, b, x_newline, hashes, c] * 2])
    with_breaker = Pipeline([DRY(1.0, sequence_breakers=["\n##"])], vocab)
    assert torch.equal(with_breaker(torch.zeros(1, 6), history), torch.zeros(1, 6))
    without = Pipeline([DRY(1.0, sequence_breakers=[])], vocab)(torch.zeros(1, 6), history)
    assert without[0, a] == -(1.75**3)  # "ab x\n ## c" (5 tokens) would continue with a


def test_dry_window_only_searches_the_last_tokens() -> None:
    a, b, c = 0, 1, 2
    history = torch.tensor([[a, b, c, 3, 4, 5, a, b]])
    whole = Pipeline([DRY(1.0, sequence_breakers=())])(torch.zeros(1, 6), history)
    windowed = Pipeline([DRY(1.0, sequence_breakers=(), penalty_last_n=5)])(
        torch.zeros(1, 6), history
    )
    assert whole[0, c] == -1.0
    assert torch.equal(windowed, torch.zeros(1, 6))


@pytest.mark.parametrize("dry", [DRY(0.0), DRY(1.0, penalty_last_n=0)], ids=repr)
def test_dry_zero_multiplier_or_window_is_a_no_op(dry: DRY) -> None:
    history = torch.tensor([[0, 1, 2, 0, 1]])
    assert torch.equal(Pipeline([dry], TOY)(torch.zeros(1, 10), history), torch.zeros(1, 10))


def test_dry_stacked_rows_equal_each_row_alone() -> None:
    dries = [
        DRY(0.5, allowed_length=1),
        DRY(1.25, base=3.0, penalty_last_n=6),
        DRY(2.0, base=1.0, allowed_length=0),
    ]
    for dry in dries:
        dry.bind(TOY)
    stacked = DRY.stack(dries)
    assert stacked is not None
    histories = [[0, 1, 2, 0, 1], [3, 4, 8, 3, 4, 5, 3, 4], [1, 1, 1, 1]]
    logits = torch.randn(3, len(LETTERS), generator=torch.Generator().manual_seed(5))
    ids, lengths = right_aligned(histories)
    together = Pipeline([stacked], TOY)(logits.clone(), ids, lengths=lengths)
    for row, dry in enumerate(dries):
        alone = Pipeline([dry], TOY)(logits[row : row + 1].clone(), torch.tensor([histories[row]]))
        assert torch.equal(together[row], alone[0])
    assert not torch.equal(together, logits)
    assert DRY.stack([DRY(1.0), DRY(1.0, sequence_breakers=())]) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dry_keeps_the_dtype(dtype: torch.dtype) -> None:
    logits = torch.zeros(1, len(LETTERS), dtype=dtype)
    out = Pipeline([DRY(0.5)], TOY)(logits, torch.tensor([[0, 1, 2, 0, 1]]))
    assert out.dtype == dtype and out[0, 2] == -0.5


def test_dry_needs_a_vocabulary_for_its_breakers() -> None:
    history = torch.tensor([[0, 1, 2, 0, 1]])
    with pytest.raises(ValueError, match="DRY needs the model's vocabulary"):
        Pipeline([DRY(1.0)])(torch.zeros(1, 3), history)
    # Without breakers there is nothing to look up.
    assert Pipeline([DRY(1.0, sequence_breakers=())])(torch.zeros(1, 3), history)[0, 2] == -1.0


def test_dry_breaker_spanning_tokens_without_a_tokenizer_fails_at_bind() -> None:
    vocab = Vocabulary((b"a", b"x\n", b"#"))
    with pytest.raises(ValueError, match=r"'\\n#'.*no tokenizer"):
        Pipeline([DRY(1.0, sequence_breakers=["\n#"])], vocab)


def test_dry_ignores_ids_beyond_the_logits_width() -> None:
    history = torch.tensor([[7, 0, 1, 7, 0]])  # 7 has no logit; "7 0" repeats, 1 follows
    out = Pipeline([DRY(1.0, sequence_breakers=())])(torch.zeros(1, 3), history)
    assert out[0].tolist() == [0.0, -1.0, 0.0]


def test_breaker_tables_are_resolved_once_per_vocabulary() -> None:
    assert breaker_table(TOY, ("\n",)) is breaker_table(TOY, ("\n",))
    assert breaker_table(TOY, ("\n",)).single == frozenset({NEWLINE})


def test_breaker_tables_per_vocabulary_are_bounded() -> None:
    first = breaker_table(TOY, ("\n", "0"))
    for index in range(300):
        breaker_table(TOY, ("\n", str(index)))
    assert breaker_table(TOY, ("\n",)) is breaker_table(TOY, ("\n",))
    assert breaker_table(TOY, ("\n", "0")) is not first  # dropped, resolved again
