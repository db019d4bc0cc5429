"""anylogits.processors.bias (LogitBias, SequenceBias, CiteFromPrompt) against each
library's own: transformers' ``SequenceBiasLogitsProcessor`` (for LogitBias as one-token
entries: hypothesis-drawn pairs, see ``transformers_cases``; for SequenceBias on histories
with a planted match, see ``sequence_draws``), llama.cpp's ``logit_bias`` sampler, mlx-lm's
``make_logits_processors(logit_bias=...)``, and
logits-processor-zoo's ``CiteFromPromptLogitsProcessor`` (see ``zoo_peer``).

The oracle stores biases in float32, so biases are drawn float32-representable; for
float64 logits and other biases the difference is pinned by the ``..._float64_adds_the_
exact_bias_...`` tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st
from transformers.generation.logits_process import SequenceBiasLogitsProcessor

from anylogits import LogitBias, Pipeline
from anylogits.processors import CiteFromPrompt, SequenceBias
from conformance_tests.comparisons import DTYPES, dtype_id
from conformance_tests.llama_cpp_rows import (
    LLAMA_VOCAB,
    SEEDS,
    llama_cpp_apply,
    ours_row,
    random_row,
)
from conformance_tests.mlx_rows import assert_matches_mlx_processor
from conformance_tests.oracle_draws import Draw
from conformance_tests.sequence_draws import SETTINGS as SEQUENCE_SETTINGS
from conformance_tests.sequence_draws import compare_once, draw_planted_inputs
from conformance_tests.transformers_cases import (
    Case,
    CaseBuilder,
    FixedExample,
    TransformersPairs,
    one_step,
)
from conformance_tests.zoo_peer import (
    Logits,
    Peer,
    draw_prompts,
    greedy_loop,
    identical,
    zoo_oracle,
)


def case_logit_bias(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    vocab, steps = one_step(draw, dtype, vocab)
    count = draw.int(1, min(5, vocab))
    token_ids: list[int] = []
    while len(token_ids) < count:
        token_id = draw.int(0, vocab - 1)
        if token_id not in token_ids:
            token_ids.append(token_id)
    # float32-representable biases: the oracle stores them in float32 (see
    # test_logit_bias_float64_adds_the_exact_bias_where_oracle_adds_it_in_float32). |bias| <= 1e4
    # keeps half-precision sums finite (no inf - inf).
    specials = (-100.0, 100.0, -1e4, 1e4, 5.0, -1.5, 0.0, 0.25)
    bias = {t: draw.float(-50.0, 50.0, specials=specials) for t in token_ids}
    return Case(
        LogitBias(bias),
        SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()}),
        steps,
    )


CASES: dict[str, CaseBuilder] = {
    "LogitBias": case_logit_bias,
}


FIXED_EXAMPLES = {
    "LogitBias": FixedExample(
        LogitBias({1: 5.0, 2: -1.0}),
        SequenceBiasLogitsProcessor({(1,): 5.0, (2,): -1.0}),
        [[0.0, 0.0, 0.0, 0.0]],
        [[0]],
        [[0.0, 5.0, -1.0, 0.0]],
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
def test_logit_bias_float64_adds_the_exact_bias_where_oracle_adds_it_in_float32() -> None:
    """The one legitimate LogitBias difference, pinned exactly.

    ``SequenceBiasLogitsProcessor`` stores biases in a float32 tensor and adds them into
    a zero tensor of the logits dtype, so float64 logits get ``float32(bias)``; ours
    adds the float64 bias. For float32-representable biases (the ones drawn above) the
    two are identical; otherwise they differ by exactly that rounding.
    """
    bias = 0.1
    x = torch.tensor([[0.3, -1.0, 2.0]], dtype=torch.float64)
    ids = torch.zeros(1, 1, dtype=torch.int64)
    ours = Pipeline([LogitBias({1: bias})])(x.clone(), ids)
    oracle = SequenceBiasLogitsProcessor({(1,): bias})(ids, x.clone())
    bias32 = torch.tensor(bias, dtype=torch.float32).item()
    assert bias32 != bias
    assert torch.equal(ours, torch.tensor([[0.3, -1.0 + bias, 2.0]], dtype=torch.float64))
    assert torch.equal(oracle, torch.tensor([[0.3, -1.0 + bias32, 2.0]], dtype=torch.float64))


@pytest.mark.only_backend("transformers")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_logit_bias_half_matches_oracle_for_any_float_bias(dtype: torch.dtype) -> None:
    """In half dtypes the oracle rounds a bias to float32, then to the dtype. So does ours:
    torch converts a Python float to float16/bfloat16 through float32. Checked with a
    bias where rounding once and rounding through float32 disagree
    (1 + 2**-11 + 2**-30 for float16: float32 rounds it to the float16 midpoint, which
    then rounds to even, 1.0; rounding once gives 1 + 2**-10)."""
    bias = {torch.float16: 1 + 2**-11 + 2**-30, torch.bfloat16: 1 + 2**-8 + 2**-30}[dtype]
    x = torch.zeros(1, 3, dtype=dtype)
    ids = torch.zeros(1, 1, dtype=torch.int64)
    ours = Pipeline([LogitBias({1: bias})])(x.clone(), ids)
    oracle = SequenceBiasLogitsProcessor({(1,): bias})(ids, x.clone())
    assert torch.equal(ours, oracle)
    assert ours[0, 1].item() == torch.tensor(bias, dtype=torch.float32).to(dtype).item()


BIASES = st.one_of(
    st.sampled_from((-100.0, 100.0, -1e4, 1e4, 5.0, -1.5, 0.25, 0.0)),
    st.floats(-50.0, 50.0, width=32),
)


@pytest.mark.only_backend("transformers")
@pytest.mark.support("oracle", processor="sequence_bias", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@SEQUENCE_SETTINGS
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
    logits, history, planted_fits = draw_planted_inputs(data, dtype, id_high, planted)
    if not planted_fits:
        pairs.append([[planted[-1]], planted_bias])  # cannot be planted: bias it always
    compare_once(SequenceBias(pairs), SequenceBiasLogitsProcessor(pairs), logits, history)


@pytest.mark.only_backend("transformers")
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


@pytest.mark.only_backend("transformers")
def test_sequence_bias_float64_adds_the_exact_bias_where_oracle_adds_float32() -> None:
    pairs = [[[0, 1], 0.1]]
    history = torch.tensor([[0]])
    logits = torch.zeros(1, 2, dtype=torch.float64)
    oracle = SequenceBiasLogitsProcessor(pairs)(history, logits.clone())
    ours = Pipeline([SequenceBias(pairs)])(logits.clone(), history)
    assert oracle[0, 1].item() == torch.tensor(0.1, dtype=torch.float32).item() != 0.1
    assert ours[0, 1].item() == 0.1


# --------------------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------------------


def _logit_bias_sampler(lib: Any, bias: dict[int, float]) -> Any:
    entries = (lib.llama_logit_bias * len(bias))(
        *(lib.llama_logit_bias(token=token, bias=value) for token, value in bias.items())
    )
    return lib.llama_sampler_init_logit_bias(LLAMA_VOCAB, len(bias), entries)  # copies them


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.support("oracle", processor="logit_bias", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
def test_logit_bias_matches_llama_cpp(seed: int) -> None:
    logits = random_row(seed)
    logits[11] = -np.inf  # a removed token stays removed under any bias
    bias = {3: 2.5, 11: 7.0, 77: -4.0, LLAMA_VOCAB - 1: 0.125}
    expected = llama_cpp_apply(lambda lib: _logit_bias_sampler(lib, bias), logits)
    assert not np.array_equal(expected, logits)
    np.testing.assert_array_equal(ours_row(LogitBias(bias), logits), expected)


# --------------------------------------------------------------------------------------
# logits-processor-zoo
# --------------------------------------------------------------------------------------


@zoo_oracle("cite_from_prompt")
def test_cite_from_prompt_matches_the_zoo(peer: Peer, data) -> None:
    boost_factor = data.draw(st.floats(-3.0, 3.0).filter(lambda f: abs(f) > 1e-3))
    boost_eos = data.draw(st.booleans())
    conditional = data.draw(st.sampled_from([0.0, 0.5, -2.5, 7.0]))
    logits = Logits(data, data.draw(st.integers(1, 3)), len(peer.tokenizer))
    # A small pool of ids, so prompts repeat tokens and generated ones follow in them.
    pool = torch.randint(0, logits.width, (6,), generator=logits.generator).tolist()
    prompts = draw_prompts(data, logits, pool)
    # One prompt token stays finite, so that the boost shows even when -inf covers the
    # rest of the pool and nothing is spiked (a boosted -inf is still -inf).
    finite = [int(prompts[0, 0])]

    def next_logits(step: int, ids: torch.Tensor) -> torch.Tensor:
        return logits.next(logits.spikes(pool, 0.6), finite)

    oracle = peer.zoo.CiteFromPromptLogitsProcessor(
        peer.tokenizer, boost_factor, boost_eos=boost_eos, conditional_boost_factor=conditional
    )
    ours = CiteFromPrompt(boost_factor, boost_eos=boost_eos, conditional_boost_factor=conditional)
    steps = data.draw(st.integers(1, 6))
    assert greedy_loop(ours, oracle, peer, prompts, steps, next_logits, identical) > 0


# --------------------------------------------------------------------------------------
# mlx-lm
# --------------------------------------------------------------------------------------


@pytest.mark.only_backend("mlx")
@pytest.mark.support("oracle", processor="logit_bias", backend="mlx")
@pytest.mark.parametrize("seed", range(6))
def test_logit_bias_matches_mlx_lm_make_logits_processors(seed: int) -> None:
    bias = {3: 2.5, 77: -4.0, 1999: 1.0}
    assert_matches_mlx_processor(LogitBias(bias), seed, [1, 2], logit_bias=bias)
