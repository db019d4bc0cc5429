"""anylogits.processors.penalties (RepetitionPenalty, PresencePenalty, FrequencyPenalty)
against each library's own implementation, on identical inputs (DRY:
``test_oracles_dry``). Each engine library is imported by the tests that use it; the
conformance sessions all have transformers, the common reference.

Ours always runs the way an adapter runs it: ``Pipeline`` called first with the prompts,
then with prompt + generated tokens (right-aligned, ragged rows padded on the left), so
prompt lengths come from sequence tracking.

Oracles and the differences found:

* vLLM ``vllm.model_executor.layers.utils.apply_penalties`` (the pure-torch path of its
  sampler), called with prompt and output tokens padded with ``vocab_size`` and float32
  per-row penalties. It subtracts ``frequency * count`` then ``presence`` (two
  roundings), so it is compared with ``[FrequencyPenalty, PresencePenalty]`` in that
  order. Identical (``torch.equal``) for every dtype, with penalties drawn as float32
  numbers (vLLM stores them as float32) and, for float64 logits, drawn on a 1/64 grid
  (vLLM multiplies ``penalty * count`` in float32 before the float64 subtraction, ours in
  float64: the same only when that float32 product is exact).
* llama.cpp's ``penalties`` sampler (``llama_sampler_init_penalties(n_vocab, last_n,
  repeat, freq, present)`` + ``llama_sampler_accept`` + ``llama_sampler_apply``) fed the
  generated tokens only, as llama-cpp-python's ``Llama`` does (its sampler accepts only
  sampled tokens). Identical for one penalty at a time. Differences:
  - it subtracts ``count * freq + present`` in one expression (one rounding), so both
    at once may differ from ours (and vLLM) by float32 rounding;
  - it counts only the last ``penalty_last_n`` accepted tokens, while ours (like OpenAI
    and vLLM) counts every generated token;
  - llama.cpp's own server / CLI also accept the prompt tokens
    (``common_sampler_accept(..., false)`` when the prompt is loaded), so there the
    penalties count prompt tokens inside the window; ours never does (pinned below).
* mlx-lm ``make_presence_penalty`` / ``make_frequency_penalty`` given the generated tokens
  and a ``context_size`` covering them. Presence: identical. Frequency subtracts
  ``penalty`` once per occurrence (``logits.at[:, tokens].subtract``), rounding every
  time: identical when each step is exact (0.5-step logits, 1/8-step penalties), within
  ``count`` float32 roundings otherwise. mlx-lm casts the penalty to the logits dtype
  (a weakly typed scalar) before subtracting, so bfloat16 / float16 logits agree when
  the penalty is representable in that dtype. mlx-lm's ``generate_step`` passes prompt +
  generated tokens to processors, so its window (default 20) includes prompt tokens.
* transformers ``RepetitionPenaltyLogitsProcessor`` on hypothesis-drawn pairs (see
  ``transformers_cases``): bit-identical. Found by the property tests, fixed, and pinned:
  history ids beyond the logits width.
* mlx-lm's repetition penalty (``make_logits_processors``): identical, with its
  ``repetition_context_size`` as our ``context_size``.
* llama.cpp's repetition penalty counts only the last ``penalty_last_n`` tokens it was
  told about with ``llama_sampler_accept``, and llama-cpp-python accepts only generated
  tokens, never the prompt; ours counts the prompt too (transformers' semantics), the
  whole history by default and the last ``context_size`` tokens with it. Equal when
  every history token is accepted and ``context_size == penalty_last_n``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("hypothesis")

from collections.abc import Callable, Sequence

from hypothesis import given
from hypothesis import strategies as st
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from anylogits import LogitsProcessor, Pipeline, RepetitionPenalty
from anylogits.core.batch import Batch
from anylogits.processors import FrequencyPenalty, PresencePenalty
from conformance_tests.comparisons import (
    DTYPES,
    assert_identical,
    oracle_settings,
    right_aligned,
)
from conformance_tests.llama_cpp_rows import (
    LLAMA_VOCAB,
    SEEDS,
    llama_cpp_apply,
    llama_cpp_result,
    ours_row,
    random_row,
)
from conformance_tests.mlx_rows import assert_matches_mlx_processor, ours_after
from conformance_tests.oracle_draws import Draw
from conformance_tests.transformers_cases import (
    Case,
    CaseBuilder,
    FixedExample,
    TransformersPairs,
    one_step,
)

PRESENCE_AND_FREQUENCY = ("presence_penalty", "frequency_penalty")  # support-matrix names


SETTINGS = oracle_settings(50)


def ours_after_generation(
    processors: Sequence[LogitsProcessor],
    logits: torch.Tensor,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Our result once ``outputs`` were generated after ``prompts`` (one call per phase)."""
    pipeline = Pipeline(list(processors))
    prompt_ids, prompt_lengths = right_aligned(prompts)
    pipeline(torch.zeros_like(logits), prompt_ids, lengths=prompt_lengths)
    ids, lengths = right_aligned([[*p, *o] for p, o in zip(prompts, outputs, strict=True)])
    return pipeline(logits.clone(), ids, lengths=lengths)


