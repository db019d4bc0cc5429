"""anylogits.processors.bans (SuppressTokens, NoRepeatNGram, BadWords) against each
library's own: transformers' ``SuppressTokensLogitsProcessor``,
``NoRepeatNGramLogitsProcessor`` (hypothesis-drawn pairs, see ``transformers_cases``) and
``NoBadWordsLogitsProcessor``, and vLLM's ``bad_words``.

* ``BadWords`` vs ``NoBadWordsLogitsProcessor`` (no ``eos_token_id``: with one, the
  oracle drops one-token entries equal to EOS; pinned below): ``torch.equal``, on
  histories with a planted match (see ``sequence_draws``).
* vLLM's ``bad_words`` (pure-torch ``apply_bad_words``, run where vLLM is installed):
  identical when the prompt cannot take part in a match (vLLM matches generated tokens
  only; pinned below), and its leading-space variants are extra entries.
* A divergence the property tests found (history ids beyond the logits width) was
  fixed; a fixed example pins it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from anylogits import NoRepeatNGram, Pipeline, SuppressTokens
from anylogits.core.vocab import hf_vocabulary
from anylogits.processors import BadWords
from conformance_tests.comparisons import DTYPES, NEG_INF, assert_identical, dtype_id
from conformance_tests.oracle_draws import Draw, LogitSource, draw_shape
from conformance_tests.sequence_draws import SETTINGS as SEQUENCE_SETTINGS
from conformance_tests.sequence_draws import compare_once, draw_planted_inputs
from conformance_tests.transformers_cases import (
    Case,
    CaseBuilder,
    FixedExample,
    TransformersPairs,
    generated_cases,
    one_step,
)


def case_no_repeat_ngram(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    n = draw.int(1, 4)
    batch, vocab = draw_shape(draw, vocab)
    source = LogitSource(draw, batch, vocab, dtype)
    # Ids from a tiny range so that n-grams actually repeat.
    id_high = min(draw.int(1, 4), vocab)
    ids = source.ids(draw.int(1, 24), id_high)
    return Case(NoRepeatNGram(n), NoRepeatNGramLogitsProcessor(n), [(source.next(), ids)])


def case_suppress_tokens(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    vocab, steps = one_step(draw, dtype, vocab)
    token_ids = [draw.int(0, vocab - 1) for _ in range(draw.int(0, 5))]  # may repeat
    return Case(SuppressTokens(token_ids), SuppressTokensLogitsProcessor(token_ids), steps)


CASES: dict[str, CaseBuilder] = {
    "NoRepeatNGram": case_no_repeat_ngram,
    "SuppressTokens": case_suppress_tokens,
}


FIXED_EXAMPLES = {
    "NoRepeatNGram": FixedExample(
        NoRepeatNGram(2),
        NoRepeatNGramLogitsProcessor(2),
        [[0.0] * 6],
        [[5, 1, 2, 5]],
        [[0.0, NEG_INF, 0.0, 0.0, 0.0, 0.0]],
    ),
    "SuppressTokens": FixedExample(
        SuppressTokens([0, 2]),
        SuppressTokensLogitsProcessor([0, 2]),
        [[1.0, 1.0, 1.0]],
        [[0]],
        [[NEG_INF, 1.0, NEG_INF]],
    ),
}


# --------------------------------------------------------------------------------------
# transformers
# --------------------------------------------------------------------------------------


class TestTransformersPairs(TransformersPairs):
    """This module's pairs through the four checks every transformers pair runs."""

    cases = CASES
    fixed_examples = FIXED_EXAMPLES


@pytest.mark.only_backend("transformers")
def test_no_repeat_ngram_cases_do_ban_tokens() -> None:
    """Most generated NoRepeatNGram cases ban some token, so agreement is not vacuous."""
    cases = generated_cases(case_no_repeat_ngram, 100)
    share = sum(case.banned for case in cases) / len(cases)
    assert share >= 0.6, f"only {share:.0%} of NoRepeatNGram cases ban a token"


# Divergences found by the property tests, fixed, and pinned here.


@pytest.mark.only_backend("transformers")
def test_history_ids_beyond_logits_width() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0]])
    ids = torch.tensor([[0, 5, 0, 5]])
    expected = NoRepeatNGramLogitsProcessor(2)(ids, x.clone())  # [[-inf, 2, 3]]
    assert not torch.equal(expected, x)
    assert torch.equal(Pipeline([NoRepeatNGram(2)])(x.clone(), ids), expected)


