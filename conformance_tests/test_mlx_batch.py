"""mlx-lm's ``BatchGenerator`` with its rows' anylogits hooks run as one batch a step
(``anylogits.adapters.mlx.batch``, what ``anylogits serve mlx`` installs), on the tiny
model: every row gets what it gets alone."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from typing import Any

import pytest

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")
pytest.importorskip("llguidance")

from mlx_lm.generate import BatchGenerator, GenerationBatch  # noqa: E402
from mlx_lm.sample_utils import make_logits_processors  # noqa: E402

from anylogits import (  # noqa: E402
    JSONSchema,
    MinNewTokens,
    NoRepeatNGram,
    RepetitionPenalty,
    for_mlx,
)
from anylogits.adapters.mlx import MlxLogitsProcessor, _vocabulary_of, batch  # noqa: E402
from anylogits.core.pending import PendingLogits  # noqa: E402
from anylogits.core.persistent_batch import PersistentBatch  # noqa: E402
from anylogits.engines.generation import MlxEngine  # noqa: E402
from test_support.generation_cases import COUNTING  # noqa: E402
from test_support.probes import GeneratedHashBias  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("mlx")]

NEW = 16
PROMPTS = [COUNTING, "The weather today is", "JSON:", "Numbers: 1 2 3", "Hello there"]
OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
STRINGS = {"type": "array", "items": {"type": "string"}, "maxItems": 3}


@pytest.fixture(scope="module")
def loaded(engines: Any) -> tuple[Any, Any]:
    engine: MlxEngine = engines["mlx"]
    return engine.model, engine.tokenizer


@pytest.fixture
def batched(loaded: Any) -> Iterator[batch.BatchedHooks]:
    saved = GenerationBatch._step
    hooks = batch.install(_vocabulary_of(loaded[1]))
    assert hooks is not None, "this mlx-lm's GenerationBatch._step is not the one copied"
    try:
        yield hooks
    finally:
        GenerationBatch._step = saved


def row_lists(tokenizer: Any) -> list[list[Any]]:
    """One processor list per prompt: grammars of two schemas, mlx-lm's own penalty
    before ours, a row without processors, a penalty alone."""
    return [
        for_mlx(JSONSchema(OBJECT), tokenizer=tokenizer),
        for_mlx(JSONSchema(STRINGS), tokenizer=tokenizer),
        [],
        [
            *make_logits_processors(repetition_penalty=1.3),
            *for_mlx(NoRepeatNGram(2), tokenizer=tokenizer),
        ],
        for_mlx(RepetitionPenalty(1.5), tokenizer=tokenizer),
    ]


def generate_rows(model: Any, tokenizer: Any, prompts: list[list[int]], lists: Any) -> list[Any]:
    """Each prompt's greedy tokens from one ``BatchGenerator`` (stopping at EOS)."""
    generator = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids])
    uids = generator.insert(prompts, [NEW] * len(prompts), logits_processors=lists)
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    while responses := generator.next_generated():
        for response in responses:
            tokens[response.uid].append(response.token)
    generator.close()
    return [tokens[uid] for uid in uids]