def ours_with_known_prompts(
    processors: Sequence[LogitsProcessor],
    logits: torch.Tensor,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Our result when the engine states each row's prompt length, as vLLM's adapter does
    (a tracker would take a prompt that extends another row's prompt for a continuation)."""
    ids, lengths = right_aligned([[*p, *o] for p, o in zip(prompts, outputs, strict=True)])
    batch = Batch(
        len(prompts),
        ids,
        lengths=lengths,
        prompt_lengths=torch.tensor([len(p) for p in prompts]),
    )
    return Pipeline(list(processors)).apply(logits.clone(), batch)


def penalty_strategy(dtype: torch.dtype) -> st.SearchStrategy[float]:
    """Penalty sizes of at least 0.25 (visible even on bfloat16 logits)."""
    if dtype == torch.float64:
        # A 1/64 grid: vLLM's float32 `penalty * count` is then exact (see module doc).
        return st.integers(16, 128).map(lambda k: k / 64)
    return st.floats(0.25, 2.0, width=32)


def case_repetition_penalty(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    penalty = draw.float(0.05, 5.0, specials=(1.0, 1.2, 1.5, 2.0, 0.5, 0.8))
    # Sometimes a small id range, so the history repeats tokens (duplicate scatter ids).
    id_high = draw.choice((None, 3, 10))
    _, steps = one_step(draw, dtype, vocab, id_high)
    return Case(RepetitionPenalty(penalty), RepetitionPenaltyLogitsProcessor(penalty), steps)


CASES: dict[str, CaseBuilder] = {
    "RepetitionPenalty": case_repetition_penalty,
}


FIXED_EXAMPLES = {
    "RepetitionPenalty": FixedExample(
        RepetitionPenalty(2.0),
        RepetitionPenaltyLogitsProcessor(2.0),
        [[2.0, -2.0, 2.0]],
        [[0, 1, 1]],
        [[1.0, -4.0, 2.0]],
    ),
}


# --------------------------------------------------------------------------------------
# transformers
# --------------------------------------------------------------------------------------


class TestTransformersPairs(TransformersPairs):
    """This module's pairs through the four checks every transformers pair runs."""

    cases = CASES
    fixed_examples = FIXED_EXAMPLES


# Divergences found by the property tests, fixed, and pinned here.


@pytest.mark.only_backend("transformers")
def test_history_ids_beyond_logits_width() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0]])
    ids = torch.tensor([[0, 5, 0, 5]])
    expected = RepetitionPenaltyLogitsProcessor(2.0)(ids, x.clone())  # [[0.5, 2, 3]]
    assert not torch.equal(expected, x)
    assert torch.equal(Pipeline([RepetitionPenalty(2.0)])(x.clone(), ids), expected)


# --------------------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_apply_penalties() -> Callable[..., torch.Tensor]:
    utils = pytest.importorskip("vllm.model_executor.layers.utils")
    return utils.apply_penalties


