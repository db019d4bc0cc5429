"""Sequence processors against their transformers oracles, on identical inputs.

Ours runs through ``Pipeline([processor])(logits.clone(), input_ids)`` (what the
transformers adapter does), the oracle as transformers calls it, with the full
``(B, L)`` history. Inputs vary batch size (1-6), vocabulary width, dtype (float32,
float16, bfloat16, float64) and history; ids come from a small range so that prefixes
really match, and every case plants a match in row 0, so the oracle must change the
logits (asserted before the comparison: a no-op cannot pass).

* ``BadWords`` vs ``NoBadWordsLogitsProcessor`` (no ``eos_token_id``: with one, the
  oracle drops one-token entries equal to EOS; pinned below) and ``SequenceBias`` vs
  ``SequenceBiasLogitsProcessor``: ``torch.equal``. Biases are float32-representable:
  the oracle stores them in float32 (for float64 logits it adds ``float32(bias)``, ours
  the exact bias; pinned below).
* ``ExponentialDecayLength`` vs ``ExponentialDecayLengthPenalty``, over a simulated
  generation (the prompt call, then one call per token): ``torch.equal``.
* ``StopStrings`` vs ``StopStringCriteria`` with the tiny model's tokenizer, on token
  sequences drawn without a model: the criterion stops generation after the first token
  that completes a stop string; ours must force EOS (EOS logit 0, every other ``-inf``)
  from exactly the next call on, and leave every other row and call untouched. Prompts
  share no byte with the stop strings, since the criterion also matches stop strings that
  begin in the prompt and ours does not (pinned below).
* vLLM's ``bad_words`` (pure-torch ``apply_bad_words``, run where vLLM is installed):
  identical when the prompt cannot take part in a match (vLLM matches generated tokens
  only; pinned below), and its leading-space variants are extra entries.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    ExponentialDecayLengthPenalty,
    NoBadWordsLogitsProcessor,
    SequenceBiasLogitsProcessor,
)
from transformers.generation.stopping_criteria import StopStringCriteria

from anylogits import Pipeline
from anylogits.core.vocab import hf_vocabulary
from anylogits.processors import (
    BadWords,
    ExponentialDecayLength,
    SequenceBias,
    StopStrings,
)
from conformance_tests.comparisons import (
    DTYPES,
    NEG_INF,
    assert_identical,
    dtype_id,
    oracle_settings,
)

pytestmark = pytest.mark.only_backend("transformers")

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


# ---------------------------------------------------------------------------------------
# BadWords and SequenceBias
# ---------------------------------------------------------------------------------------

SEQUENCES = st.lists(st.integers(0, 5), min_size=1, max_size=4)


def draw_shape(data: st.DataObject, id_high: int) -> tuple[int, int, int]:
    batch = data.draw(st.integers(1, 6))
    vocab = data.draw(st.sampled_from((id_high + 1, 8, 17, 64, 300)))
    length = data.draw(st.integers(1, 12))
    return batch, vocab, length


@pytest.mark.support("oracle", processor="bad_words", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@SETTINGS
@given(data=st.data())
def test_bad_words_match_transformers(dtype: torch.dtype, data: st.DataObject) -> None:
    id_high = data.draw(st.integers(2, 6))
    words = data.draw(
        st.lists(
            st.lists(st.integers(0, id_high - 1), min_size=1, max_size=4), min_size=1, max_size=5
        )
    )
    batch, vocab, length = draw_shape(data, id_high)
    history = draw_history(data, batch, id_high, length)
    planted = words[data.draw(st.integers(0, len(words) - 1))]
    plant(history, planted)
    logits = draw_logits(data, batch, vocab, dtype)
    logits[0, planted[-1]] = 1.0  # finite, so banning it shows
    if len(planted) - 1 > length:
        words.append([planted[-1]])  # cannot be planted: ban it outright instead
    compare_once(BadWords(words), NoBadWordsLogitsProcessor(words), logits, history)


BIASES = st.one_of(
    st.sampled_from((-100.0, 100.0, -1e4, 1e4, 5.0, -1.5, 0.25, 0.0)),
    st.floats(-50.0, 50.0, width=32),
)


@pytest.mark.support("oracle", processor="sequence_bias", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@SETTINGS
@given(data=st.data())
def test_sequence_bias_matches_transformers(dtype: torch.dtype, data: st.DataObject) -> None:
    id_high = data.draw(st.integers(2, 6))
    sequences = data.draw(
        st.lists(
            st.lists(st.integers(0, id_high - 1), min_size=1, max_size=4).map(tuple),
            min_size=0,
            max_size=6,
            unique=True,
        )
    )
    # The planted entry ends in a column of its own with a bias that must show at 1.0.
    planted = [*data.draw(st.lists(st.integers(0, id_high - 1), max_size=3)), id_high]
    planted_bias = data.draw(st.sampled_from((-1.0, 1.0))) * data.draw(
        st.floats(0.25, 50.0, width=32)
    )
    pairs = [[list(s), float(data.draw(BIASES))] for s in sequences]
    pairs.insert(data.draw(st.integers(0, len(pairs))), [planted, planted_bias])
    batch, vocab, length = draw_shape(data, id_high)
    history = draw_history(data, batch, id_high, length)
    plant(history, planted)
    logits = draw_logits(data, batch, vocab, dtype)
    logits[0, planted[-1]] = 1.0
    if len(planted) - 1 > length:
        pairs.append([[planted[-1]], planted_bias])  # cannot be planted: bias it always
    compare_once(SequenceBias(pairs), SequenceBiasLogitsProcessor(pairs), logits, history)


def test_sequence_bias_sums_biases_on_one_token_in_the_oracles_order() -> None:
    """Three biases meet on token 2 in float16: 2048 + 1 + 1 rounds to 2048 when added
    in this order (each 1 is half an ulp, ties to even), to 2050 in another. The oracle
    adds one-token entries, then prefix length 2, then 1 (first appearance)."""
    pairs = [[[1, 1, 2], 1.0], [[1, 2], 1.0], [[2], 2048.0]]
    history = torch.tensor([[1, 1]])
    logits = torch.zeros(1, 3, dtype=torch.float16)
    expected = SequenceBiasLogitsProcessor(pairs)(history, logits.clone())
    assert expected[0, 2].item() == 2048.0
    assert torch.equal(Pipeline([SequenceBias(pairs)])(logits.clone(), history), expected)


def test_sequence_bias_float64_adds_the_exact_bias_where_oracle_adds_float32() -> None:
    pairs = [[[0, 1], 0.1]]
    history = torch.tensor([[0]])
    logits = torch.zeros(1, 2, dtype=torch.float64)
    oracle = SequenceBiasLogitsProcessor(pairs)(history, logits.clone())
    ours = Pipeline([SequenceBias(pairs)])(logits.clone(), history)
    assert oracle[0, 1].item() == torch.tensor(0.1, dtype=torch.float32).item() != 0.1
    assert ours[0, 1].item() == 0.1


def test_bad_words_ban_eos_where_generate_would_drop_it() -> None:
    """transformers' ``generate`` passes ``eos_token_id``, and the oracle then drops a
    one-token entry equal to EOS; BadWords has no such exception."""
    logits, history = torch.zeros(1, 4), torch.tensor([[0]])
    oracle = NoBadWordsLogitsProcessor([[3], [1]], eos_token_id=3)(history, logits.clone())
    ours = Pipeline([BadWords([[3], [1]])])(logits.clone(), history)
    assert oracle[0].tolist() == [0, NEG_INF, 0, 0]
    assert ours[0].tolist() == [0, NEG_INF, 0, NEG_INF]


# ---------------------------------------------------------------------------------------
# ExponentialDecayLength
# ---------------------------------------------------------------------------------------


@pytest.mark.support("oracle", processor="exponential_decay_length", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@SETTINGS
@given(data=st.data())
def test_exponential_decay_matches_transformers(dtype: torch.dtype, data: st.DataObject) -> None:
    batch = data.draw(st.integers(1, 6))
    vocab = data.draw(st.sampled_from((2, 5, 17, 64, 300)))
    prompt_length = data.draw(st.integers(1, 6))
    start = data.draw(st.integers(0, 5))
    factor = data.draw(
        st.one_of(
            st.sampled_from((1.6, 1.01, 0.9, 2.0, 0.5, 3.0)),
            st.floats(0.05, 3.0).filter(lambda f: abs(f - 1) > 0.01),
        )
    )
    eos = data.draw(
        st.one_of(
            st.integers(0, vocab - 1), st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3)
        )
    )
    eos_columns = [eos] if isinstance(eos, int) else eos
    ours = Pipeline([ExponentialDecayLength(start, factor, eos_token_id=eos)])
    oracle = ExponentialDecayLengthPenalty((start, factor), eos, prompt_length)
    history = draw_history(data, batch, vocab, prompt_length)
    changed = False
    for _ in range(start + data.draw(st.integers(2, 5))):
        logits = draw_logits(data, batch, vocab, dtype)
        # A nonzero finite EOS logit in row 0, so the decay shows once it starts.
        logits[0, eos_columns] = torch.tensor(-1.5, dtype=dtype)
        expected = oracle(history, logits.clone())
        changed |= not torch.equal(expected, logits)
        assert_identical(logits, ours(logits.clone(), history), expected)
        history = torch.cat([history, draw_history(data, batch, vocab, 1)], 1)
    assert changed, "the oracle never changed the logits"


# ---------------------------------------------------------------------------------------
# StopStrings
# ---------------------------------------------------------------------------------------

STOP_SETS = (("stop",), ("end", "\n\n"), ("é!", "no t"))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir)


@functools.cache
def _criterion(tokenizer: Any, stops: tuple[str, ...]) -> StopStringCriteria:
    # Building one reads the whole 128k vocabulary (about a second): once per stop set.
    return StopStringCriteria(tokenizer, list(stops))


@functools.cache
def _pieces(tokenizer: Any, stops: tuple[str, ...]) -> dict[bytes, int]:
    """Non-special tokens made only of the stop strings' bytes, by their bytes."""
    vocab = hf_vocabulary(tokenizer)
    alphabet = {byte for stop in stops for byte in stop.encode()}
    return {
        token: token_id
        for token_id, token in enumerate(vocab.tokens)
        if token and set(token) <= alphabet and token_id not in vocab.special_token_ids
    }


