"""MLX (mlx-lm) on the tiny model's HF folder, which mlx-lm loads directly: bf16;
speculative decoding; BatchGenerator; every generate API (generation against transformers
and mlx-lm's own parameters is in ``test_generation``, mlx-lm's processors and samplers on
arrays in the ``test_oracles_<module>`` files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")
transformers = pytest.importorskip("transformers")

from mlx_lm.generate import batch_generate, stream_generate  # noqa: E402

from anylogits import (  # noqa: E402
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    Pipeline,
    RepetitionPenalty,
    SuppressTokens,
    for_mlx,
)
from anylogits.adapters.mlx import MlxLogitsProcessor  # noqa: E402
from anylogits.core.batch import Batch  # noqa: E402
from anylogits.engines.generation import NEW_TOKENS, MlxEngine  # noqa: E402
from test_support.generation_cases import COUNTING  # noqa: E402
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


def test_a_warm_prompt_cache_gives_the_cold_tokens(loaded: Any) -> None:
    # stream_generate passes processors only the prompt it feeds the model: the cached
    # prefix comes back through cached_tokens. The prompt ends with the greedy tokens the
    # model goes on to repeat, so a penalty blind to the prefix changes the output.
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = loaded
    counting = tokenizer.encode(COUNTING)
    prompt = counting + mlx_greedy(model, counting, n=7)
    cold = mlx_greedy(model, prompt, for_mlx(RepetitionPenalty(1.3), tokenizer=tokenizer))
    assert cold != mlx_greedy(model, prompt), "the penalty does not change the greedy output"

    def warm(**cached: Any) -> list[int]:
        cache = make_prompt_cache(model)
        model(mx.array(prompt[:-1])[None], cache=cache)
        hooks = for_mlx(RepetitionPenalty(1.3), tokenizer=tokenizer, **cached)
        responses = stream_generate(
            model,
            tokenizer,
            prompt[-1:],
            max_tokens=NEW_TOKENS,
            prompt_cache=cache,
            logits_processors=hooks,
        )
        return [response.token for response in responses]

    assert warm(cached_tokens=prompt[:-1]) == cold
    assert warm() != cold, "the cache no longer hides the prefix"


@pytest.mark.parametrize("bad", [[-1], [1.5], [True]])
def test_cached_tokens_must_be_token_ids(loaded: Any, bad: list[Any]) -> None:
    with pytest.raises(ValueError, match=f"cached_tokens must be token ids.*{bad[0]!r}"):
        for_mlx(RepetitionPenalty(1.3), tokenizer=loaded[1], cached_tokens=bad)


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
