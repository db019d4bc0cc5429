"""Processor behaviour that needs no oracle: validation, ragged rows, dtypes, widths."""

from __future__ import annotations

import math

import pytest
import torch

from anylogits import (
    LogitBias,
    MinNewTokens,
    MinP,
    NoRepeatNGram,
    Pipeline,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
    Vocabulary,
)
from anylogits.core.batch import Batch
from test_support.host_reads import TorchCalls

INF = math.inf


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Temperature(0), "temperature must be a finite number > 0, got 0"),
        (lambda: Temperature("hot"), "temperature must be a number, got 'hot'"),
        (lambda: TopK(0), "top_k must be >= 1, got 0"),
        (lambda: TopK(3, min_tokens_to_keep=0), "min_tokens_to_keep must be >= 1, got 0"),
        (lambda: TopP(1.5), r"top_p must lie in \(0, 1\], got 1.5"),
        (lambda: TopP(0.0), r"top_p must lie in \(0, 1\], got 0.0"),
        (lambda: MinP(-0.1), r"min_p must lie in \[0, 1\], got -0.1"),
        (lambda: RepetitionPenalty(-1), "penalty must be a finite number > 0, got -1"),
        (lambda: RepetitionPenalty(1.2, context_size=0), "context_size must be >= 1, got 0"),
        (lambda: NoRepeatNGram(0), "ngram_size must be >= 1, got 0"),
        (lambda: MinNewTokens(-1), "min_new_tokens must be >= 0, got -1"),
        (lambda: MinNewTokens(1, eos_token_id=[-2]), "eos_token_id must hold token ids"),
        (lambda: LogitBias({1: INF}), r"bias\[1\] must be finite, got inf"),
        (lambda: LogitBias({1: 1.0, "1": 2.0}), "names token id 1 twice"),
        (lambda: LogitBias([1]), "bias must be a dict"),
        (lambda: SuppressTokens("abc"), "token_ids must be a list of token ids"),
        (lambda: SuppressTokens([1.5]), r"token_ids must hold token ids .* got 1.5"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


VOCAB = Vocabulary(tokens=tuple(bytes([97 + i]) for i in range(5)), eos_token_ids=frozenset({4}))


@pytest.mark.parametrize(
    ("processor", "message"),
    [
        (SuppressTokens([7]), "token_ids holds token id 7, but the vocabulary has only 5"),
        (LogitBias({5: 1.0}), "bias holds token id 5, but the vocabulary has only 5"),
        (MinNewTokens(1, eos_token_id=9), "eos_token_id holds token id 9"),
    ],
)
def test_ids_outside_the_vocabulary_fail_at_bind_time(processor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Pipeline([processor], VOCAB)


def test_ids_outside_the_logits_fail_before_processing() -> None:
    with pytest.raises(ValueError, match="holds token id 7, but the logits row has only 4"):
        Pipeline([SuppressTokens([7])])(torch.zeros(1, 4))


def test_a_vocabulary_wider_than_the_logits_is_rejected() -> None:
    with pytest.raises(ValueError, match="logits width 3 is smaller than the vocabulary size 5"):
        Pipeline([Temperature(1.0)], VOCAB)(torch.zeros(1, 3))


def test_padded_logits_wider_than_the_vocabulary_are_fine() -> None:
    out = Pipeline([SuppressTokens([4])], VOCAB)(torch.zeros(2, 8))
    assert out[:, 4].eq(-INF).all() and out[:, 5:].eq(0).all()


def test_min_new_tokens_takes_eos_from_the_vocabulary() -> None:
    pipeline = Pipeline([MinNewTokens(1)], VOCAB)
    assert pipeline(torch.zeros(1, 5), torch.tensor([[0, 1]]))[0, 4] == -INF
    assert pipeline(torch.zeros(1, 5), torch.tensor([[0, 1, 2]]))[0, 4] == 0


def test_min_new_tokens_without_any_eos_explains_the_fix() -> None:
    with pytest.raises(ValueError, match="pass eos_token_id"):
        Pipeline([MinNewTokens(1)])(torch.zeros(1, 5), torch.tensor([[0]]))


def test_sequence_processors_need_the_history() -> None:
    with pytest.raises(ValueError, match=r"token history .* must be passed"):
        Pipeline([MinNewTokens(1, eos_token_id=0)])(torch.zeros(1, 5))


def test_min_new_tokens_counts_each_row_separately() -> None:
    pipeline = Pipeline([MinNewTokens(2, eos_token_id=0)])
    # Ragged rows as vLLM gives them: row 1 has a longer prompt, row 0 is ahead.
    prompts = torch.tensor([[7, 0], [3, 4]])  # row 0 is [0]; 7 is padding
    pipeline(torch.zeros(2, 3), prompts, lengths=torch.tensor([1, 2]))
    ids = torch.tensor([[0, 1, 2], [3, 4, 5]])
    out = pipeline(torch.zeros(2, 3), ids)
    assert out[:, 0].tolist() == [0, -INF]  # row 0 generated 2, row 1 only 1


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


def test_no_repeat_ngram_ignores_windows_in_the_padding() -> None:
    # Padding "5 6" would ban 6 after 5, but row 0 is only [5].
    ids = torch.tensor([[5, 6, 5], [5, 6, 5]])
    out = Pipeline([NoRepeatNGram(2)])(torch.zeros(2, 8), ids, lengths=torch.tensor([1, 3]))
    assert out[0].eq(0).all()
    assert out[1].tolist() == [0, 0, 0, 0, 0, 0, -INF, 0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_processors_keep_the_logits_dtype(dtype: torch.dtype) -> None:
    pipeline = Pipeline(
        [
            Temperature(0.8),
            RepetitionPenalty(1.2),
            NoRepeatNGram(2),
            LogitBias({3: 1.0}),
            SuppressTokens([0]),
            MinNewTokens(1, eos_token_id=1),
            TopK(20),
            TopP(0.9),
            MinP(0.01),
        ]
    )
    logits = torch.randn(3, 50).to(dtype)
    out = pipeline(logits, torch.randint(0, 50, (3, 6)))
    assert out.dtype == dtype and out.shape == (3, 50)
    assert out[:, 0].eq(-INF).all() and out[:, 1].eq(-INF).all()
    assert torch.isfinite(out).sum(-1).le(20).all()


def test_top_p_keeps_every_token_tied_at_the_boundary() -> None:
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0]])
    out = Pipeline([TopP(0.5)])(logits)
    assert torch.isfinite(out).tolist() == [[True, True, True, True, False]]