def spell(data: st.DataObject, text: bytes, pieces: dict[bytes, int]) -> list[int]:
    """A random segmentation of ``text`` into tokens (every single byte is a token)."""
    ids = []
    while text:
        fitting = sorted(p for p in pieces if text.startswith(p))
        piece = data.draw(st.sampled_from(fitting))
        ids.append(pieces[piece])
        text = text[len(piece) :]
    return ids


# Logits are 128k wide here, so fewer examples per dtype (the stop decisions do not
# depend on the dtype; the dtypes check how EOS is forced).
@pytest.mark.support("oracle", processor="stop_strings", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@settings(SETTINGS, max_examples=12)
@given(data=st.data())
def test_stop_strings_force_eos_where_transformers_stops(
    tokenizer: Any, dtype: torch.dtype, data: st.DataObject
) -> None:
    stops = data.draw(st.sampled_from(STOP_SETS))
    criterion, pieces = _criterion(tokenizer, stops), _pieces(tokenizer, stops)
    alphabet = sorted({bytes([b]) for stop in stops for b in stop.encode()})
    vocab = hf_vocabulary(tokenizer)
    eos = sorted(vocab.eos_token_ids)
    batch = data.draw(st.integers(1, 6))
    # Row 0 holds a stop string, possibly inside longer tokens on either side.
    stop = data.draw(st.sampled_from(stops)).encode()
    around = st.lists(st.sampled_from(alphabet), max_size=2).map(b"".join)
    planted = spell(data, data.draw(around) + stop + data.draw(around), pieces)
    before, after = data.draw(st.integers(0, 4)), data.draw(st.integers(0, 3))
    length = before + len(planted) + after
    token_ids = sorted(pieces.values())
    rows = [data.draw(st.lists(st.sampled_from(token_ids), min_size=length, max_size=length))]
    rows[0][before : before + len(planted)] = planted
    rows += [
        data.draw(st.lists(st.sampled_from(token_ids), min_size=length, max_size=length))
        for _ in range(batch - 1)
    ]
    # Upper-case prompt tokens share no byte with the stop strings.
    prompt = [tokenizer.encode(data.draw(st.sampled_from("XZQ")), add_special_tokens=False)[0]]
    generated = torch.tensor(rows)
    history = torch.tensor([prompt * batch]).reshape(batch, 1)

    # When the criterion first stops each row (its generated length then).
    first_stop = torch.full((batch,), length + 1)
    for step in range(1, length + 1):
        fired = criterion(torch.cat([history, generated[:, :step]], 1), None)
        first_stop = torch.where(fired & (first_stop > length), step, first_stop)
    assert first_stop[0] <= length, "the planted stop string did not stop the oracle"

    pipeline = Pipeline([StopStrings(list(stops))], vocab)
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32 - 1)))
    logits = torch.randn(batch, vocab.size, generator=generator).to(dtype)
    # What a stopped row must become: EOS logits 0, every other logit -inf.
    forced = torch.full((1, vocab.size), NEG_INF, dtype=dtype)
    forced[:, eos] = 0
    for step in range(length + 1):
        ids = torch.cat([history, generated[:, :step]], 1)
        expected = torch.where((first_stop <= step)[:, None], forced, logits)
        assert_identical(logits, pipeline(logits.clone(), ids), expected)


