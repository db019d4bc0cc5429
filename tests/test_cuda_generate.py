"""On a real CUDA device (the catalogue's decode steps there: ``tests/test_cuda.py``):
transformers' ``generate`` on the tiny model moved to the device: each job of
``test_support.native_jobs`` through anylogits gives the tokens of transformers'
own parameters (greedy: identical ids; sampled: the same seed, the same draws), after
the job is shown to change the unprocessed tokens; every generation case gives the
tokens of a plain step-by-step loop; NoRepeatNGram and a composed hook on a
left-padded batch give the tokens of transformers' own processors.

Every test here skips without CUDA; ``nox -s gpu`` (``tools/gpu_check.py``) runs them on a
GPU machine, with the tiny model from anylogits' cache or from the folder
``ANYLOGITS_GPU_TINY_MODEL`` names. ``tests/cuda_fixtures.py`` holds what the GPU suite's
modules share.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_fixtures import (
    DEVICE,
    HAS_LLGUIDANCE,
    REQUIRES_DEVICE,
    fresh_greenlists,  # noqa: F401 (autouse)
    write_report,  # noqa: F401 (autouse)
)

from test_support.engine_rows import STRUCTURED

pytestmark = REQUIRES_DEVICE


def tiny_model_folder(scratch: pytest.TempPathFactory) -> Path:
    """The tiny model: from the prepared folder ``ANYLOGITS_GPU_TINY_MODEL`` names (a
    machine without network; ``python tools/gpu_check.py --prepare DIR`` writes it), else
    from anylogits' cache."""
    from anylogits.testing.tiny_model import build_tiny_model, tiny_model_cached

    prepared = os.environ.get("ANYLOGITS_GPU_TINY_MODEL")
    if prepared:
        from test_support.gpu_tiny_model import install

        folder, _ = install(Path(prepared), scratch.mktemp("anylogits-cache"))
        return folder
    if tiny_model_cached():
        return build_tiny_model()
    pytest.skip(
        "the tiny model is not in anylogits' cache and ANYLOGITS_GPU_TINY_MODEL is not set "
        "(python tools/gpu_check.py --prepare DIR writes a folder for it)"
    )


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("transformers")
    from anylogits.engines.generation import TransformersEngine

    loaded = TransformersEngine.load(tiny_model_folder(tmp_path_factory))
    loaded.model.to(DEVICE)
    return loaded


def _native_runs() -> list[tuple[str, int | None]]:
    from test_support.native_jobs import NATIVE_RUNS

    return NATIVE_RUNS


def _generation_cases() -> list[str]:
    from test_support.generation_cases import CROSS_ENGINE_CASES

    return sorted(CROSS_ENGINE_CASES)


@pytest.mark.parametrize(("case", "seed"), _native_runs())
def test_native_jobs_on_the_device(engine: Any, case: str, seed: int | None) -> None:
    from anylogits.engines.generation import NEW_TOKENS
    from test_support.generation_cases import COUNTING
    from test_support.native_jobs import NATIVE_JOBS, SAMPLED_TOKENS, in_engine_order

    native_job = NATIVE_JOBS[case]
    if "transformers" in native_job.known_differences:
        pytest.skip(native_job.known_differences["transformers"])
    prompt = engine.encode(COUNTING)
    plain = engine.greedy(prompt)
    job = native_job.job(plain)
    ours_processors = in_engine_order(job, "transformers") + native_job.extra(plain)
    baseline = native_job.baseline(plain) if native_job.baseline else []
    if seed is None:
        native = engine.native(prompt, job, NEW_TOKENS)
        unprocessed = engine.greedy(prompt, baseline) if baseline else plain
        ours = engine.greedy(prompt, ours_processors)
    else:
        native = engine.native(prompt, job, SAMPLED_TOKENS, seed)
        unprocessed = engine.sampled(prompt, baseline, SAMPLED_TOKENS, seed)
        ours = engine.sampled(prompt, ours_processors, SAMPLED_TOKENS, seed)
    assert native != unprocessed, f"{case}: transformers' own {sorted(job)} changed nothing"
    assert ours == native, f"{case}:\nours   {ours}\nnative {native}"
    if native_job.holds:
        native_job.holds(ours, unprocessed)


@pytest.mark.parametrize("case", _generation_cases())
def test_generate_gives_the_plain_loops_tokens_on_the_device(engine: Any, case: str) -> None:
    from test_support.generation_cases import (
        COUNTING,
        CROSS_ENGINE_CASES,
        WITHOUT_THE_PROCESSOR,
        check_watermark_detected,
    )

    if case in STRUCTURED and not HAS_LLGUIDANCE:
        pytest.skip("llguidance is not installed: the structured processors need it")
    prompt = engine.encode(COUNTING)
    plain = engine.greedy(prompt)
    processors = CROSS_ENGINE_CASES[case]
    without = WITHOUT_THE_PROCESSOR.get(case, lambda plain: [])
    expected = engine.step_by_step(prompt, processors(plain))
    assert expected != engine.step_by_step(prompt, without(plain)), f"{case} changed nothing"
    ours = engine.greedy(prompt, processors(plain))
    assert ours != plain, f"{case} did not change generate's output"
    assert ours == expected
    check_watermark_detected(case, ours, plain)


def generate_batch(engine: Any, prompts: list[str], processors: list[Any], n: int) -> list[Any]:
    """New token ids of each prompt, left-padded into one batch on the device, greedy,
    through a list of transformers logits processors."""
    import transformers

    eos = engine.tokenizer.eos_token_id
    rows = [engine.encode(prompt) for prompt in prompts]
    width = max(map(len, rows))
    ids = torch.tensor([[eos] * (width - len(r)) + r for r in rows], device=DEVICE)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=DEVICE)
    output = engine.model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=n,
        logits_processor=transformers.LogitsProcessorList(processors),
        pad_token_id=eos,
        do_sample=False,
        temperature=1.0,
        top_k=None,
        top_p=1.0,
    )
    return output[:, width:].tolist()


def test_no_repeat_ngram_and_a_composed_hook_on_a_padded_batch(engine: Any) -> None:
    from transformers import (
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    from anylogits import NoRepeatNGram, RepetitionPenalty, SuppressTokens, for_transformers
    from test_support.generation_cases import COUNTING

    prompts = [COUNTING, "the cat the cat the cat the cat"]
    plain = generate_batch(engine, prompts, [], 24)
    jobs = [
        ([NoRepeatNGramLogitsProcessor(2)], [NoRepeatNGram(2)]),
        (
            [
                RepetitionPenaltyLogitsProcessor(1.3),
                NoRepeatNGramLogitsProcessor(3),
                SuppressTokensLogitsProcessor([16], device=DEVICE),
            ],
            [RepetitionPenalty(1.3), NoRepeatNGram(3), SuppressTokens([16])],
        ),
    ]
    for natives, ours in jobs:
        native = generate_batch(engine, prompts, natives, 24)
        hooked = generate_batch(engine, prompts, [for_transformers(*ours)], 24)
        assert native != plain, f"{natives} changed nothing"
        assert hooked == native, f"\nours   {hooked}\nnative {native}"
