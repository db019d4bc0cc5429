"""anylogits.processors.forcing without an oracle (logits-processor-zoo's are compared in
conformance_tests/test_oracles_forcing.py): ForceSequence, TriggerPhrase, ForceLastPhrase and
MultipleChoice. Validation, specs, doctests, what each one forces or boosts, and sequences
that move between rows, fork, join, skip calls or come back through an engine's draft
tokens."""

from __future__ import annotations

import doctest
import math

import pytest
import torch
from phrase_fixtures import (
    COLON,
    DOT,
    END,
    EOS,
    ID,
    NEG_INF,
    TOKENS,
    VOCAB,
    V,
    assert_resumed_sequences_match_step_by_step,
    assert_rows_match_each_sequence_run_alone,
    assert_spec_round_trips_through_json,
    encode,
    only,
)

import anylogits.processors.forcing as forcing_module
from anylogits import Pipeline, Vocabulary, from_spec, to_specs
from anylogits.adapters.vllm_requests import VllmRequests
from anylogits.core.processor import LogitsProcessor
from anylogits.processors import (
    ForceLastPhrase,
    ForceSequence,
    MultipleChoice,
    TriggerPhrase,
)

# --------------------------------------------------------------------------------------
# Validation, specs, doctests
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ForceSequence(""), "phrase must not be empty"),
        (lambda: ForceSequence([]), "phrase must hold at least one token id"),
        (lambda: ForceSequence([1, -2]), r"phrase must hold token ids \(ints >= 0\), got -2"),
        (lambda: ForceSequence(3), "phrase must be a list of token ids, got 3"),
        (lambda: ForceSequence([1], strict=1), "strict must be True or False, got 1"),
        (lambda: TriggerPhrase([1, 2], [3]), "trigger must be one token when trigger_after"),
        (lambda: TriggerPhrase([1], [3], trigger_count=0), "trigger_count must be >= 1, got 0"),
        (lambda: TriggerPhrase(".", "x", trigger_after="yes"), "trigger_after must be True or"),
        (lambda: ForceLastPhrase([1], eos_token_id=True), "eos_token_id must be a list of"),
        (lambda: MultipleChoice([]), "choices must hold at least one label"),
        (lambda: MultipleChoice("ABC"), "choices must be a list of labels, got 'ABC'"),
        (lambda: MultipleChoice(["A", 1.5]), r"choices\[1\] must be a token id or a non-empty"),
        (lambda: MultipleChoice(delimiter=-1), r"delimiter must hold token ids"),
        (lambda: MultipleChoice(boost_first_words=math.inf), "boost_first_words must be finite"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    ("processor", "vocab", "message"),
    [
        (ForceSequence(" Thanks"), None, "phrase ' Thanks' is text, so it needs the model's"),
        (TriggerPhrase("An", [3], trigger_after=True), None, "matches the text trigger 'An'"),
        (TriggerPhrase("Answer", [3]), VOCAB, "trigger 'Answer' must be one token, but the"),
        (TriggerPhrase([1], [V]), VOCAB, f"phrase holds token id {V}, but the vocabulary has"),
        (MultipleChoice(["A", "A"]), VOCAB, r"two choices are the same token: \[4, 4\]"),
        (MultipleChoice([4, 5], boost_first_words=1.0), None, "finds newline tokens"),
        (
            ForceLastPhrase([3]),
            Vocabulary(tokens=TOKENS),
            "ForceLastPhrase: the vocabulary has no EOS id; pass eos_token_id",
        ),
    ],
)
def test_bind_rejects_what_the_vocabulary_cannot_serve(
    processor: LogitsProcessor, vocab: Vocabulary | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Pipeline([processor], vocab)


def test_a_missing_eos_is_explained_when_it_is_needed() -> None:
    with pytest.raises(ValueError, match="does not know the EOS id"):
        Pipeline([ForceLastPhrase([3])])(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), torch.tensor([[0]]))


def test_a_leading_prefix_space_token_is_tolerated_in_one_token_text() -> None:
    # SentencePiece tokenizers encode "A" as ["▁", "A"] when they split the prefix space.
    spaced = Vocabulary(tokens=(b"<s>", b"</s>", b" ", b"A"), encode=lambda t: [2, 3])
    out = Pipeline([MultipleChoice(["A"])], spaced)(torch.zeros(1, 4), torch.tensor([[3]]))
    assert only(out[0]) == [3]


EXAMPLES = [
    ForceSequence(" Thanks!"),
    ForceSequence([8, 9], strict=False),
    TriggerPhrase(".", [13, 14]),
    TriggerPhrase("swer:", " Thanks", trigger_count=3, trigger_after=True, strict=False),
    TriggerPhrase([10, 11], [22], trigger_after=True),
    ForceLastPhrase(" Thanks!"),
    ForceLastPhrase([22, 23], eos_token_id=[1, 25], strict=False),
    MultipleChoice(["A", "B", "C"], boost_first_words=0.5),
    MultipleChoice([4, 5], delimiter=COLON, strict=False),
    MultipleChoice(),  # its default labels are not in VOCAB: specs only
]