def test_stop_strings_in_the_prompt_stop_the_oracle_but_not_ours(tokenizer: Any) -> None:
    vocab = hf_vocabulary(tokenizer)
    prompt = tokenizer.encode("Please st", add_special_tokens=False)
    generated = tokenizer.encode("op", add_special_tokens=False)
    ids = torch.tensor([prompt + generated])
    assert bool(_criterion(tokenizer, ("stop",))(ids, None)[0])
    pipeline = Pipeline([StopStrings(["stop"])], vocab)
    pipeline(torch.zeros(1, vocab.size), torch.tensor([prompt]))
    assert pipeline(torch.zeros(1, vocab.size), ids).eq(0).all()


def test_string_bad_words_use_the_tokenizer_as_given(tokenizer: Any) -> None:
    """Strings resolve as ``tokenizer.encode(word, add_special_tokens=False)``: what
    transformers' docs tell users to pass as ``bad_words_ids`` (with or without a space)."""
    words = ["hello world", " hello world", "é"]
    ids = [tokenizer.encode(word, add_special_tokens=False) for word in words]
    assert ids[0] != ids[1]
    vocab = hf_vocabulary(tokenizer)
    for word_ids in ids:
        history = torch.tensor([[57, *word_ids[:-1]], [57] * len(word_ids)])
        logits = torch.zeros(2, vocab.size)
        expected = NoBadWordsLogitsProcessor(ids)(history, logits.clone())
        assert expected[0, word_ids[-1]] == NEG_INF
        ours = Pipeline([BadWords(words)], vocab)(logits.clone(), history)
        assert torch.equal(ours, expected)