def test_each_row_gets_what_it_gets_alone_with_the_hooks_run_at_once(
    loaded: Any, batched: batch.BatchedHooks, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = loaded
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    eos = set(tokenizer.eos_token_ids)
    alone = [
        MlxEngine.steps(model, prompt, hooks or None, NEW, stop=eos)
        for prompt, hooks in zip(prompts, row_lists(tokenizer), strict=True)
    ]
    plain = [MlxEngine.steps(model, prompt, None, NEW, stop=eos) for prompt in prompts]
    changed = [row for row, (a, p) in enumerate(zip(alone, plain, strict=True)) if a != p]
    assert changed == [0, 1, 3, 4], "a row's processors do not change its greedy tokens"

    def alone_call(self: Any, tokens: Any, logits: Any) -> Any:
        raise AssertionError("a row's hook ran on its row alone")

    calls: list[int] = []
    process = PersistentBatch.process

    def counted(self: PersistentBatch, logits: Any, *args: Any, **kwargs: Any) -> Any:
        # Handed over before they are computed: masks are filled while the model runs.
        assert isinstance(logits, PendingLogits), type(logits)
        calls.append(logits.rows)
        return process(self, logits, *args, **kwargs)

    monkeypatch.setattr(MlxLogitsProcessor, "__call__", alone_call)
    monkeypatch.setattr(PersistentBatch, "process", counted)
    assert generate_rows(model, tokenizer, prompts, row_lists(tokenizer)) == alone
    assert calls and max(calls) == len(prompts), calls


def test_bfloat16_rows_get_what_they_get_alone(
    tiny_model_dir: Any, batched: batch.BatchedHooks
) -> None:
    model, tokenizer = mlx_lm.load(str(tiny_model_dir))
    model.set_dtype(mx.bfloat16)
    prompts = [tokenizer.encode(text) for text in PROMPTS[:3]]
    lists = row_lists(tokenizer)[:3]
    eos = set(tokenizer.eos_token_ids)
    alone = [
        MlxEngine.steps(model, prompt, hooks or None, NEW, stop=eos)
        for prompt, hooks in zip(prompts, lists, strict=True)
    ]
    assert alone[0] != MlxEngine.steps(model, prompts[0], None, NEW, stop=eos)
    assert generate_rows(model, tokenizer, prompts, row_lists(tokenizer)[:3]) == alone


def test_rows_that_leave_are_forgotten(loaded: Any, batched: batch.BatchedHooks) -> None:
    model, tokenizer = loaded
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    generate_rows(model, tokenizer, prompts, row_lists(tokenizer))
    gc.collect()
    assert len(batched) == 0
    generate_rows(model, tokenizer, prompts[:1], [for_mlx(MinNewTokens(2), tokenizer=tokenizer)])
    gc.collect()
    assert len(batched) == 0
    assert len(batched._requests) == 1, "the first generation's requests are still held"


def test_rows_sharing_one_hook_keep_their_own_state(
    loaded: Any, batched: batch.BatchedHooks
) -> None:
    """One list for every row (as ``batch_generate`` passes it): one pipeline, a state
    per row."""
    model, tokenizer = loaded
    prompts = [tokenizer.encode(COUNTING), tokenizer.encode("the cat sat on the mat")]
    hooks = for_mlx(GeneratedHashBias(12.0), tokenizer=tokenizer)
    singles = [
        MlxEngine.steps(model, prompt, for_mlx(GeneratedHashBias(12.0), tokenizer=tokenizer), 8)
        for prompt in prompts
    ]
    assert singles != [MlxEngine.steps(model, prompt, None, 8) for prompt in prompts]
    generated = generate_rows(model, tokenizer, prompts, [hooks, hooks])
    assert [tokens[:8] for tokens in generated] == singles


def test_another_releases_step_is_left_as_it_is(
    loaded: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(batch, "STEP_SHA256", "0" * 64)
    step = GenerationBatch._step
    with caplog.at_level(logging.WARNING, logger=batch.__name__):
        assert batch.install(_vocabulary_of(loaded[1])) is None
    assert GenerationBatch._step is step
    assert "each request's processors run on its row alone" in caplog.text


def test_for_mlx_takes_the_hugging_face_tokenizer_itself(loaded: Any) -> None:
    model, tokenizer = loaded
    hf_tokenizer = tokenizer._tokenizer
    prompt = tokenizer.encode(COUNTING)
    through_mlx = for_mlx(RepetitionPenalty(1.3), tokenizer=tokenizer)
    through_hf = for_mlx(RepetitionPenalty(1.3), tokenizer=hf_tokenizer)
    assert through_hf[0].pipeline.vocab.eos_token_ids >= {hf_tokenizer.eos_token_id}
    expected = MlxEngine.steps(model, prompt, through_mlx, 8)
    assert MlxEngine.steps(model, prompt, through_hf, 8) == expected
