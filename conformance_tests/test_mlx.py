"""MLX (mlx-lm) on the tiny model's HF folder, which mlx-lm loads directly: bf16;
speculative decoding; BatchGenerator; every generate API; mlx-lm's own processors and
samplers as oracles (generation against transformers is in ``test_generation``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")
transformers = pytest.importorskip("transformers")

from mlx_lm.generate import batch_generate, stream_generate  # noqa: E402
from mlx_lm.sample_utils import (  # noqa: E402
    apply_min_p,
    apply_top_k,
    apply_top_p,
    make_logits_processors,
    make_sampler,
)

from anylogits import (  # noqa: E402
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    MinP,
    Pipeline,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
    for_mlx,
)
from anylogits.adapters.mlx import MlxLogitsProcessor  # noqa: E402
from anylogits.core.batch import Batch  # noqa: E402
from anylogits.engines.generation import NEW_TOKENS, MlxEngine  # noqa: E402
from conformance_tests.generation_cases import COUNTING  # noqa: E402
from test_support.probes import (  # noqa: E402
    GeneratedHashBias,
    GeneratedHashBiasRecompute,
)

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("mlx")]


@pytest.fixture(scope="module")
def engine(engines: Any) -> MlxEngine:
    return engines["mlx"]


@pytest.fixture(scope="module")
def loaded(engine: MlxEngine) -> tuple[Any, Any]:
    return engine.model, engine.tokenizer


def mlx_greedy(
    model: Any, prompt: list[int], processors: Any = None, n: int = NEW_TOKENS, sampler: Any = None
) -> list[int]:
    """``n`` tokens of ``generate_step`` (greedy unless ``sampler``); it does not stop at EOS."""
    return MlxEngine.steps(model, prompt, processors, n, sampler)


def test_min_new_tokens_uses_every_id_mlx_stops_on(loaded: Any) -> None:
    model, tokenizer = loaded
    prompt = tokenizer.encode(COUNTING)
    eos = sorted(tokenizer.eos_token_ids)
    push = LogitBias({token: 30.0 for token in eos})
    assert mlx_greedy(model, prompt, for_mlx(push, tokenizer=tokenizer), n=1)[0] in eos
    held = mlx_greedy(model, prompt, for_mlx(push, MinNewTokens(5), tokenizer=tokenizer), n=6)
    assert not set(held[:5]) & set(eos) and held[5] in eos


def test_bfloat16_logits_are_processed_without_numpy(tiny_model_dir: Path) -> None:
    model, tokenizer = mlx_lm.load(str(tiny_model_dir))
    model.set_dtype(mx.bfloat16)
    prompt = tokenizer.encode(COUNTING)
    plain = mlx_greedy(model, prompt, n=8)
    banned = sorted(set(plain[:3]))
    ours = mlx_greedy(model, prompt, for_mlx(SuppressTokens(banned), tokenizer=tokenizer), n=8)
    assert ours != plain and not set(ours) & set(banned)


class _Halved(LogitsProcessor):
    """Returns a new tensor instead of editing the logits in place, as a processor may."""

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return logits / 2


MX_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits (-0.0 and 0.0 differ), whatever its float dtype."""
    return tensor.view({2: torch.int16, 4: torch.int32}[tensor.element_size()])


@pytest.mark.parametrize("dtype", sorted(MX_DTYPES))
@pytest.mark.parametrize("shape", [(1, 64), (64,)], ids=["2d", "1d"])
@pytest.mark.parametrize("token_dtype", ["int32", "int64"])
@pytest.mark.parametrize("processor", [RepetitionPenalty, _Halved], ids=["in_place", "new"])
def test_hook_gives_exact_bits_in_the_input_dtype_and_shape_and_keeps_the_input(
    dtype: str, shape: tuple[int, ...], token_dtype: str, processor: type
) -> None:
    """Lazy arrays, as mlx-lm passes them: the result must be bit-exact, in the model's
    dtype and shape (never through numpy, which has no bfloat16), and in memory of its
    own: mlx-lm's logits (and the array they came from) must not change."""
    values = torch.randn(64, generator=torch.Generator().manual_seed(len(shape))) * 3
    values[:4] = torch.tensor([-0.0, float("inf"), float("-inf"), 0.0])
    source = mx.array(values.reshape(shape).numpy()).astype(MX_DTYPES[dtype])
    mx.eval(source)
    original = torch.from_dlpack(source).clone()
    history = [5, 7, 7, 0]  # 0 holds -0.0: the penalty keeps its sign
    tokens = mx.array(history, dtype=getattr(mx, token_dtype)) + 0
    logits = source * 1
    build = (lambda: RepetitionPenalty(2.0)) if processor is RepetitionPenalty else _Halved
    result = MlxLogitsProcessor(Pipeline([build()]))(tokens, logits)
    expected = Pipeline([build()])(original.reshape(1, -1).clone(), torch.tensor([history]))
    assert not torch.equal(expected.reshape(shape), original)
    assert result.dtype == MX_DTYPES[dtype] and result.shape == logits.shape
    actual = torch.from_dlpack(result)
    assert torch.equal(_bits(actual.reshape(1, -1)), _bits(expected))
    for kept in (logits, source):
        assert torch.equal(_bits(torch.from_dlpack(kept)), _bits(original))
        assert torch.from_dlpack(kept).data_ptr() != actual.data_ptr()