def vllm_result(
    apply_penalties: Callable[..., torch.Tensor],
    logits: torch.Tensor,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    presence: Sequence[float],
    frequency: Sequence[float],
) -> torch.Tensor:
    """vLLM's sampler arguments: token lists padded with ``vocab_size`` (its pad id)."""
    batch, vocab = logits.shape

    def padded(rows: Sequence[Sequence[int]]) -> torch.Tensor:
        width = max(1, max(len(row) for row in rows))
        return torch.tensor([[*row, *[vocab] * (width - len(row))] for row in rows])

    return apply_penalties(
        logits.clone(),
        padded(prompts),
        padded(outputs),
        torch.tensor(presence, dtype=torch.float32),
        torch.tensor(frequency, dtype=torch.float32),
        torch.ones(batch, dtype=torch.float32),
    )


@pytest.mark.support("oracle", processor=PRESENCE_AND_FREQUENCY, backend="vllm")
@pytest.mark.only_backend("vllm")
@SETTINGS
@given(data=st.data())
def test_presence_and_frequency_match_vllm(
    vllm_apply_penalties: Callable[..., torch.Tensor], data: st.DataObject
) -> None:
    draw = data.draw
    batch = draw(st.integers(1, 6))
    vocab = draw(st.sampled_from([2, 3, 17, 100, 257, 1000]))
    dtype = draw(st.sampled_from(DTYPES))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.5, 2.0, 8.0]))
    logits = (torch.randn(batch, vocab, generator=generator, dtype=torch.float64) * scale).to(dtype)
    if draw(st.booleans()):
        logits[:, 1::3] = float("-inf")  # as after a previous top-k
    ids_below = draw(st.sampled_from([min(vocab, 5), vocab]))  # few ids: many repeats

    def tokens(low: int, high: int) -> list[int]:
        length = draw(st.integers(low, high))
        return torch.randint(0, ids_below, (length,), generator=generator).tolist()

    prompts = [tokens(1, 12) for _ in range(batch)]
    outputs = [tokens(0, 20) for _ in range(batch)]
    # Row 0 generated its likeliest token, so the oracle visibly changes something.
    outputs[0].append(int(logits[0].argmax()))
    per_row = draw(st.booleans())
    count = batch if per_row else 1
    # One sign per row for both penalties, so that they cannot cancel out.
    signs = [draw(st.sampled_from([1.0, -1.0])) for _ in range(count)]
    presence = [sign * draw(penalty_strategy(dtype)) for sign in signs]
    frequency = [sign * draw(penalty_strategy(dtype)) for sign in signs]
    if per_row:
        processors = [
            FrequencyPenalty.stack([FrequencyPenalty(f) for f in frequency]),
            PresencePenalty.stack([PresencePenalty(p) for p in presence]),
        ]
    else:
        processors = [FrequencyPenalty(frequency[0]), PresencePenalty(presence[0])]
        presence, frequency = presence * batch, frequency * batch

    expected = vllm_result(vllm_apply_penalties, logits, prompts, outputs, presence, frequency)
    assert not torch.equal(expected, logits)
    ours = ours_with_known_prompts(processors, logits, prompts, outputs)
    assert_identical(logits, ours, expected)


@pytest.mark.only_backend("vllm")
@pytest.mark.parametrize("processor", [PresencePenalty(0.75), FrequencyPenalty(0.75)])
def test_vllm_and_ours_leave_prompt_tokens_alone(
    vllm_apply_penalties: Callable[..., torch.Tensor], processor: LogitsProcessor
) -> None:
    logits = torch.randn(1, 10, generator=torch.Generator().manual_seed(0))
    prompts, outputs = [[1, 2, 3]], [[4, 4]]
    presence = [0.75 if isinstance(processor, PresencePenalty) else 0.0]
    frequency = [0.75 if isinstance(processor, FrequencyPenalty) else 0.0]
    expected = vllm_result(vllm_apply_penalties, logits, prompts, outputs, presence, frequency)
    assert torch.equal(expected[0, :4], logits[0, :4])
    assert not torch.equal(expected[0, 4], logits[0, 4])
    assert_identical(logits, ours_after_generation([processor], logits, prompts, outputs), expected)


