"""Drawing the inputs of the token-sequence oracles (``test_oracles_bans``, ``_bias``,
``_length``): logits, histories with a planted match, and the tiny model's tokenizer.

Ours runs through ``Pipeline([processor])(logits.clone(), input_ids)`` (what the
transformers adapter does), the oracle as transformers calls it, with the full
``(B, L)`` history. Inputs vary batch size (1-6), vocabulary width, dtype (float32,
float16, bfloat16, float64) and history; ids come from a small range so that prefixes
really match, and every case plants a match in row 0, so the oracle must change the
logits (asserted before the comparison: a no-op cannot pass).
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from anylogits import Pipeline
from conformance_tests.comparisons import NEG_INF, assert_identical, oracle_settings

SETTINGS = oracle_settings(40)


def draw_logits(data: st.DataObject, batch: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Normal logits at a drawn scale; sometimes 0.5 steps (exact ties) or some ``-inf``."""
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32 - 1)))
    scale = data.draw(st.sampled_from((0.5, 2.0, 8.0)))
    kind = data.draw(st.sampled_from(("normal", "ties", "neg_inf")))
    x = torch.randn(batch, vocab, generator=generator, dtype=torch.float64) * scale
    if kind == "ties":
        x = (x * 2).round() / 2
    if kind == "neg_inf":
        x = x.masked_fill(torch.rand(batch, vocab, generator=generator) < 0.3, NEG_INF)
    return x.to(dtype)


def draw_history(data: st.DataObject, batch: int, id_high: int, length: int) -> torch.Tensor:
    ids = st.lists(st.integers(0, id_high - 1), min_size=length, max_size=length)
    return torch.tensor(data.draw(st.lists(ids, min_size=batch, max_size=batch)))


def plant(history: torch.Tensor, sequence: list[int]) -> None:
    """Make row 0 end with the prefix of ``sequence`` (so its last token is affected)."""
    prefix = sequence[:-1]
    if prefix and len(prefix) <= history.shape[1]:
        history[0, history.shape[1] - len(prefix) :] = torch.tensor(prefix)


def compare_once(ours: Any, oracle: Any, logits: torch.Tensor, history: torch.Tensor) -> None:
    expected = oracle(history, logits.clone())
    assert not torch.equal(expected, logits), "the oracle left the logits unchanged"
    assert_identical(logits, Pipeline([ours])(logits.clone(), history), expected)


SEQUENCES = st.lists(st.integers(0, 5), min_size=1, max_size=4)


def draw_sequence_shape(data: st.DataObject, id_high: int) -> tuple[int, int, int]:
    batch = data.draw(st.integers(1, 6))
    vocab = data.draw(st.sampled_from((id_high + 1, 8, 17, 64, 300)))
    length = data.draw(st.integers(1, 12))
    return batch, vocab, length


def draw_planted_inputs(
    data: st.DataObject,
    dtype: torch.dtype,
    id_high: int,
    planted: list[int],
    reserved_ids: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Logits and a history of ids below ``id_high`` (the vocabulary also holds
    ``reserved_ids`` ids above them), with row 0 ending in the prefix of ``planted`` and
    the logit of its last token at 1.0 (finite, so that a ban or a bias on it shows).

    The flag says whether the prefix fit in the history; where it did not, the caller adds
    a one-token entry for ``planted[-1]``, so that the oracle still changes row 0.
    """
    batch, vocab, length = draw_sequence_shape(data, id_high + reserved_ids)
    history = draw_history(data, batch, id_high, length)
    plant(history, planted)
    logits = draw_logits(data, batch, vocab, dtype)
    logits[0, planted[-1]] = 1.0
    return logits, history, len(planted) - 1 <= length