# ---------------------------------------------------------------------------------------
# vLLM's bad_words (only where vLLM is installed: its own venv)
# ---------------------------------------------------------------------------------------


@pytest.mark.only_backend("vllm")
@pytest.mark.support("oracle", processor="bad_words", backend="vllm")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@SETTINGS
@given(data=st.data())
def test_bad_words_match_vllm_on_generated_tokens(dtype: torch.dtype, data: st.DataObject) -> None:
    bad_words_ops = pytest.importorskip("vllm.v1.sample.ops.bad_words")
    id_high = data.draw(st.integers(2, 6))
    words = data.draw(
        st.lists(
            st.lists(st.integers(0, id_high - 1), min_size=1, max_size=4), min_size=1, max_size=5
        )
    )
    batch, vocab, length = draw_shape(data, id_high + 1)
    generated = draw_history(data, batch, id_high, length)
    planted = words[data.draw(st.integers(0, len(words) - 1))]
    plant(generated, planted)
    # The prompt is id_high only, which no word holds: it cannot take part in a match.
    prompt = torch.full((batch, data.draw(st.integers(1, 3))), id_high)
    logits = draw_logits(data, batch, vocab, dtype)
    logits[0, planted[-1]] = 1.0
    if len(planted) - 1 > length:
        words.append([planted[-1]])
    expected = logits.clone()
    bad_words_ops.apply_bad_words(expected, dict.fromkeys(range(batch), words), generated.tolist())
    assert not torch.equal(expected, logits), "the oracle left the logits unchanged"
    ours = Pipeline([BadWords(words)])(logits.clone(), torch.cat([prompt, generated], 1))
    assert_identical(logits, ours, expected)


@pytest.mark.only_backend("vllm")
def test_vllm_bad_words_differ_at_the_prompt_and_in_leading_spaces(tokenizer: Any) -> None:
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
    params.update_from_tokenizer(get_cached_tokenizer(tokenizer))  # as vLLM wraps it
    plain = tokenizer.encode("hello world", add_special_tokens=False)
    spaced = tokenizer.encode(" hello world", add_special_tokens=False)
    assert params.bad_words_token_ids == [plain, spaced]
    # After " hello", only the entry written with the space bans " world".
    vocab = hf_vocabulary(tokenizer)
    history = torch.tensor([[57, *spaced[:-1]]])
    x = torch.zeros(1, vocab.size)
    assert Pipeline([BadWords(["hello world"])], vocab)(x.clone(), history).eq(0).all()
    both = Pipeline([BadWords(["hello world", " hello world"])], vocab)
    assert both(x.clone(), history)[0, spaced[-1]] == NEG_INF
