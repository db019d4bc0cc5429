"""A vocabulary of phrase tokens (answers, triggers, sentence ends) and a harness that moves,
forks, joins and resumes sequences, shared by the phrase processors' tests: ``test_forcing``
(ForceSequence, TriggerPhrase, ForceLastPhrase, MultipleChoice), ``test_length``
(GenLength) and ``test_bias`` (CiteFromPrompt)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from anylogits import Pipeline, Vocabulary, from_spec, to_specs
from anylogits.core.processor import LogitsProcessor

NEG_INF = -math.inf
TOKENS = (
    b"<s>", b"</s>", b"\n", b".", b"A", b"B", b"C", b"D", b" yes", b" no", b"An", b"swer",
    b":", b" Thanks", b"!", b"er:\n", b"It", b" is", b" a", b" sentence", b" new", b" line",
    b"x", b"y", b" z", b"<end>",
)  # fmt: skip
EOS, NEWLINE, DOT, COLON, END = 1, 2, 3, 12, 25
ID = {token.decode(): index for index, token in enumerate(TOKENS)}


def encode(text: str) -> list[int]:
    """Greedy longest match over the non-special tokens (enough for these tests)."""
    data, ids = text.encode(), []
    while data:
        match = max(
            (i for i, t in enumerate(TOKENS) if i > 1 and data.startswith(t)),
            key=lambda i: len(TOKENS[i]),
        )
        ids.append(match)
        data = data[len(TOKENS[match]) :]
    return ids


VOCAB = Vocabulary(
    tokens=TOKENS,
    eos_token_ids=frozenset({EOS}),
    special_token_ids=frozenset({0, 1}),
    bos_token_id=0,
    encode=encode,
)
V = len(TOKENS)


def only(logits: torch.Tensor) -> list[int]:
    """The finite columns of a 1-D row."""
    return torch.isfinite(logits).nonzero().flatten().tolist()


def only_boosted(row: torch.Tensor) -> dict[int, float]:
    return {i: row[i].item() for i in row.nonzero().flatten().tolist()}


def assert_spec_round_trips_through_json(processor: LogitsProcessor) -> None:
    spec = json.loads(json.dumps(processor.to_spec()))
    assert spec["type"] == processor.spec_name
    rebuilt = from_spec(spec)
    assert type(rebuilt) is type(processor)
    assert rebuilt.config() == processor.config()
    assert to_specs([rebuilt]) == [spec]


# --------------------------------------------------------------------------------------
# Sequences, not rows: moves, forks, joins, resumption
# --------------------------------------------------------------------------------------

INTERESTING = (EOS, NEWLINE, DOT, COLON, 4, 5, 6, 10, 11, END)
# Likely next tokens, so that multi-token triggers ("An" "swer" ":") get written.
FOLLOWERS = {10: 11, 11: COLON, 16: 17}


def model_logits(seed: int, prefix: list[int]) -> torch.Tensor:
    """What a model gives after ``prefix``: a function of the tokens alone (so beams and
    resumed sequences get the same logits), random, with spikes on the tokens the
    processors react to."""
    generator = torch.Generator().manual_seed(hash((seed, *prefix)) % 2**63)
    logits = torch.randn(V, generator=generator, dtype=torch.float64) * 2
    spikes = torch.rand(len(INTERESTING), generator=generator) < 0.3
    logits[torch.tensor(INTERESTING)[spikes]] += 6.0
    if prefix and prefix[-1] in FOLLOWERS:
        logits[FOLLOWERS[prefix[-1]]] += 9.0
    return logits.float()


@dataclass
class Sequence:
    prompt: list[int]
    start: int  # the call at which its first step runs
    steps: int = 8
    parent: int | None = None  # a fork: the sequence it copies up to its split
    split: int = 0  # a fork: its first step as a row of its own, where it takes another token


def reference_run(
    factory: Callable[[], LogitsProcessor], sequences: list[Sequence], seed: int
) -> tuple[list[list[torch.Tensor]], list[list[int]]]:
    """Each sequence alone in a fresh pipeline: outputs and token history per step."""
    outputs, histories = [], []
    for sequence in sequences:
        pipeline = Pipeline([factory()], VOCAB)
        history, outs = list(sequence.prompt), []
        for step in range(sequence.steps):
            logits = model_logits(seed, history)
            out = pipeline(logits[None].clone(), torch.tensor([history]))[0]
            outs.append(out)
            token = int(out.argmax())
            if sequence.parent is not None and step == sequence.split:
                token = (token + 1) % V  # the fork takes another token than its parent
            history.append(token)
        outputs.append(outs)
        histories.append(history)
    return outputs, histories


def batched_run(
    factory: Callable[[], LogitsProcessor],
    sequences: list[Sequence],
    histories: list[list[int]],
    seed: int,
    skip: Callable[[int], bool] = lambda step: False,
) -> dict[tuple[int, int], torch.Tensor]:
    """All sequences in one pipeline, rows shuffled at every call; a fork appears as a
    copy of its parent's row at its split. No row runs the steps ``skip`` names."""
    pipeline = Pipeline([factory()], VOCAB)
    shuffle = random.Random(seed)
    results = {}
    for call in range(max(s.start + s.steps for s in sequences)):
        rows = [
            (index, call - sequence.start)
            for index, sequence in enumerate(sequences)
            if sequence.split <= call - sequence.start < sequence.steps
            and not skip(call - sequence.start)
        ]
        if not rows:
            continue
        shuffle.shuffle(rows)
        prefixes = [histories[index][: len(sequences[index].prompt) + step] for index, step in rows]
        width = max(len(p) for p in prefixes)
        ids = torch.zeros(len(rows), width, dtype=torch.int64)
        for row, prefix in enumerate(prefixes):
            ids[row, width - len(prefix) :] = torch.tensor(prefix)
        logits = torch.stack([model_logits(seed, prefix) for prefix in prefixes])
        out = pipeline(logits, ids, lengths=torch.tensor([len(p) for p in prefixes]))
        for row, key in enumerate(rows):
            results[key] = out[row]
    return results