# --------------------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------------------


def one_row(
    processor: LogitsProcessor, logits: np.ndarray, prompt: list[int], output: list[int]
) -> np.ndarray:
    row = torch.from_numpy(logits.copy())[None]
    return ours_after_generation([processor], row, [prompt], [output])[0].numpy()


def llama_case(seed: int) -> tuple[np.ndarray, list[int], list[int]]:
    generator = np.random.default_rng(seed)
    logits = (generator.standard_normal(LLAMA_VOCAB) * 3).astype(np.float32)
    prompt = generator.integers(0, 40, 15).tolist()
    output = generator.integers(0, 40, int(generator.integers(1, 50))).tolist()
    return logits, prompt, output


@pytest.mark.support("oracle", processor=PRESENCE_AND_FREQUENCY, backend="llama_cpp")
@pytest.mark.only_backend("llama_cpp")
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("kind", ["presence", "frequency"])
def test_presence_or_frequency_matches_llama_cpp(llama_cpp: Any, seed: int, kind: str) -> None:
    logits, prompt, output = llama_case(seed)
    penalty = float(np.float32([0.3, 1.1, -0.7][seed % 3]))
    freq, present = (penalty, 0.0) if kind == "frequency" else (0.0, penalty)
    sampler = llama_cpp.llama_sampler_init_penalties(LLAMA_VOCAB, len(output), 1.0, freq, present)
    expected = llama_cpp_result(sampler, logits, output)
    assert not np.array_equal(expected, logits)
    processor = FrequencyPenalty(penalty) if kind == "frequency" else PresencePenalty(penalty)
    np.testing.assert_array_equal(one_row(processor, logits, prompt, output), expected)


@pytest.mark.support("oracle", processor=PRESENCE_AND_FREQUENCY, backend="llama_cpp")
@pytest.mark.only_backend("llama_cpp")
@pytest.mark.parametrize("seed", range(6))
def test_both_penalties_match_llama_cpp_within_one_rounding(llama_cpp: Any, seed: int) -> None:
    """llama.cpp subtracts ``count * freq + present`` at once, ours (and vLLM) one penalty
    after the other: at most one float32 rounding of the result apart (atol 1 ulp)."""
    logits, prompt, output = llama_case(seed)
    sampler = llama_cpp.llama_sampler_init_penalties(LLAMA_VOCAB, len(output), 1.0, 0.3, 0.7)
    expected = llama_cpp_result(sampler, logits, output)
    assert not np.array_equal(expected, logits)
    pipeline = [FrequencyPenalty(float(np.float32(0.3))), PresencePenalty(float(np.float32(0.7)))]
    row = torch.from_numpy(logits.copy())[None]
    ours = ours_after_generation(pipeline, row, [prompt], [output])[0].numpy()
    np.testing.assert_allclose(ours, expected, rtol=0, atol=np.spacing(np.abs(expected)).max())


@pytest.mark.only_backend("llama_cpp")
def test_llama_cpp_window_and_prompt_are_known_differences(llama_cpp: Any) -> None:
    logits, _, _ = llama_case(0)
    prompt, output = [1, 2, 3], [7, 7, 8, 9]
    ours = one_row(PresencePenalty(1.0), logits, prompt, output)
    # llama.cpp's server accepts prompt tokens too: they are penalized there, not by ours.
    with_prompt = llama_cpp_result(
        llama_cpp.llama_sampler_init_penalties(LLAMA_VOCAB, 64, 1.0, 0.0, 1.0),
        logits,
        prompt + output,
    )
    assert not np.array_equal(with_prompt[1:4], logits[1:4])
    np.testing.assert_array_equal(ours[1:4], logits[1:4])
    # A window of 2 forgets the earlier output tokens; ours counts every generated token.
    windowed = llama_cpp_result(
        llama_cpp.llama_sampler_init_penalties(LLAMA_VOCAB, 2, 1.0, 0.0, 1.0),
        logits,
        output,
    )
    assert windowed[7] == logits[7]
    assert ours[7] != logits[7]
    np.testing.assert_array_equal(ours[8:10], windowed[8:10])