@pytest.mark.only_backend("transformers")
@pytest.mark.support("oracle", processor="bad_words", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@SEQUENCE_SETTINGS
@given(data=st.data())
def test_bad_words_match_transformers(dtype: torch.dtype, data: st.DataObject) -> None:
    id_high = data.draw(st.integers(2, 6))
    words = data.draw(
        st.lists(
            st.lists(st.integers(0, id_high - 1), min_size=1, max_size=4), min_size=1, max_size=5
        )
    )
    planted = words[data.draw(st.integers(0, len(words) - 1))]
    logits, history, planted_fits = draw_planted_inputs(data, dtype, id_high, planted)
    if not planted_fits:
        words.append([planted[-1]])  # cannot be planted: ban it outright instead
    compare_once(BadWords(words), NoBadWordsLogitsProcessor(words), logits, history)


@pytest.mark.only_backend("transformers")
def test_bad_words_ban_eos_where_generate_would_drop_it() -> None:
    """transformers' ``generate`` passes ``eos_token_id``, and the oracle then drops a
    one-token entry equal to EOS; BadWords has no such exception."""
    logits, history = torch.zeros(1, 4), torch.tensor([[0]])
    oracle = NoBadWordsLogitsProcessor([[3], [1]], eos_token_id=3)(history, logits.clone())
    ours = Pipeline([BadWords([[3], [1]])])(logits.clone(), history)
    assert oracle[0].tolist() == [0, NEG_INF, 0, 0]
    assert ours[0].tolist() == [0, NEG_INF, 0, NEG_INF]


@pytest.mark.only_backend("transformers")
def test_string_bad_words_use_the_tokenizer_as_given(hf_tokenizer: Any) -> None:
    """Strings resolve as ``hf_tokenizer.encode(word, add_special_tokens=False)``: what
    transformers' docs tell users to pass as ``bad_words_ids`` (with or without a space)."""
    words = ["hello world", " hello world", "é"]
    ids = [hf_tokenizer.encode(word, add_special_tokens=False) for word in words]
    assert ids[0] != ids[1]
    vocab = hf_vocabulary(hf_tokenizer)
    for word_ids in ids:
        history = torch.tensor([[57, *word_ids[:-1]], [57] * len(word_ids)])
        logits = torch.zeros(2, vocab.size)
        expected = NoBadWordsLogitsProcessor(ids)(history, logits.clone())
        assert expected[0, word_ids[-1]] == NEG_INF
        ours = Pipeline([BadWords(words)], vocab)(logits.clone(), history)
        assert torch.equal(ours, expected)


# --------------------------------------------------------------------------------------
# vLLM's bad_words (only where vLLM is installed: its own venv)
# --------------------------------------------------------------------------------------


@pytest.mark.only_backend("vllm")
@pytest.mark.support("oracle", processor="bad_words", backend="vllm")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@SEQUENCE_SETTINGS
@given(data=st.data())
def test_bad_words_match_vllm_on_generated_tokens(dtype: torch.dtype, data: st.DataObject) -> None:
    bad_words_ops = pytest.importorskip("vllm.v1.sample.ops.bad_words")
    id_high = data.draw(st.integers(2, 6))
    words = data.draw(
        st.lists(
            st.lists(st.integers(0, id_high - 1), min_size=1, max_size=4), min_size=1, max_size=5
        )
    )
    planted = words[data.draw(st.integers(0, len(words) - 1))]
    # The prompt is id_high only (reserved: no word holds it), so it cannot take part in
    # a match.
    logits, generated, planted_fits = draw_planted_inputs(
        data, dtype, id_high, planted, reserved_ids=1
    )
    batch = generated.shape[0]
    prompt = torch.full((batch, data.draw(st.integers(1, 3))), id_high)
    if not planted_fits:
        words.append([planted[-1]])
    expected = logits.clone()
    bad_words_ops.apply_bad_words(expected, dict.fromkeys(range(batch), words), generated.tolist())
    assert not torch.equal(expected, logits), "the oracle left the logits unchanged"
    ours = Pipeline([BadWords(words)])(logits.clone(), torch.cat([prompt, generated], 1))
    assert_identical(logits, ours, expected)


@pytest.mark.only_backend("vllm")
def test_vllm_bad_words_differ_at_the_prompt_and_in_leading_spaces(hf_tokenizer: Any) -> None:
    """vLLM matches prefixes against generated tokens only, and adds the space-prefixed
    tokenization of each (left-stripped) word; BadWords takes entries as given."""
    pytest.importorskip("vllm")
    from vllm import SamplingParams
    from vllm.tokenizers.hf import get_cached_tokenizer
    from vllm.v1.sample.ops.bad_words import apply_bad_words

    logits = torch.zeros(1, 4)
    apply_bad_words(logits, {0: [[1, 2]]}, [[]])  # the prompt ends with 1: vLLM ignores it
    ours = Pipeline([BadWords([[1, 2]])])(torch.zeros(1, 4), torch.tensor([[0, 1]]))
    assert logits[0].tolist() == [0, 0, 0, 0]
    assert ours[0].tolist() == [0, 0, NEG_INF, 0]

    params = SamplingParams(bad_words=["hello world"])
    params.update_from_tokenizer(get_cached_tokenizer(hf_tokenizer))  # as vLLM wraps it
    plain = hf_tokenizer.encode("hello world", add_special_tokens=False)
    spaced = hf_tokenizer.encode(" hello world", add_special_tokens=False)
    assert params.bad_words_token_ids == [plain, spaced]
    # After " hello", only the entry written with the space bans " world".
    vocab = hf_vocabulary(hf_tokenizer)
    history = torch.tensor([[57, *spaced[:-1]]])
    x = torch.zeros(1, vocab.size)
    assert Pipeline([BadWords(["hello world"])], vocab)(x.clone(), history).eq(0).all()
    both = Pipeline([BadWords(["hello world", " hello world"])], vocab)
    assert both(x.clone(), history)[0, spaced[-1]] == NEG_INF