def family(seed: int) -> list[Sequence]:
    """Three roots of different prompt lengths (one is a multiple-choice question, one
    joins two calls late) and two forks (beams) splitting off at different steps."""
    rng = random.Random(seed)
    question = encode("x\nA. yes\nC. a\nB. no\nC. z\n")
    short = [rng.randrange(2, V) for _ in range(rng.randint(1, 5))]
    late = [rng.randrange(2, V) for _ in range(rng.randint(1, 5))]
    return [
        Sequence(question, start=0),
        Sequence(short, start=0),
        Sequence(late, start=2),
        Sequence(question, start=0, parent=0, split=3),
        Sequence(short, start=0, parent=1, split=rng.randint(1, 6)),
    ]


def _factory(processor: LogitsProcessor) -> Callable[[], LogitsProcessor]:
    return lambda: from_spec(processor.to_spec())


def assert_rows_match_each_sequence_run_alone(processor: LogitsProcessor, seed: int) -> None:
    """Shuffled, forked and joining rows give what each sequence gives run alone, and the
    processor changes some of them."""
    factory = _factory(processor)
    sequences = family(seed)
    reference, histories = reference_run(factory, sequences, seed)
    for fork in sequences[3:]:  # the reference forks share their parent's prefix
        assert fork.parent is not None
        split = len(fork.prompt) + fork.split
        assert histories[sequences.index(fork)][:split] == histories[fork.parent][:split]
        assert histories[sequences.index(fork)][split] != histories[fork.parent][split]
    batched = batched_run(factory, sequences, histories, seed)
    assert len(batched) == sum(s.steps - s.split for s in sequences)
    for (index, step), out in batched.items():
        assert torch.equal(out, reference[index][step]), (index, step)
    assert any(
        not torch.equal(
            out, model_logits(seed, histories[index][: len(sequences[index].prompt) + step])
        )
        for (index, step), out in batched.items()
    )


def assert_resumed_sequences_match_step_by_step(processor: LogitsProcessor, seed: int) -> None:
    """Steps 2..4 of every sequence get no call: the next call brings 3 new tokens at once,
    and the output is what a call at every step gives. (For processors whose state is
    derived from tokens alone.)"""
    factory = _factory(processor)
    sequences = family(seed)[:3]
    reference, histories = reference_run(factory, sequences, seed)
    batched = batched_run(factory, sequences, histories, seed, skip=lambda step: 2 <= step <= 4)
    assert len(batched) == sum(s.steps - 3 for s in sequences)
    for (index, step), out in batched.items():
        assert torch.equal(out, reference[index][step]), (index, step)


SequenceCheck = Callable[[LogitsProcessor, int], None]
# Both checks, for processors whose state is derived from tokens alone.
SEQUENCE_CHECKS: dict[str, SequenceCheck] = {
    "moved_forked_joined": assert_rows_match_each_sequence_run_alone,
    "resumed_after_skipped_calls": assert_resumed_sequences_match_step_by_step,
}


def across_sequence_checks(
    processors: list[LogitsProcessor],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Parametrizes a test of ``(check, processor, seed)`` over :data:`SEQUENCE_CHECKS`,
    ``processors`` and three seeds."""

    def parametrize(test: Callable[..., None]) -> Callable[..., None]:
        marks = (
            pytest.mark.parametrize("seed", range(3)),
            pytest.mark.parametrize("processor", processors, ids=repr),
            pytest.mark.parametrize(
                "check", list(SEQUENCE_CHECKS.values()), ids=list(SEQUENCE_CHECKS)
            ),
        )
        for mark in marks:
            test = mark(test)
        return test

    return parametrize