def test_stream_generate_and_generate_accept_the_processors(loaded: Any) -> None:
    model, tokenizer = loaded
    prompt = tokenizer.encode(COUNTING)
    plain = mlx_greedy(model, prompt, n=8)
    banned = sorted(set(plain[:3]))
    expected = mlx_greedy(model, prompt, for_mlx(SuppressTokens(banned), tokenizer=tokenizer), n=8)
    responses = list(
        stream_generate(
            model,
            tokenizer,
            prompt,
            max_tokens=8,
            logits_processors=for_mlx(SuppressTokens(banned), tokenizer=tokenizer),
        )
    )
    assert [response.token for response in responses] == expected
    text = mlx_lm.generate(
        model,
        tokenizer,
        prompt,
        max_tokens=8,
        logits_processors=for_mlx(SuppressTokens(banned), tokenizer=tokenizer),
    )
    assert text == "".join(response.text for response in responses)


@pytest.fixture(scope="module")
def other_draft() -> Any:
    """Other weights, same vocabulary: its drafts get rejected, forcing rollbacks."""
    from anylogits.testing.tiny_model import TinyModelSpec, build_tiny_model

    return mlx_lm.load(str(build_tiny_model(TinyModelSpec(seed=1))))[0]


@pytest.mark.parametrize("draft", ["same_weights", "other_weights"])
def test_speculative_decoding_keeps_stateful_processors_right(
    loaded: Any, other_draft: Any, draft: str
) -> None:
    model, tokenizer = loaded
    prompt = tokenizer.encode(COUNTING)
    twin = for_mlx(GeneratedHashBiasRecompute(len(prompt), 12.0), tokenizer=tokenizer)
    expected = mlx_greedy(model, prompt, twin)
    probe = GeneratedHashBias(12.0)
    drafted = list(
        stream_generate(
            model,
            tokenizer,
            prompt,
            max_tokens=NEW_TOKENS,
            draft_model=model if draft == "same_weights" else other_draft,
            num_draft_tokens=3,
            logits_processors=for_mlx(probe, tokenizer=tokenizer),
        )
    )
    assert [response.token for response in drafted] == expected
    assert expected != mlx_greedy(model, prompt)
    if draft == "other_weights":  # drafts were rejected, so state was rolled back
        assert not all(response.from_draft for response in drafted[1:])
    assert probe.advance_calls > 0


def test_batch_generator_rows_keep_their_own_state(loaded: Any) -> None:
    model, tokenizer = loaded
    prompts = [tokenizer.encode(COUNTING), tokenizer.encode("the cat sat on the mat")]
    singles = [
        mlx_greedy(model, prompt, for_mlx(GeneratedHashBias(12.0), tokenizer=tokenizer), n=8)
        for prompt in prompts
    ]
    result = batch_generate(
        model,
        tokenizer,
        prompts,
        max_tokens=8,
        return_token_ids=True,
        logits_processors=for_mlx(GeneratedHashBias(12.0), tokenizer=tokenizer),
    )
    assert [list(ids)[:8] for ids in result.token_ids] == singles


# -- oracles: mlx-lm's own processors and sampling filters --------------------------------


VOCAB = 2_000


def _logits(seed: int, vocab: int = VOCAB) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((1, vocab)) * 3).astype(np.float32)


def ours(processor: Any, logits: np.ndarray, history: list[int]) -> np.ndarray:
    result = Pipeline([processor])(torch.from_numpy(logits.copy()), torch.tensor([history]))
    return result.numpy()