def test_top_p_grows_its_chunk_until_the_mass_is_reached() -> None:
    logits = torch.zeros(2, 1000)  # uniform: 900 tokens are needed for 0.9
    logits[1, 0] = 100.0  # one certain token
    out = Pipeline([TopP(0.9)])(logits)
    assert torch.isfinite(out).sum(-1).tolist() == [1000, 1]


def test_pipeline_rejects_non_processors_and_duplicates() -> None:
    with pytest.raises(TypeError, match="expected anylogits processors, got int"):
        Pipeline([3])  # type: ignore[list-item]
    top_k = TopK(2)
    with pytest.raises(ValueError, match="given twice"):
        Pipeline([top_k, top_k])


def test_pipelines_nest_and_run_in_order() -> None:
    inner = Pipeline([LogitBias({0: 10.0})])
    out = Pipeline([inner, TopK(1)])(torch.zeros(1, 3))
    assert out.tolist() == [[10.0, -INF, -INF]]


@pytest.mark.parametrize("processors", [[RepetitionPenalty(2.0), TopK(2), Temperature(0.5)], []])
def test_a_pipeline_writing_to_out_leaves_the_logits_untouched(processors: list) -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0], [0.5, -1.0, 4.0, 2.0]])
    ids = torch.tensor([[1, 3], [2, 2]])
    in_place = Pipeline(processors)(logits.clone(), ids)
    original = logits.clone()
    out = torch.full_like(logits, 9.0)
    result = Pipeline(processors)(logits, ids, out=out)
    assert torch.equal(result, in_place)
    assert result.data_ptr() == out.data_ptr()  # the first write went to `out`
    assert torch.equal(logits, original)


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


def test_logits_of_the_wrong_shape_or_dtype_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"logits must be \(batch, vocab\)"):
        Pipeline([TopK(1)])(torch.zeros(3))
    with pytest.raises(ValueError, match=r"dtype torch\.int64 is not supported"):
        Pipeline([TopK(1)])(torch.zeros(1, 3, dtype=torch.int64))


def test_history_ids_beyond_the_logits_width_are_ignored() -> None:
    # An embedding wider than the LM head: ids 5 and 6 have no logit. Row 1 has no
    # usable id at all and must come back unchanged.
    ids = torch.tensor([[0, 5, 0, 5], [6, 5, 6, 5]])
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    penalized = Pipeline([RepetitionPenalty(2.0)])(logits.clone(), ids)
    assert penalized.tolist() == [[0.5, 2.0, 3.0], [1.0, 2.0, 3.0]]
    banned = Pipeline([NoRepeatNGram(2)])(logits.clone(), ids)
    assert banned.tolist() == [[-INF, 2.0, 3.0], [1.0, 2.0, 3.0]]
