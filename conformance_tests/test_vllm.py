"""vLLM on the tiny model's HF folder with vLLM's V1 model runner (CPU, float32,
in-process engine; generation against transformers is in ``test_generation``): a mixed
batch whose rows finish, leave and move; a failing processor ends its own request only;
vLLM's own sampling parameters as oracles on the same engine (stop, and
structured_outputs through its llguidance backend; temperature, top_k, top_p, min_p,
repetition_penalty, logit_bias and min_tokens are one job on every engine in
``test_generation``).

vLLM's ``presence_penalty``, ``frequency_penalty`` and ``bad_words`` are compared with
ours function by function in ``test_oracles_penalties`` / ``test_oracles_bans``.
Speculative decoding is not run here: vLLM's V1 runner refuses custom logits processors
with it (one engine per session keeps this fast).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")

from vllm import SamplingParams  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

from anylogits import (  # noqa: E402
    Choice,
    Grammar,
    JSONSchema,
    LogitBias,
    LogitsProcessor,
    NoRepeatNGram,
    Regex,
    RepetitionPenalty,
    StopStrings,
    SuppressTokens,
    TopK,
)
from anylogits.engines.generation import VllmEngine  # noqa: E402
from anylogits.engines.vllm_recording import RecordingAnyLogits  # noqa: E402
from test_support.generation_cases import (  # noqa: E402
    COUNTING,
    SMALL_CHOICES,
    SMALL_GBNF,
    SMALL_REGEX,
    SMALL_SCHEMA,
)
from test_support.probes import GeneratedHashBias, RaiseAfter  # noqa: E402

try:  # vLLM 0.32 re-raises validate_params' ValueError as this one (not a ValueError)
    from vllm.exceptions import VLLMValidationError
except ImportError:  # pragma: no cover - older vLLM raises the ValueError itself
    VLLMValidationError = ValueError  # type: ignore[assignment,misc]

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("vllm")]


@pytest.fixture(scope="module")
def engine(engines: Any) -> VllmEngine:
    """The in-process ``LLM``, its anylogits class counting batch updates
    (``RecordingAnyLogits``), at most ``VLLM_MAX_NUM_SEQS`` rows."""
    return engines["vllm"]


@pytest.fixture(scope="module")
def hf(hf_reference: tuple[Any, Any]) -> tuple[Any, Any]:
    return hf_reference


@pytest.fixture(scope="module")
def prompt(hf: tuple[Any, Any]) -> list[int]:
    """The COUNTING prompt's ids (BOS included), the same for both engines."""
    return hf[1].encode(COUNTING)


@pytest.fixture(scope="module")
def eos(hf: tuple[Any, Any]) -> int:
    return int(hf[1].eos_token_id)


def greedy(
    engine: VllmEngine, prompt: list[int], *processors: LogitsProcessor, **kwargs: Any
) -> list[int]:
    """Greedy tokens under ``processors`` and vLLM's own sampling parameters ``kwargs``."""
    return engine.greedy(prompt, processors, **kwargs)


@pytest.fixture(scope="module")
def plain(engine: VllmEngine, prompt: list[int]) -> list[int]:
    """vLLM's unprocessed greedy tokens."""
    return greedy(engine, prompt)


# -- a mixed batch ------------------------------------------------------------------------


def test_mixed_batch_rows_equal_each_request_run_alone(
    engine: VllmEngine, hf: Any, prompt: list[int], plain: list[int]
) -> None:
    tokenizer = hf[1]
    cat = tokenizer.encode("the cat sat on the mat and then it")
    story = tokenizer.encode("Once upon a time there was a")
    cat_first = greedy(engine, cat, max_tokens=1)[0]
    # (prompt, processors factory, max_tokens, extra sampling kwargs): rows finish at
    # different steps; with VLLM_MAX_NUM_SEQS < len(requests), waiting requests take freed
    # slots, and once none wait vLLM condenses its persistent batch by moving the two
    # long rows (slots 2 and 3) down while they still have tokens to go. The stateful
    # probe in slot 3 changes every step's boost, so a mishandled move shows (checked:
    # a no-op PersistentBatch.move makes this test fail).
    requests: list[tuple[list[int], Callable[[], list[LogitsProcessor]], int, dict]] = [
        (prompt, lambda: [], 3, {}),
        (cat, lambda: [RepetitionPenalty(1.3)], 6, {}),
        (prompt, lambda: [NoRepeatNGram(2)], 24, {}),  # the same spec as the 5th
        (story, lambda: [GeneratedHashBias(12.0)], 24, {}),
        (cat, lambda: [NoRepeatNGram(2)], 8, {}),
        (story, lambda: [TopK(5)], 7, {"temperature": 1.0, "seed": 11}),
        (prompt, lambda: [], 2, {}),
        (cat, lambda: [LogitBias({cat_first: -20.0})], 6, {}),
        (prompt, lambda: [SuppressTokens(sorted(set(plain[:4])))], 4, {}),
    ]

    def params(make: Callable[[], list[LogitsProcessor]], n: int, extra: dict) -> SamplingParams:
        return engine.params(*make(), **{"max_tokens": n, "temperature": 0.0, **extra})

    alone = [
        engine.generate([(ids, params(make, n, extra))])[0] for ids, make, n, extra in requests
    ]
    # Each processor changes its request's output (so a row given another row's
    # processors, or none, would be caught).
    for (ids, make, n, extra), tokens in zip(requests, alone, strict=True):
        assert len(tokens) == n
        if make():
            unprocessed = engine.generate([(ids, params(lambda: [], n, extra))])[0]
            assert tokens != unprocessed, make()

    before = (RecordingAnyLogits.added, RecordingAnyLogits.removed, RecordingAnyLogits.moved)
    batched = engine.generate([(ids, params(make, n, extra)) for ids, make, n, extra in requests])
    assert batched == alone
    added, removed, moved = (
        RecordingAnyLogits.added - before[0],
        RecordingAnyLogits.removed - before[1],
        RecordingAnyLogits.moved - before[2],
    )
    # vLLM reuses a finished row's slot for a waiting request (reported as an add, not a
    # removal) and condenses the batch by moving its last rows into the other holes.
    assert added == len(requests) and moved > 0, (added, removed, moved)