def _history(seed: int, length: int) -> list[int]:
    generator = np.random.default_rng(seed + 100)
    return generator.integers(0, 50, length).tolist()  # few ids: they repeat


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.support("oracle", processor="repetition_penalty", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_matches_llama_cpp_when_the_window_covers_the_history(
    seed: int, penalty: float
) -> None:
    logits = random_row(seed)
    logits[:50:7] = 0.0  # llama.cpp tests `<= 0`, transformers `< 0`: same at zero
    history = _history(seed, 40)
    expected = llama_cpp_apply(
        lambda lib: lib.llama_sampler_init_penalties(LLAMA_VOCAB, len(history), penalty, 0.0, 0.0),
        logits,
        history,
    )
    assert not np.array_equal(expected, logits)
    np.testing.assert_allclose(
        ours_row(RepetitionPenalty(penalty), logits, history), expected, rtol=1e-6
    )


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.support("oracle", processor="repetition_penalty", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("last_n", [1, 5, 17])
def test_repetition_penalty_context_size_matches_llama_cpp_penalty_last_n(
    seed: int, last_n: int
) -> None:
    logits = random_row(seed)
    logits[:50:7] = 0.0
    history = _history(seed, 40)
    expected = llama_cpp_apply(
        lambda lib: lib.llama_sampler_init_penalties(LLAMA_VOCAB, last_n, 1.5, 0.0, 0.0),
        logits,
        history,
    )
    whole = ours_row(RepetitionPenalty(1.5), logits, history)
    assert not np.array_equal(expected, whole), "the window made no difference"
    np.testing.assert_allclose(
        ours_row(RepetitionPenalty(1.5, context_size=last_n), logits, history), expected, rtol=1e-6
    )


# --------------------------------------------------------------------------------------
# mlx-lm
# --------------------------------------------------------------------------------------


@pytest.mark.only_backend("mlx")
@pytest.mark.support("oracle", processor="repetition_penalty", backend="mlx")
@pytest.mark.parametrize("seed", range(6))
def test_repetition_penalty_matches_mlx_lm_make_logits_processors(seed: int) -> None:
    history = np.random.default_rng(seed + 50).integers(0, 60, 30).tolist()
    # mlx-lm penalizes the last `repetition_context_size` tokens: cover the whole history.
    logits, expected = assert_matches_mlx_processor(
        RepetitionPenalty(1.3), seed, history, repetition_penalty=1.3, repetition_context_size=30
    )
    assert not np.array_equal(expected, logits)


@pytest.mark.only_backend("mlx")
@pytest.mark.support("oracle", processor="repetition_penalty", backend="mlx")
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("context_size", [1, 4, 20])
def test_repetition_penalty_context_size_matches_mlx_lm_repetition_context_size(
    seed: int, context_size: int
) -> None:
    history = np.random.default_rng(seed + 50).integers(0, 60, 30).tolist()
    windowed = RepetitionPenalty(1.3, context_size=context_size)
    logits, expected = assert_matches_mlx_processor(
        windowed, seed, history, repetition_penalty=1.3, repetition_context_size=context_size
    )
    assert not np.array_equal(expected, ours_after(RepetitionPenalty(1.3), logits, history))


@pytest.fixture(scope="module")
def mlx() -> tuple[Any, Any]:
    mx = pytest.importorskip("mlx.core")
    sample_utils = pytest.importorskip("mlx_lm.sample_utils")
    return mx, sample_utils


MLX_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def mlx_result(
    mlx: tuple[Any, Any], make: str, penalty: float, logits: torch.Tensor, tokens: list[int]
) -> torch.Tensor:
    mx, sample_utils = mlx
    processor = getattr(sample_utils, make)(penalty, len(tokens))
    native = mx.array(logits.float().numpy()).astype(getattr(mx, MLX_DTYPES[logits.dtype]))
    out = processor(mx.array(tokens), native)
    return torch.from_numpy(np.array(out.astype(mx.float32))).to(logits.dtype)


@pytest.mark.support("oracle", processor=PRESENCE_AND_FREQUENCY, backend="mlx")
@pytest.mark.only_backend("mlx")
@SETTINGS
@given(data=st.data())
def test_presence_and_frequency_match_mlx_lm(mlx: tuple[Any, Any], data: st.DataObject) -> None:
    """Exact where every rounding step is exact: logits on a 0.5 grid, penalties on a
    1/8 grid (representable in every dtype, and each repeated subtraction is exact)."""
    draw = data.draw
    dtype = draw(st.sampled_from(list(MLX_DTYPES)))
    vocab = draw(st.sampled_from([3, 17, 100, 1000]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    logits = ((torch.randn(1, vocab, generator=generator) * 8).round() / 2).to(dtype)
    prompt = torch.randint(0, min(vocab, 6), (draw(st.integers(1, 10)),), generator=generator)
    output = torch.randint(0, min(vocab, 6), (draw(st.integers(1, 20)),), generator=generator)
    penalty = draw(st.integers(1, 16)) / 8 * draw(st.sampled_from([1, -1]))
    kind = draw(st.sampled_from(["presence", "frequency"]))
    make = f"make_{kind}_penalty"
    processor = PresencePenalty(penalty) if kind == "presence" else FrequencyPenalty(penalty)

    expected = mlx_result(mlx, make, penalty, logits, output.tolist())
    assert not torch.equal(expected, logits)
    ours = ours_after_generation([processor], logits, [prompt.tolist()], [output.tolist()])
    assert_identical(logits, ours, expected)


@pytest.mark.support("oracle", processor="frequency_penalty", backend="mlx")
@pytest.mark.only_backend("mlx")
@pytest.mark.parametrize("seed", range(10))
def test_frequency_matches_mlx_lm_within_its_repeated_roundings(
    mlx: tuple[Any, Any], seed: int
) -> None:
    """mlx-lm subtracts ``penalty`` ``count`` times, each rounded to float32 (``count``
    half-ulps of the largest value involved at most); ours rounds ``penalty * count`` and
    the difference (two half-ulps): the bound is their sum. Untouched tokens are equal."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, 500, generator=generator) * 4
    output = torch.randint(0, 30, (40,), generator=generator).tolist()
    penalty = float(np.float32(0.37))
    expected = mlx_result(mlx, "make_frequency_penalty", penalty, logits, output)
    ours = ours_after_generation([FrequencyPenalty(penalty)], logits, [[0]], [output])
    counts = torch.bincount(torch.tensor(output), minlength=500).double()
    assert bool((expected != logits)[0, counts > 0].all())
    largest = logits.double().abs() + counts * penalty
    half_ulps = torch.tensor(np.spacing(largest.float().numpy())).double() / 2
    bound = torch.where(counts > 0, (counts + 2) * half_ulps, 0.0)
    assert bool(((ours.double() - expected.double()).abs() <= bound).all())
    presence = mlx_result(mlx, "make_presence_penalty", penalty, logits, output)
    assert_identical(
        logits, ours_after_generation([PresencePenalty(penalty)], logits, [[0]], [output]), presence
    )


@pytest.mark.only_backend("mlx")
def test_mlx_lm_window_includes_the_prompt_a_known_difference(mlx: tuple[Any, Any]) -> None:
    """mlx-lm's processors see prompt + generated tokens: its presence penalty hits prompt
    tokens within its window; ours never does."""
    logits = torch.randn(1, 20, generator=torch.Generator().manual_seed(3))
    prompt, output = [1, 2], [5, 6]
    native = mlx_result(mlx, "make_presence_penalty", 1.0, logits, prompt + output)
    ours = ours_after_generation([PresencePenalty(1.0)], logits, [prompt], [output])
    assert not torch.equal(native[0, 1:3], logits[0, 1:3])
    assert torch.equal(ours[0, 1:3], logits[0, 1:3])
    assert torch.equal(ours[0, 5:7], native[0, 5:7])