@pytest.mark.parametrize("processor", EXAMPLES, ids=repr)
def test_specs_round_trip_through_json(processor: LogitsProcessor) -> None:
    assert_spec_round_trips_through_json(processor)


def test_spec_names() -> None:
    names = {type(p).__name__: p.spec_name for p in EXAMPLES}
    assert names == {
        "ForceSequence": "force_sequence",
        "TriggerPhrase": "trigger_phrase",
        "ForceLastPhrase": "force_last_phrase",
        "MultipleChoice": "multiple_choice",
    }


def test_a_bad_spec_names_the_field() -> None:
    with pytest.raises(ValueError, match="trigger_count must be >= 1"):
        from_spec({"type": "trigger_phrase", "trigger": [1], "phrase": [2], "trigger_count": 0})


def test_doctests_pass() -> None:
    result = doctest.testmod(forcing_module)
    assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------------------
# What each processor does
# --------------------------------------------------------------------------------------


def test_force_sequence_follows_each_rows_own_generated_length() -> None:
    pipeline = Pipeline([ForceSequence(" Thanks!")], VOCAB)  # [13, 14]
    # Two prompts of different lengths, right-aligned.
    ids, lengths = torch.tensor([[0, 4, 5], [0, 0, 6]]), torch.tensor([3, 1])
    out = pipeline(torch.zeros(2, V), ids, lengths=lengths)
    assert only(out[0]) == only(out[1]) == [13]
    # Row 1 is fed one token more: the first row forces its second token, the other row
    # (new prompt [6, 13, 14] reached in a jump from a known prefix) is done.
    ids, lengths = torch.tensor([[0, 4, 5, 13], [0, 6, 13, 14]]), torch.tensor([4, 3])
    out = pipeline(torch.zeros(2, V), ids, lengths=lengths)
    assert only(out[0]) == [14]
    assert torch.equal(out[1], torch.zeros(V))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_soft_forcing_raises_the_forced_token_over_the_row_and_lowers_the_rest(dtype) -> None:
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = Pipeline([ForceSequence([7], strict=False)])(logits.clone(), torch.tensor([[0]] * 3))
    forced, rest = out[:, 7], torch.cat([out[:, :7], out[:, 8:]], 1)
    # x + (max - x) is max up to the two roundings (the zoo's arithmetic).
    eps = torch.finfo(dtype).eps
    assert torch.allclose(forced.double(), logits.amax(1).double(), rtol=2 * eps, atol=0)
    assert torch.equal(out.argmax(1), torch.full((3,), 7))
    assert torch.equal(rest, logits.amin(1, keepdim=True).expand_as(rest))
    strict = Pipeline([ForceSequence([7])])(logits.clone(), torch.tensor([[0]] * 3))
    assert torch.equal(strict[:, 7], logits[:, 7])
    assert bool((torch.cat([strict[:, :7], strict[:, 8:]], 1) == NEG_INF).all())


def test_text_trigger_matches_bytes_across_and_inside_tokens() -> None:
    trigger = TriggerPhrase("er:", [22, 23], trigger_after=True, trigger_count=2)
    pipeline = Pipeline([trigger], VOCAB)
    history = [16]  # the prompt: "It"
    forced = []
    # "An" "swer" ":" -> fires after ":" (across tokens); then "x" "y" forced; then the
    # token "er:\n" holds the trigger inside it -> fires again; then "x" "y" again.
    for token in [10, 11, 12, 22, 23, 15, 22, 23, 12, 11, 12]:
        out = pipeline(torch.zeros(1, V), torch.tensor([history]))
        forced.append(only(out[0]) if len(only(out[0])) == 1 else None)
        history.append(token)
    assert forced == [None, None, None, [22], [23], None, [22], [23], None, None, None]


def test_id_trigger_fires_on_the_sequence_and_not_in_the_prompt() -> None:
    pipeline = Pipeline([TriggerPhrase([10, 11], [22], trigger_after=True)], VOCAB)
    out = pipeline(torch.zeros(1, V), torch.tensor([[10, 11]]))  # the prompt ends with it
    assert torch.equal(out, torch.zeros(1, V))
    out = pipeline(torch.zeros(1, V), torch.tensor([[10, 11, 10]]))
    assert torch.equal(out, torch.zeros(1, V))
    out = pipeline(torch.zeros(1, V), torch.tensor([[10, 11, 10, 11]]))
    assert only(out[0]) == [22]


def test_replacing_trigger_fires_on_the_top_choice_up_to_trigger_count() -> None:
    pipeline = Pipeline([TriggerPhrase(".", " Thanks!", trigger_count=2)], VOCAB)
    wants_dot = torch.zeros(1, V)
    wants_dot[0, DOT] = 5.0
    history, forced = [16], []
    for _ in range(9):
        out = pipeline(wants_dot.clone(), torch.tensor([history]))
        forced.append(only(out[0]) if len(only(out[0])) == 1 else None)
        history.append(int(out[0].argmax()))
    # Twice: " Thanks" replaces ".", then "!"; the third time "." goes through.
    assert forced[:4] == [[13], [14], [13], [14]]
    assert forced[4:] == [None] * 5
    assert history[5:] == [DOT] * 5


