"""Level 4 on every engine: real generation on the tiny model, against transformers on the
same weights.

- unprocessed greedy tokens equal transformers' (the engines agree before any processor);
- every catalogue processor (``CROSS_ENGINE_CASES``) gives transformers' greedy tokens;
  on transformers itself the reference is a plain step-by-step loop through ``Pipeline``,
  independent of ``generate``'s hook wiring;
- every job of ``native_jobs`` gives the tokens of the engine's own parameters for it
  (greedy, or drawn with the same seed), where the engine has them;
- structured outputs are valid: drawn schemas and regexes, batch 1 and 8, greedy and
  sampled, every finished output validates and every cut one is a valid prefix.

What only one engine has lives in that engine's own module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anylogits import JSONSchema, LogitsProcessor, Regex
from anylogits.engines.generation import NEW_TOKENS, GenerationEngine, TransformersEngine
from anylogits.engines.native import NoNative
from conformance_tests.structured_cases import (
    BATCHES,
    GENERATION,
    JSON_TOKENS,
    PROMPTS,
    REGEX_TOKENS,
    REGEXES,
    SCHEMAS,
    check_json,
    check_regex,
)
from test_support.generation_cases import (
    COUNTING,
    CROSS_ENGINE_CASES,
    WITHOUT_THE_PROCESSOR,
    check_watermark_detected,
)
from test_support.native_jobs import (
    NATIVE_JOBS,
    NATIVE_RUNS,
    SAMPLED_TOKENS,
    in_engine_order,
)

pytestmark = pytest.mark.slow


def expected_tokens(
    backend: Any,
    reference: TransformersEngine,
    prompt: list[int],
    processors: Sequence[LogitsProcessor] = (),
) -> list[int]:
    """transformers' greedy tokens: ``generate`` for another engine; for transformers,
    whose ``generate`` is what is under test, the plain step-by-step loop."""
    if backend.name == "transformers":
        return reference.step_by_step(prompt, processors)
    return reference.greedy(prompt, processors)


def test_unprocessed_greedy_tokens_equal_transformers(
    backend: Any, engine: GenerationEngine, reference: TransformersEngine
) -> None:
    prompt = engine.encode(COUNTING)
    plain = engine.greedy(prompt)
    assert len(plain) == NEW_TOKENS
    assert plain == expected_tokens(backend, reference, prompt)


@pytest.mark.support("generation")
@pytest.mark.parametrize("case", sorted(CROSS_ENGINE_CASES))
def test_processors_give_the_same_tokens_as_on_transformers(
    backend: Any, engine: GenerationEngine, reference: TransformersEngine, case: str
) -> None:
    prompt = engine.encode(COUNTING)
    plain = engine.greedy(prompt)
    # Processors hold bound state: each engine, and each run, gets its own instances.
    processors = CROSS_ENGINE_CASES[case]
    without = WITHOUT_THE_PROCESSOR.get(case, lambda plain: [])
    expected = expected_tokens(backend, reference, prompt, processors(plain))
    assert expected != expected_tokens(backend, reference, prompt, without(plain)), (
        f"{case} did not change transformers' output"
    )
    ours = engine.greedy(prompt, processors(plain))
    assert ours != plain, f"{case} did not change {backend.name}'s output"
    assert ours == expected
    check_watermark_detected(case, ours, plain)


# -- the engines' own parameters: one job, every engine -----------------------------------


@pytest.mark.support("oracle")
@pytest.mark.parametrize(("case", "seed"), NATIVE_RUNS)
def test_processors_give_the_tokens_of_the_engines_own_parameters(
    backend: Any,
    engine: GenerationEngine,
    case: str,
    seed: int | None,
    request: pytest.FixtureRequest,
) -> None:
    native_job = NATIVE_JOBS[case]
    prompt = engine.encode(COUNTING)
    plain = engine.greedy(prompt)
    job = native_job.job(plain)
    try:
        native = (
            engine.native(prompt, job, SAMPLED_TOKENS, seed)
            if seed is not None
            else engine.native(prompt, job, NEW_TOKENS)
        )
    except NoNative as missing:
        pytest.skip(str(missing))
    if backend.name in native_job.known_differences:
        reason = native_job.known_differences[backend.name]
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    ours_processors = in_engine_order(job, backend.name) + native_job.extra(plain)
    baseline = native_job.baseline(plain) if native_job.baseline else []
    if seed is None:
        unprocessed = engine.greedy(prompt, baseline) if baseline else plain
        ours = engine.greedy(prompt, ours_processors)
    else:
        unprocessed = engine.sampled(prompt, baseline, SAMPLED_TOKENS, seed)
        ours = engine.sampled(prompt, ours_processors, SAMPLED_TOKENS, seed)
    assert native != unprocessed, f"{case}: {backend.name}'s own {sorted(job)} changed nothing"
    assert ours == native
    if native_job.holds:
        native_job.holds(ours, unprocessed)


# -- structured generation: every output valid, batch 1 and 8, greedy and sampled ---------


def prompts(batch: int) -> list[str]:
    return [PROMPTS[row % len(PROMPTS)] for row in range(batch)]


@pytest.mark.support("generation", processor="json_schema")
@GENERATION
@given(schema=SCHEMAS, batch=BATCHES, sample=st.booleans())
def test_generated_json_validates(
    engine: GenerationEngine, schema: dict, batch: int, sample: bool
) -> None:
    outputs = engine.structured(JSONSchema(schema), prompts(batch), sample, JSON_TOKENS, seed=0)
    check_json(outputs, schema, engine.vocabulary)


@pytest.mark.support("generation", processor="regex")
@GENERATION
@given(pattern=REGEXES, batch=BATCHES, sample=st.booleans())
def test_generated_text_matches_the_regex(
    engine: GenerationEngine, pattern: str, batch: int, sample: bool
) -> None:
    outputs = engine.structured(Regex(pattern), prompts(batch), sample, REGEX_TOKENS, seed=1)
    check_regex(outputs, pattern, engine.vocabulary)
