"""anylogits.processors.length (MinNewTokens, ExponentialDecayLength, StopStrings,
GenLength) against each library's own: transformers' ``MinNewTokensLengthLogitsProcessor``
(hypothesis-drawn pairs over a simulated generation, see ``transformers_cases``),
``ExponentialDecayLengthPenalty`` and ``StopStringCriteria``, and logits-processor-zoo's
``GenLengthLogitsProcessor`` (see ``zoo_peer``).

* ``ExponentialDecayLength`` vs ``ExponentialDecayLengthPenalty``, over a simulated
  generation (the prompt call, then one call per token): ``torch.equal``.
* ``StopStrings`` vs ``StopStringCriteria`` with the tiny model's tokenizer, on token
  sequences drawn without a model: the criterion stops generation after the first token
  that completes a stop string; ours must force EOS (EOS logit 0, every other ``-inf``)
  from exactly the next call on, and leave every other row and call untouched. Prompts
  share no byte with the stop strings, since the criterion also matches stop strings that
  begin in the prompt and ours does not (pinned below).
* ``GenLength`` with ``p=0`` looks at the prompt for the boost token at the first step
  in the zoo only (pinned below).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    ExponentialDecayLengthPenalty,
    MinNewTokensLengthLogitsProcessor,
)
from transformers.generation.stopping_criteria import StopStringCriteria

from anylogits import MinNewTokens, Pipeline
from anylogits.core.vocab import hf_vocabulary
from anylogits.processors import ExponentialDecayLength, GenLength, StopStrings
from conformance_tests.comparisons import DTYPES, NEG_INF, assert_identical, dtype_id
from conformance_tests.oracle_draws import Draw, LogitSource, draw_shape
from conformance_tests.sequence_draws import SETTINGS as SEQUENCE_SETTINGS
from conformance_tests.sequence_draws import draw_history, draw_logits
from conformance_tests.transformers_cases import (
    Case,
    CaseBuilder,
    FixedExample,
    TransformersPairs,
)
from conformance_tests.zoo_peer import (
    Peer,
    draw_logits_and_prompts,
    greedy_loop,
    identical,
    zoo_oracle,
)


def case_min_new_tokens(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    """A simulated generation: the prompt call, then one call per appended token."""
    batch, vocab = draw_shape(draw, vocab)
    source = LogitSource(draw, batch, vocab, dtype)
    prompt_length = draw.int(1, 6)
    min_new = draw.int(0, 6)
    calls = draw.int(1, 9)
    if draw.choice((True, False)):
        eos: int | list[int] = draw.int(0, vocab - 1)
    else:  # several ids, possibly repeated
        eos = [draw.int(0, vocab - 1) for _ in range(draw.int(1, 3))]
    # A tiny id range makes rows share prompts/prefixes, which the tracker must handle.
    id_high = draw.choice((None, 2))
    ids = source.ids(prompt_length, None if id_high is None else min(id_high, vocab))
    steps = []
    for _ in range(calls):
        steps.append((source.next(), ids))
        ids = torch.cat([ids, source.ids(1)], 1)
    return Case(
        MinNewTokens(min_new, eos_token_id=eos),
        MinNewTokensLengthLogitsProcessor(prompt_length, min_new, eos),
        steps,
    )


CASES: dict[str, CaseBuilder] = {
    "MinNewTokens": case_min_new_tokens,
}


FIXED_EXAMPLES = {
    "MinNewTokens": FixedExample(
        MinNewTokens(1, eos_token_id=2),
        MinNewTokensLengthLogitsProcessor(2, 1, 2),
        [[0.0, 0.0, 0.0]],
        [[7, 8]],
        [[0.0, 0.0, NEG_INF]],
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
def test_min_new_tokens_lifts_the_ban_after_min_new_tokens() -> None:
    """The step-by-step simulation, spelled out: EOS is banned for exactly n calls."""
    pipeline = Pipeline([MinNewTokens(2, eos_token_id=[0, 3])])
    oracle = MinNewTokensLengthLogitsProcessor(3, 2, [0, 3])
    ids = torch.tensor([[5, 6, 7], [1, 1, 1]])
    for step, banned in enumerate([True, True, False, False]):
        x = torch.randn(2, 4)
        out = pipeline(x.clone(), ids)
        assert torch.equal(out, oracle(ids, x.clone())), step
        assert bool(out[:, [0, 3]].isneginf().all()) is banned
        assert torch.equal(out[:, [1, 2]], x[:, [1, 2]])
        ids = torch.cat([ids, torch.tensor([[2], [2]])], 1)


@pytest.mark.only_backend("transformers")
@pytest.mark.support("oracle", processor="exponential_decay_length", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@SEQUENCE_SETTINGS
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


STOP_SETS = (("stop",), ("end", "\n\n"), ("é!", "no t"))


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


@pytest.mark.only_backend("transformers")
# Logits are 128k wide here, so fewer examples per dtype (the stop decisions do not
# depend on the dtype; the dtypes check how EOS is forced).
@pytest.mark.support("oracle", processor="stop_strings", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@settings(SEQUENCE_SETTINGS, max_examples=12)
@given(data=st.data())
def test_stop_strings_force_eos_where_transformers_stops(
    hf_tokenizer: Any, dtype: torch.dtype, data: st.DataObject
) -> None:
    stops = data.draw(st.sampled_from(STOP_SETS))
    criterion, pieces = _criterion(hf_tokenizer, stops), _pieces(hf_tokenizer, stops)
    alphabet = sorted({bytes([b]) for stop in stops for b in stop.encode()})
    vocab = hf_vocabulary(hf_tokenizer)
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
    prompt = [hf_tokenizer.encode(data.draw(st.sampled_from("XZQ")), add_special_tokens=False)[0]]
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


@pytest.mark.only_backend("transformers")
def test_stop_strings_in_the_prompt_stop_the_oracle_but_not_ours(hf_tokenizer: Any) -> None:
    vocab = hf_vocabulary(hf_tokenizer)
    prompt = hf_tokenizer.encode("Please st", add_special_tokens=False)
    generated = hf_tokenizer.encode("op", add_special_tokens=False)
    ids = torch.tensor([prompt + generated])
    assert bool(_criterion(hf_tokenizer, ("stop",))(ids, None)[0])
    pipeline = Pipeline([StopStrings(["stop"])], vocab)
    pipeline(torch.zeros(1, vocab.size), torch.tensor([prompt]))
    assert pipeline(torch.zeros(1, vocab.size), ids).eq(0).all()


# --------------------------------------------------------------------------------------
# logits-processor-zoo
# --------------------------------------------------------------------------------------


@zoo_oracle("gen_length")
def test_gen_length_matches_the_zoo(peer: Peer, data) -> None:
    boost_factor = data.draw(st.floats(-2.0, 2.0).filter(lambda f: abs(f) > 1e-3))
    p = data.draw(st.integers(1, 3))
    complete = data.draw(st.booleans())
    boost_text = data.draw(st.sampled_from([None, ".", " the"]))
    logits, prompts = draw_logits_and_prompts(data, peer)
    probes = ("It is a sentence.", "It is a new line\n")  # the zoo's sentence ends
    full_stop, newline = (peer.ids(text)[-1] for text in probes)
    boosted = peer.tokenizer.eos_token_id if boost_text is None else peer.ids(boost_text)[-1]

    def next_logits(step: int, ids: torch.Tensor) -> torch.Tensor:
        # A newline first (a sentence end, never a boosted token here), so that the boost
        # shows at the second step; later, sentence ends or the boosted token now and then.
        if step < 2:
            return logits.next({row: [newline] for row in range(logits.batch)}, [boosted])
        return logits.next(logits.spikes([full_stop, newline, boosted], 0.4), [boosted])

    oracle = peer.zoo.GenLengthLogitsProcessor(
        peer.tokenizer, boost_factor, p=p, complete_sentences=complete, boost_token_str=boost_text
    )
    ours = GenLength(boost_factor, p=p, complete_sentences=complete, boost_token=boost_text)
    steps = data.draw(st.integers(2, 8))
    assert greedy_loop(ours, oracle, peer, prompts, steps, next_logits, identical) > 0


@pytest.mark.only_backend("transformers")
def test_gen_length_with_p_zero_ignores_the_prompt_where_the_zoo_does_not(peer: Peer) -> None:
    # At the first step the zoo's "boost token already generated" looks at the whole
    # row (its slice [-0:] is everything), so an EOS in the prompt turns the boost off.
    eos = peer.tokenizer.eos_token_id
    prompt = torch.tensor([[eos, 100, 200]])
    logits = torch.zeros(1, len(peer.tokenizer))
    mine = Pipeline([GenLength(1.5, p=0)], peer.vocab)(logits.clone(), prompt)
    theirs = peer.zoo.GenLengthLogitsProcessor(peer.tokenizer, 1.5, p=0)(prompt, logits.clone())
    assert mine[0, eos] == 1.5 and theirs[0, eos] == 0.0