@pytest.mark.support("oracle", processor="repetition_penalty", backend="mlx")
@pytest.mark.parametrize("seed", range(6))
def test_repetition_penalty_matches_make_logits_processors(seed: int) -> None:
    logits = _logits(seed)
    history = np.random.default_rng(seed + 50).integers(0, 60, 30).tolist()
    # mlx-lm penalizes the last `repetition_context_size` tokens: cover the whole history.
    (native,) = make_logits_processors(repetition_penalty=1.3, repetition_context_size=30)
    expected = np.array(native(mx.array(history), mx.array(logits)))
    assert not np.array_equal(expected, logits)
    np.testing.assert_allclose(ours(RepetitionPenalty(1.3), logits, history), expected, rtol=1e-6)


@pytest.mark.support("oracle", processor="repetition_penalty", backend="mlx")
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("context_size", [1, 4, 20])
def test_repetition_penalty_context_size_matches_repetition_context_size(
    seed: int, context_size: int
) -> None:
    logits = _logits(seed)
    history = np.random.default_rng(seed + 50).integers(0, 60, 30).tolist()
    (native,) = make_logits_processors(repetition_penalty=1.3, repetition_context_size=context_size)
    expected = np.array(native(mx.array(history), mx.array(logits)))
    assert not np.array_equal(expected, ours(RepetitionPenalty(1.3), logits, history))
    np.testing.assert_allclose(
        ours(RepetitionPenalty(1.3, context_size=context_size), logits, history),
        expected,
        rtol=1e-6,
    )


@pytest.mark.support("oracle", processor="logit_bias", backend="mlx")
@pytest.mark.parametrize("seed", range(6))
def test_logit_bias_matches_make_logits_processors(seed: int) -> None:
    logits = _logits(seed)
    bias = {3: 2.5, 77: -4.0, 1999: 1.0}
    (native,) = make_logits_processors(logit_bias=bias)
    expected = np.array(native(mx.array([1, 2]), mx.array(logits)))
    np.testing.assert_allclose(ours(LogitBias(bias), logits, [1, 2]), expected, rtol=1e-6)


def _logprobs(logits: np.ndarray) -> Any:
    native = mx.array(logits)
    return native - mx.logsumexp(native, axis=-1, keepdims=True)


def _kept(masked: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.isfinite(masked[0])).tolist())


@pytest.mark.support("oracle", processor="temperature", backend="mlx")
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.8])
def test_temperature_draws_the_same_tokens_as_make_sampler(seed: int, temperature: float) -> None:
    """mlx-lm scales inside its sampler (``logprobs * (1 / temp)``); ours scales first and
    the sampler runs at temperature 1. With the same random state the draws agree."""
    logprobs = np.array(_logprobs(np.concatenate([_logits(seed + row) for row in range(64)])))

    def draws(sampler: Any, rows: np.ndarray) -> list[int]:
        mx.random.seed(seed)
        return np.array(sampler(mx.array(rows))).tolist()

    unscaled = draws(make_sampler(temp=1.0), logprobs)
    native = draws(make_sampler(temp=temperature), logprobs)
    assert native != unscaled, "the temperature did not change mlx-lm's draws"
    scaled = Pipeline([Temperature(temperature)])(torch.from_numpy(logprobs), torch.zeros(64, 1))
    assert draws(make_sampler(temp=1.0), scaled.numpy()) == native


# Kept-set filters: (ours, mlx-lm's filter of log-probabilities, parameter values, how
# many tokens the native one keeps: exactly k for top-k, else fewer than the vocabulary,
# so the test can fail).
KEPT_SETS: dict[
    str, tuple[Any, Callable[[Any, Any], Any], list[Any], Callable[[int, Any], bool]]
] = {
    "top_k": (TopK, apply_top_k, [1, 5, 50], lambda kept, k: kept == k),
    "top_p": (TopP, apply_top_p, [0.1, 0.5, 0.9], lambda kept, p: kept < VOCAB),
    "min_p": (MinP, apply_min_p, [0.05, 0.2, 0.5], lambda kept, p: kept < VOCAB),
}


@pytest.mark.support("oracle", backend="mlx")
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, (_, _, values, _) in KEPT_SETS.items() for value in values],
)
def test_filters_keep_the_same_tokens_as_mlx_lm(name: str, value: Any, seed: int) -> None:
    processor, apply, _, kept_as_expected = KEPT_SETS[name]
    logits = _logits(seed)
    expected = _kept(np.array(apply(_logprobs(logits), value)))
    assert kept_as_expected(len(expected), value)
    assert _kept(ours(processor(value), logits, [0])) == expected
