"""anylogits.core.pipeline: what a Pipeline checks before it runs (shapes, dtypes, widths,
the history), that it keeps the logits' dtype through a chain of processors, nests, and
writes to ``out`` without touching its input."""

from __future__ import annotations

import math

import pytest
import torch
from sequence_fixtures import FIVE_LETTERS

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
)

INF = math.inf


def test_a_vocabulary_wider_than_the_logits_is_rejected() -> None:
    with pytest.raises(ValueError, match="logits width 3 is smaller than the vocabulary size 5"):
        Pipeline([Temperature(1.0)], FIVE_LETTERS)(torch.zeros(1, 3))


def test_padded_logits_wider_than_the_vocabulary_are_fine() -> None:
    out = Pipeline([SuppressTokens([4])], FIVE_LETTERS)(torch.zeros(2, 8))
    assert out[:, 4].eq(-INF).all() and out[:, 5:].eq(0).all()


def test_sequence_processors_need_the_history() -> None:
    with pytest.raises(ValueError, match=r"token history .* must be passed"):
        Pipeline([MinNewTokens(1, eos_token_id=0)])(torch.zeros(1, 5))


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


def test_logits_of_the_wrong_shape_or_dtype_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"logits must be \(batch, vocab\)"):
        Pipeline([TopK(1)])(torch.zeros(3))
    with pytest.raises(ValueError, match=r"dtype torch\.int64 is not supported"):
        Pipeline([TopK(1)])(torch.zeros(1, 3, dtype=torch.int64))
