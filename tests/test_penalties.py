"""anylogits.processors.penalties (RepetitionPenalty, PresencePenalty, FrequencyPenalty)
without a backend: validation, specs, prompt handling, row order, ragged rows, windows,
stacking (the transformers, vLLM, llama.cpp and mlx-lm comparisons are in
conformance_tests/test_oracles_penalties.py).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from sequence_fixtures import right_aligned

from anylogits import Pipeline, RepetitionPenalty, from_spec
from anylogits.core.batch import Batch
from anylogits.processors.penalties import FrequencyPenalty, PresencePenalty
from test_support.host_reads import TorchCalls


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: RepetitionPenalty(-1), "penalty must be a finite number > 0, got -1"),
        (lambda: RepetitionPenalty(1.2, context_size=0), "context_size must be >= 1, got 0"),
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


# RepetitionPenalty


def test_repetition_penalty_ignores_padding_of_ragged_rows() -> None:
    ids = torch.tensor([[9, 9, 1], [0, 2, 3]])  # row 0 is just [1]; 9 is padding
    logits = torch.full((2, 10), 2.0)
    out = Pipeline([RepetitionPenalty(2.0)])(logits, ids, lengths=torch.tensor([1, 3]))
    assert out[0].tolist() == [2, 1, 2, 2, 2, 2, 2, 2, 2, 2]
    assert out[1].tolist() == [1, 2, 1, 1, 2, 2, 2, 2, 2, 2]


def test_full_rows_need_no_lengths() -> None:
    """Without ``lengths`` every row fills the history, so the penalty neither builds
    nor reads them (a tensor and a host read per call saved); with them, the padding
    is still skipped (above)."""
    ids = torch.tensor([[9, 9, 1], [0, 2, 3]])
    batch = Batch(2, ids)
    out = RepetitionPenalty(2.0).process(torch.full((2, 10), 2.0), batch)
    assert batch._lengths is None  # never asked for
    assert out[0].tolist() == [2, 1, 2, 2, 2, 2, 2, 2, 2, 1]
    assert out[1].tolist() == [1, 2, 1, 1, 2, 2, 2, 2, 2, 2]


def test_repetition_penalty_context_size_counts_only_each_rows_last_tokens() -> None:
    # Row 0 is [1, 2, 3] (9 is padding), row 1 is [4, 1, 2, 5]; a window of 2 sees
    # [2, 3] and [2, 5], the prompt included.
    ids = torch.tensor([[9, 1, 2, 3], [4, 1, 2, 5]])
    logits = torch.full((2, 10), 2.0)
    out = Pipeline([RepetitionPenalty(2.0, context_size=2)])(
        logits, ids, lengths=torch.tensor([3, 4])
    )
    assert out[0].tolist() == [2, 2, 1, 1, 2, 2, 2, 2, 2, 2]
    assert out[1].tolist() == [2, 2, 1, 2, 2, 1, 2, 2, 2, 2]
    wide = Pipeline([RepetitionPenalty(2.0, context_size=50)])(torch.full((2, 10), 2.0), ids)
    assert torch.equal(wide, Pipeline([RepetitionPenalty(2.0)])(torch.full((2, 10), 2.0), ids))


def test_repetition_penalties_stack_only_with_one_context_size() -> None:
    same = [RepetitionPenalty(1.5, context_size=3), RepetitionPenalty(2.0, context_size=3)]
    assert RepetitionPenalty.stack(same) is not None
    mixed = [RepetitionPenalty(1.5, context_size=3), RepetitionPenalty(1.5)]
    assert RepetitionPenalty.stack(mixed) is None


def test_repetition_penalty_writes_out_in_one_scatter_without_copying_first() -> None:
    """transformers keeps its logits: the penalty reads them and writes rows and
    penalized columns to ``out`` in one out-of-place scatter, no ``copy_`` then edit."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 3, 7], [2, 2, 9], [0, 49, 48]])
    original, out = logits.clone(), torch.empty_like(logits)
    with TorchCalls() as calls:
        result = RepetitionPenalty(1.5).process_into(logits, Batch(3, ids), out)
    assert result.data_ptr() == out.data_ptr() and torch.equal(logits, original)
    assert torch.equal(result, RepetitionPenalty(1.5).process(logits.clone(), Batch(3, ids)))
    assert "copy_" not in calls.names and calls.names.count("scatter") == 1


def test_repetition_penalty_ignores_history_ids_beyond_the_logits_width() -> None:
    # An embedding wider than the LM head: ids 5 and 6 have no logit. Row 1 has no
    # usable id at all and must come back unchanged.
    ids = torch.tensor([[0, 5, 0, 5], [6, 5, 6, 5]])
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    penalized = Pipeline([RepetitionPenalty(2.0)])(logits.clone(), ids)
    assert penalized.tolist() == [[0.5, 2.0, 3.0], [1.0, 2.0, 3.0]]