# -- oracle level: vLLM's own sampling parameters on the same engine ----------------------


@pytest.mark.support("oracle", processor="stop_strings", backend="vllm")
@pytest.mark.parametrize("span", [(2, 3), (5, 7)], ids=["within_a_token", "across_tokens"])
def test_stop_strings_end_where_vllm_stop_ends(
    engine: VllmEngine,
    hf: tuple[Any, Any],
    prompt: list[int],
    plain: list[int],
    eos: int,
    span: tuple,
) -> None:
    """vLLM's ``stop`` ends the request at the token completing the string (its text is
    cut, its token ids are not); ours forces EOS right after that token."""
    tokenizer = hf[1]
    start, end = span
    text = tokenizer.decode(plain[start:end])
    stop = text[1:-1] if end - start > 1 else text[1:]  # completed inside token end - 1
    native = greedy(engine, prompt, stop=[stop], include_stop_str_in_output=True)
    assert native == plain[:end] and native != plain
    ours = greedy(engine, prompt, StopStrings([stop], eos_token_id=eos))
    assert ours == [*native, eos]


# The same constraint through vLLM's own structured outputs and through ours: the same
# allowed tokens, so the same greedy tokens.
NATIVE_STRUCTURED: dict[str, tuple[dict[str, Any], Callable[[], LogitsProcessor]]] = {
    "regex": ({"regex": SMALL_REGEX}, lambda: Regex(SMALL_REGEX)),
    "choice": ({"choice": SMALL_CHOICES}, lambda: Choice(SMALL_CHOICES)),
    "grammar": ({"grammar": SMALL_GBNF}, lambda: Grammar(SMALL_GBNF, syntax="gbnf")),
    # vLLM's JSON allows any whitespace by default; so does ours with flexible_whitespace.
    "json_schema": (
        {"json": SMALL_SCHEMA},
        lambda: JSONSchema(SMALL_SCHEMA, flexible_whitespace=True),
    ),
}


@pytest.mark.support("oracle", backend="vllm")
@pytest.mark.parametrize("case", sorted(NATIVE_STRUCTURED))
def test_structured_processors_give_the_tokens_of_vllm_structured_outputs(
    engine: VllmEngine, prompt: list[int], plain: list[int], case: str
) -> None:
    constraint, processor = NATIVE_STRUCTURED[case]
    native = greedy(engine, prompt, structured_outputs=StructuredOutputsParams(**constraint))
    assert native != plain
    assert greedy(engine, prompt, processor()) == native


# -- failures -----------------------------------------------------------------------------


def test_bad_spec_is_rejected_by_generate_and_the_engine_still_runs(
    engine: VllmEngine, prompt: list[int], plain: list[int]
) -> None:
    bad = SamplingParams(max_tokens=4, extra_args={"anylogits": [{"type": "top_k", "top_k": 0}]})
    with pytest.raises((ValueError, VLLMValidationError)) as raised:
        engine.generate([(prompt, bad)])
    message = str(raised.value)
    assert "extra_args['anylogits'][0]" in message and "top_k" in message
    assert greedy(engine, prompt) == plain
    assert greedy(engine, prompt, RepetitionPenalty(1.3)) != plain


def test_a_processor_failing_in_the_engine_ends_its_request_and_no_other(
    engine: VllmEngine, hf: Any, prompt: list[int], plain: list[int], eos: int
) -> None:
    """A processor raising inside ``apply()`` ends its own request with EOS; the other
    requests of the same batch get exactly the tokens they get alone, and the engine
    keeps serving."""
    story = hf[1].encode("Once upon a time there was a")
    requests: list[tuple[list[int], list[LogitsProcessor]]] = [
        (prompt, [RepetitionPenalty(1.3)]),
        (prompt, [RaiseAfter(3)]),
        (story, []),
        (story, [NoRepeatNGram(2)]),
        (prompt, [RaiseAfter(3), TopK(5)]),
        (story, [GeneratedHashBias(12.0)]),
    ]

    def params(processors: list[LogitsProcessor]) -> SamplingParams:
        return engine.params(*processors, max_tokens=12, temperature=0.0)

    alone = [engine.generate([(ids, params(processors))])[0] for ids, processors in requests]
    batched = engine.generate([(ids, params(processors)) for ids, processors in requests])
    assert batched == alone
    for (_, processors), tokens in zip(requests, batched, strict=True):
        if any(isinstance(p, RaiseAfter) for p in processors):
            # Three tokens, then the failure: EOS, and the request is over.
            assert tokens == [*plain[:3], eos], tokens
        else:
            assert len(tokens) == 12
    assert greedy(engine, prompt) == plain