def test_force_last_phrase_replaces_the_first_eos_once_and_lets_the_next_one_end() -> None:
    pipeline = Pipeline([ForceLastPhrase(" Thanks!", eos_token_id=[EOS, END])], VOCAB)
    wants_end = torch.zeros(1, V)
    wants_end[0, END] = 5.0  # the second EOS id
    out = pipeline(wants_end.clone(), torch.tensor([[16, 17]]))
    assert only(out[0]) == [13]
    out = pipeline(wants_end.clone(), torch.tensor([[16, 17, 13]]))
    assert only(out[0]) == [14]
    out = pipeline(wants_end.clone(), torch.tensor([[16, 17, 13, 14]]))
    assert torch.equal(out, wants_end)


def test_force_last_phrase_does_not_start_on_a_first_token_the_model_chose() -> None:
    # The model writes " Thanks" itself (no EOS wanted): nothing is forced after it.
    pipeline = Pipeline([ForceLastPhrase(" Thanks!")], VOCAB)
    logits = torch.zeros(1, V)
    logits[0, 13] = 3.0
    pipeline(logits.clone(), torch.tensor([[16]]))
    out = pipeline(torch.zeros(1, V), torch.tensor([[16, 13]]))
    assert torch.equal(out, torch.zeros(1, V))


def test_multiple_choice_boosts_labels_by_their_first_words_found_in_order() -> None:
    prompt = encode("x\nA. yes\nC. a\nB. no\nC. z\n")
    pipeline = Pipeline([MultipleChoice(["A", "B", "C"], boost_first_words=0.5)], VOCAB)
    logits = torch.arange(V, dtype=torch.float64)[None] / 4
    out = pipeline(logits.clone(), torch.tensor([prompt]))
    assert only(out[0]) == [4, 5, 6]
    # A's word is " yes"; B is searched after A's line: " no"; C after B's line: " z".
    # The "C. a" line before B's does not count.
    word = {4: ID[" yes"], 5: ID[" no"], 6: ID[" z"]}
    assert {i: out[0, i].item() for i in (4, 5, 6)} == {
        label: logits[0, label].item() + 0.5 * logits[0, word[label]].item() for label in word
    }


# --------------------------------------------------------------------------------------
# Sequences, not rows: moves, forks, joins, resumption, engine drafts
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("processor", EXAMPLES[:-1], ids=repr)
def test_shuffled_forked_and_joining_rows_match_each_sequence_run_alone(
    processor: LogitsProcessor, seed: int
) -> None:
    assert_rows_match_each_sequence_run_alone(processor, seed)


TOKEN_DERIVED = [
    p
    for p in EXAMPLES[:-1]
    if not (
        isinstance(p, ForceLastPhrase) or (isinstance(p, TriggerPhrase) and not p.trigger_after)
    )
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("processor", TOKEN_DERIVED, ids=repr)
def test_sequences_resumed_after_skipped_calls_match_step_by_step(
    processor: LogitsProcessor, seed: int
) -> None:
    assert_resumed_sequences_match_step_by_step(processor, seed)


def test_a_replacing_trigger_resumes_a_phrase_it_started_after_skipped_calls() -> None:
    pipeline = Pipeline([ForceLastPhrase([22, 23, 24, 22])], VOCAB)
    wants_eos = torch.zeros(1, V)
    wants_eos[0, EOS] = 4.0
    assert only(pipeline(wants_eos.clone(), torch.tensor([[16]]))[0]) == [22]
    # The calls for "x" and "x y" were skipped (tokens taken without the hook).
    out = pipeline(wants_eos.clone(), torch.tensor([[16, 22, 23, 24]]))
    assert only(out[0]) == [22]


def test_tokens_appended_without_a_call_never_start_a_replacing_phrase() -> None:
    # Documented: a prefix the processor never saw counts as "not forced", even when
    # its next token is the phrase's first.
    pipeline = Pipeline([ForceLastPhrase([22, 23])], VOCAB)
    pipeline(torch.zeros(1, V), torch.tensor([[16]]))
    out = pipeline(torch.zeros(1, V), torch.tensor([[16, 17, 22]]))
    assert torch.equal(out, torch.zeros(1, V))


def test_engine_drafts_accepted_later_continue_a_phrase_started_at_a_draft() -> None:
    # vLLM's request table: the phrase starts at a draft position (the model wants EOS
    # after draft token 17); the engine accepts the draft and the forced token. When it
    # commits them, the states are rebuilt from tokens: the decision must be found.
    requests = VllmRequests(VOCAB)
    output: list[int] = []
    requests.add(
        0,
        {"anylogits": to_specs([ForceLastPhrase([22, 23, 24])])},
        prompt_ids=[16],
        output_ids=output,
    )
    logits = torch.zeros(2, V)
    logits[1, EOS] = 5.0  # after the draft
    out = requests.process(logits, [0, 0], drafts=[[], [17]])
    assert len(only(out[0])) == V and only(out[1]) == [22]
    output.extend([17, 22])
    out = requests.process(torch.zeros(1, V), [0], drafts=[[]])
    assert only(out[0]) == [23]
