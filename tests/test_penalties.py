"""PresencePenalty and FrequencyPenalty (anylogits.processors.penalties) without a
backend: validation, specs, prompt handling, row order, ragged rows, stacking (the
llama.cpp comparison is in conformance_tests/test_oracles_penalties.py).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from sequence_fixtures import right_aligned

from anylogits import Pipeline, from_spec
from anylogits.core.batch import Batch
from anylogits.processors.penalties import FrequencyPenalty, PresencePenalty


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: PresencePenalty("a"), "penalty must be a number, got 'a'"),
        (lambda: PresencePenalty(math.nan), "penalty must be finite, got nan"),
        (lambda: FrequencyPenalty(True), "penalty must be a number, got True"),
        (lambda: FrequencyPenalty(-math.inf), "penalty must be finite, got -inf"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    "processor",
    [
        PresencePenalty(-0.5),
        FrequencyPenalty(1.25),
    ],
    ids=repr,
)
def test_specs_round_trip_through_json(processor) -> None:
    assert_spec_round_trips(processor)


def assert_spec_round_trips(processor) -> None:
    """``processor``'s spec, through JSON and back, builds the same processor."""
    spec = json.loads(json.dumps(processor.to_spec()))
    rebuilt = from_spec(spec)
    assert type(rebuilt) is type(processor)
    assert rebuilt.config() == processor.config()


# --------------------------------------------------------------------------------------
# Presence / frequency: a direct reference over generated tokens only.
# --------------------------------------------------------------------------------------


def expected_penalties(
    logits: torch.Tensor, outputs: list[list[int]], presence: float, frequency: float
) -> torch.Tensor:
    """OpenAI's definition, row by row in float64 (exact for the 1/4-step values used)."""
    out = logits.double().clone()
    for row, generated in enumerate(outputs):
        for token in set(generated):
            if token < out.shape[1]:
                out[row, token] -= frequency * generated.count(token) + presence
    return out.to(logits.dtype)


def run_generation(processors, prompts, outputs, logits, order=None):
    """First call: the prompts; second: prompt + output, rows in ``order``, ragged."""
    pipeline = Pipeline(processors)
    prompt_ids, prompt_lengths = right_aligned(prompts)
    first = pipeline(torch.zeros(len(prompts), logits.shape[1]), prompt_ids, lengths=prompt_lengths)
    assert torch.equal(first, torch.zeros_like(first))  # nothing generated yet
    order = list(range(len(prompts))) if order is None else order
    rows = [prompts[i] + outputs[i] for i in order]
    ids, lengths = right_aligned(rows)
    return pipeline(logits[order].clone(), ids, lengths=lengths)


PROMPTS = [[1, 2, 3], [4, 4], [5, 6, 7, 8, 1]]  # no prompt is a prefix of another
OUTPUTS = [[1, 1, 2], [9], [3, 1, 3, 3]]


@pytest.mark.parametrize("kind", ["presence", "frequency", "both"])
def test_only_generated_tokens_are_penalized(kind: str) -> None:
    presence = 0.75 if kind in ("presence", "both") else 0.0
    frequency = 0.5 if kind in ("frequency", "both") else 0.0
    processors = []
    if frequency:
        processors.append(FrequencyPenalty(frequency))
    if presence:
        processors.append(PresencePenalty(presence))
    logits = torch.randn(3, 12, generator=torch.Generator().manual_seed(0)).mul(4).round() / 4
    ours = run_generation(processors, PROMPTS, OUTPUTS, logits)
    expected = expected_penalties(logits, OUTPUTS, presence, frequency)
    assert not torch.equal(expected, logits)
    assert torch.equal(ours, expected)
    # Prompt-only tokens (4, 5, 6, 7, 8 of rows that did not generate them) are untouched.
    assert torch.equal(ours[1, [4]], logits[1, [4]])
    assert torch.equal(ours[2, 5:9], logits[2, 5:9])


@pytest.mark.parametrize("order", [[2, 0, 1], [1, 2, 0], [2, 1, 0]])
def test_reordered_rows_get_their_own_sequence_result(order: list[int]) -> None:
    logits = torch.randn(3, 12, generator=torch.Generator().manual_seed(1)).mul(4).round() / 4
    processors = [FrequencyPenalty(0.5), PresencePenalty(0.25)]
    ours = run_generation(processors, PROMPTS, OUTPUTS, logits, order)
    expected = expected_penalties(logits, OUTPUTS, 0.25, 0.5)[order]
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("cls", [PresencePenalty, FrequencyPenalty])
def test_stacked_rows_equal_each_row_alone(cls) -> None:
    penalties = [0.5, -1.25, 2.0]
    logits = torch.randn(3, 12, generator=torch.Generator().manual_seed(2))
    stacked = run_generation([cls.stack([cls(p) for p in penalties])], PROMPTS, OUTPUTS, logits)
    for row, penalty in enumerate(penalties):
        alone = run_generation(
            [cls(penalty)], [PROMPTS[row]], [OUTPUTS[row]], logits[row : row + 1]
        )
        assert torch.equal(stacked[row], alone[0])
    assert not torch.equal(stacked, logits)


@pytest.mark.parametrize("cls", [PresencePenalty, FrequencyPenalty])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_penalties_keep_the_dtype_and_match_float32_arithmetic(cls, dtype) -> None:
    logits = torch.randn(3, 12, generator=torch.Generator().manual_seed(3)).to(dtype)
    ours = run_generation([cls(0.3)], PROMPTS, OUTPUTS, logits)
    assert ours.dtype == dtype
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    presence, frequency = (0.3, 0.0) if cls is PresencePenalty else (0.0, 0.3)
    rate = torch.tensor(presence + frequency, dtype=wide).item()  # rounded like the oracles
    expected = logits.to(wide).clone()
    for row, generated in enumerate(OUTPUTS):
        for token in set(generated):
            count = generated.count(token) if frequency else 1
            expected[row, token] = expected[row, token] - torch.tensor(rate * count, dtype=wide)
    assert torch.equal(ours, expected.to(dtype))


@pytest.mark.parametrize("cls", [PresencePenalty, FrequencyPenalty])
def test_ids_beyond_the_logits_width_are_ignored(cls) -> None:
    logits = torch.zeros(1, 5)
    ours = run_generation([cls(1.0)], [[0]], [[7, 2, 9]], logits)
    assert ours[0].tolist() == [0.0, 0.0, -1.0, 0.0, 0.0]


def test_rows_without_usable_generated_ids_are_untouched() -> None:
    logits = torch.randn(2, 5, generator=torch.Generator().manual_seed(4))
    ours = run_generation([FrequencyPenalty(1.0)], [[1], [2, 3]], [[], [8]], logits)
    assert torch.equal(ours, logits)


def test_presence_needs_prompt_lengths_from_sequence_tracking() -> None:
    assert PresencePenalty(1.0).needs_sequences and FrequencyPenalty(1.0).needs_sequences
    batch = Batch(1, torch.tensor([[1, 2]]))
    with pytest.raises(RuntimeError, match="prompt lengths"):
        PresencePenalty(1.0).process(torch.zeros(1, 3), batch)
