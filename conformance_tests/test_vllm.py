"""vLLM: real generation on the tiny model's HF folder with vLLM's V1 model runner (CPU,
float32, in-process engine) against transformers on the same weights; a mixed batch whose
rows finish, leave and move; vLLM's own sampling parameters as oracles on the same engine
(temperature, top_k, top_p, min_p, repetition_penalty, logit_bias, min_tokens, stop, and
structured_outputs through its llguidance backend).

vLLM's ``presence_penalty``, ``frequency_penalty`` and ``bad_words`` are compared with
ours function by function in ``test_oracles_penalties`` / ``test_oracles_sequences``.
Speculative decoding is not run here: vLLM's V1
runner refuses custom logits processors with it (one engine per module keeps this fast).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
    MinNewTokens,
    MinP,
    NoRepeatNGram,
    Regex,
    RepetitionPenalty,
    StopStrings,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
    for_vllm,
)
from anylogits.adapters.vllm import AnyLogits  # noqa: E402
from anylogits.core.vocab import hf_vocabulary  # noqa: E402
from anylogits.testing.probes import GeneratedHashBias, RaiseAfter  # noqa: E402
from conformance_tests.reference import (  # noqa: E402
    COUNTING,
    CROSS_ENGINE_CASES,
    NEW_TOKENS,
    SMALL_CHOICES,
    SMALL_GBNF,
    SMALL_REGEX,
    SMALL_SCHEMA,
    check_watermark_detected,
    hf_greedy,
)
from conformance_tests.structured_cases import (  # noqa: E402
    BATCHES,
    GENERATION,
    JSON_TOKENS,
    PROMPTS,
    REGEX_TOKENS,
    REGEXES,
    SCHEMAS,
    Generated,
    check_json,
    check_regex,
    generated,
)

try:  # vLLM 0.32 re-raises validate_params' ValueError as this one (not a ValueError)
    from vllm.exceptions import VLLMValidationError
except ImportError:  # pragma: no cover - older vLLM raises the ValueError itself
    VLLMValidationError = ValueError  # type: ignore[assignment,misc]

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("vllm")]

MAX_NUM_SEQS = 4  # fewer than the mixed batch's requests: later ones join as rows free up


class RecordingAnyLogits(AnyLogits):
    """:class:`AnyLogits` that counts the batch updates vLLM sends (the engine runs
    in-process), so that the mixed-batch test can show that rows did move."""

    added = 0
    removed = 0
    moved = 0

    def update_state(self, batch_update: Any) -> None:
        if batch_update is not None:
            cls = type(self)
            cls.added += len(batch_update.added)
            cls.removed += len(batch_update.removed)
            cls.moved += len(batch_update.moved)
        super().update_state(batch_update)


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    settings = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this process: a fast start
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
        "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")),
    }
    # Set for this module only: a vLLM server another module starts inherits os.environ.
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings.items():
            if name not in os.environ:
                patch.setenv(name, value)
        from vllm import LLM

        yield LLM(
            str(tiny_model_dir),
            dtype="float32",
            max_model_len=256,
            max_num_seqs=MAX_NUM_SEQS,
            seed=0,
            enforce_eager=True,
            logits_processors=[RecordingAnyLogits],
            # Structured-output oracles: llguidance, as under ours. xgrammar (vLLM's
            # "auto" choice) allows every tokenization of forced text, llguidance only
            # the canonical one (see test_llama_cpp's grammar-sampler tests).
            structured_outputs_config={"backend": "guidance"},
        )


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


def generate(llm: Any, requests: list[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    """Token ids of each request, all submitted in one ``llm.generate`` call."""
    outputs = llm.generate(
        [{"prompt_token_ids": ids} for ids, _ in requests],
        [params for _, params in requests],
        use_tqdm=False,
    )
    return [list(output.outputs[0].token_ids) for output in outputs]


def greedy(llm: Any, prompt: list[int], *processors: LogitsProcessor, **kwargs: Any) -> list[int]:
    kwargs = {"max_tokens": NEW_TOKENS, "temperature": 0.0, **kwargs}
    params = for_vllm(*processors, **kwargs) if processors else SamplingParams(**kwargs)
    return generate(llm, [(prompt, params)])[0]


@pytest.fixture(scope="module")
def plain(llm: Any, prompt: list[int]) -> list[int]:
    """vLLM's unprocessed greedy tokens."""
    return greedy(llm, prompt)


# -- generation level: the same tokens as transformers ------------------------------------


def test_unprocessed_greedy_tokens_equal_transformers(
    plain: list[int], hf: Any, prompt: list[int]
) -> None:
    assert len(plain) == NEW_TOKENS
    assert plain == hf_greedy(*hf, prompt, n=NEW_TOKENS)


@pytest.mark.support("generation", backend="vllm")
@pytest.mark.parametrize("case", sorted(CROSS_ENGINE_CASES))
def test_processors_give_the_same_tokens_as_on_transformers(
    llm: Any, hf: Any, prompt: list[int], plain: list[int], case: str
) -> None:
    # Processors hold bound state: each engine gets its own instances.
    expected = hf_greedy(*hf, prompt, *CROSS_ENGINE_CASES[case](plain), n=NEW_TOKENS)
    assert expected != plain, "the processor did not change transformers' output"
    ours = greedy(llm, prompt, *CROSS_ENGINE_CASES[case](plain))
    assert ours == expected
    check_watermark_detected(case, ours, plain)


def test_mixed_batch_rows_equal_each_request_run_alone(
    llm: Any, hf: Any, prompt: list[int], plain: list[int]
) -> None:
    tokenizer = hf[1]
    cat = tokenizer.encode("the cat sat on the mat and then it")
    story = tokenizer.encode("Once upon a time there was a")
    cat_first = greedy(llm, cat, max_tokens=1)[0]
    # (prompt, processors factory, max_tokens, extra sampling kwargs): rows finish at
    # different steps; with MAX_NUM_SEQS < len(requests), waiting requests take freed
    # slots, and once none wait vLLM condenses its persistent batch by moving the two
    # long rows (slots 2 and 3) down while they still have tokens to go. The stateful
    # probe in slot 3 changes every step's boost, so a mishandled move shows (checked:
    # a no-op SlotBatch.move makes this test fail).
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
        kwargs = {"max_tokens": n, "temperature": 0.0, **extra}
        processors = make()
        return for_vllm(*processors, **kwargs) if processors else SamplingParams(**kwargs)

    alone = [generate(llm, [(ids, params(make, n, extra))])[0] for ids, make, n, extra in requests]
    # Each processor changes its request's output (so a row given another row's
    # processors, or none, would be caught).
    for (ids, make, n, extra), tokens in zip(requests, alone, strict=True):
        assert len(tokens) == n
        if make():
            unprocessed = generate(llm, [(ids, params(lambda: [], n, extra))])[0]
            assert tokens != unprocessed, make()

    before = (RecordingAnyLogits.added, RecordingAnyLogits.removed, RecordingAnyLogits.moved)
    batched = generate(llm, [(ids, params(make, n, extra)) for ids, make, n, extra in requests])
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


@pytest.mark.support("oracle", processor="repetition_penalty", backend="vllm")
def test_repetition_penalty_matches_vllm_repetition_penalty(
    llm: Any, prompt: list[int], plain: list[int]
) -> None:
    native = greedy(llm, prompt, repetition_penalty=1.3)
    assert native != plain
    assert greedy(llm, prompt, RepetitionPenalty(1.3)) == native


@pytest.mark.support("oracle", processor="logit_bias", backend="vllm")
def test_logit_bias_matches_vllm_logit_bias(llm: Any, prompt: list[int], plain: list[int]) -> None:
    bias = {plain[0]: -5.0, plain[-1]: 4.0}
    native = greedy(llm, prompt, logit_bias=bias)
    assert native != plain
    assert greedy(llm, prompt, LogitBias(bias)) == native


@pytest.mark.support("oracle", processor="min_new_tokens", backend="vllm")
@pytest.mark.parametrize("explicit_eos", [False, True], ids=["engine_eos", "explicit_eos"])
def test_min_new_tokens_matches_vllm_min_tokens(
    llm: Any, prompt: list[int], eos: int, explicit_eos: bool
) -> None:
    push = {eos: 30.0}
    assert greedy(llm, prompt, LogitBias(push)) == [eos]  # EOS comes first unless held
    native = greedy(llm, prompt, min_tokens=5, logit_bias=push)
    assert len(native) == 6 and eos not in native[:5] and native[5] == eos
    # Without eos_token_id, MinNewTokens takes the EOS ids from the engine's tokenizer.
    held = MinNewTokens(5, eos_token_id=eos if explicit_eos else None)
    assert greedy(llm, prompt, held, LogitBias(push)) == native


# vLLM's sampling parameters -> our processors for the same distribution. vLLM applies
# temperature, then min-p, then top-k and top-p; ours run in the pipeline, before vLLM's
# sampler at temperature 1.0. The same kept logits and the same per-request seed give
# the same Gumbel-max draws, so the sampled ids must be identical.
SAMPLING_CASES: dict[str, tuple[dict[str, Any], Callable[[], list[LogitsProcessor]]]] = {
    "top_k": ({"top_k": 5}, lambda: [TopK(5)]),
    "top_p": ({"top_p": 0.8}, lambda: [TopP(0.8)]),
    "min_p": ({"min_p": 0.2}, lambda: [MinP(0.2)]),
    # At temperature 1 the tiny model's nucleus for 0.8 holds ~1300 tokens; at 0.5 about 8,
    # so there the top-p boundary decides draws.
    "temperature_top_p": (
        {"temperature": 0.5, "top_p": 0.8},
        lambda: [Temperature(0.5), TopP(0.8)],
    ),
    "temperature_min_p_top_k_top_p": (
        {"temperature": 0.7, "min_p": 0.05, "top_k": 12, "top_p": 0.9},
        lambda: [Temperature(0.7), MinP(0.05), TopK(12), TopP(0.9)],
    ),
}
SAMPLED_TOKENS = 24


@pytest.mark.parametrize("seed", [7, 1234])
@pytest.mark.support("oracle", backend="vllm")
@pytest.mark.parametrize("case", sorted(SAMPLING_CASES))
def test_sampling_filters_draw_the_same_tokens_as_vllm_with_the_same_seed(
    llm: Any, prompt: list[int], case: str, seed: int
) -> None:
    native_kwargs, processors = SAMPLING_CASES[case]
    common = {"max_tokens": SAMPLED_TOKENS, "seed": seed}
    temperature = native_kwargs.get("temperature", 1.0)
    unfiltered, native, ours = generate(
        llm,
        [
            (prompt, SamplingParams(**common, temperature=temperature)),
            (prompt, SamplingParams(**common, **{"temperature": 1.0, **native_kwargs})),
            (prompt, for_vllm(*processors(), **common, temperature=1.0)),
        ],
    )
    assert native != unfiltered, "the filter did not change vLLM's draws"
    assert ours == native


@pytest.mark.support("oracle", processor="temperature", backend="vllm")
@pytest.mark.parametrize("seed", [7, 1234])
@pytest.mark.parametrize("temperature", [0.5, 1.7])
def test_temperature_draws_the_same_tokens_as_vllm_temperature(
    llm: Any, prompt: list[int], seed: int, temperature: float
) -> None:
    common = {"max_tokens": SAMPLED_TOKENS, "seed": seed}
    unscaled, native, ours = generate(
        llm,
        [
            (prompt, SamplingParams(**common, temperature=1.0)),
            (prompt, SamplingParams(**common, temperature=temperature)),
            (prompt, for_vllm(Temperature(temperature), **common, temperature=1.0)),
        ],
    )
    assert native != unscaled, "the temperature did not change vLLM's draws"
    assert ours == native


@pytest.mark.support("oracle", processor="stop_strings", backend="vllm")
@pytest.mark.parametrize("span", [(2, 3), (5, 7)], ids=["within_a_token", "across_tokens"])
def test_stop_strings_end_where_vllm_stop_ends(
    llm: Any, hf: tuple[Any, Any], prompt: list[int], plain: list[int], eos: int, span: tuple
) -> None:
    """vLLM's ``stop`` ends the request at the token completing the string (its text is
    cut, its token ids are not); ours forces EOS right after that token."""
    tokenizer = hf[1]
    start, end = span
    text = tokenizer.decode(plain[start:end])
    stop = text[1:-1] if end - start > 1 else text[1:]  # completed inside token end - 1
    native = greedy(llm, prompt, stop=[stop], include_stop_str_in_output=True)
    assert native == plain[:end] and native != plain
    ours = greedy(llm, prompt, StopStrings([stop], eos_token_id=eos))
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
    llm: Any, prompt: list[int], plain: list[int], case: str
) -> None:
    constraint, processor = NATIVE_STRUCTURED[case]
    native = greedy(llm, prompt, structured_outputs=StructuredOutputsParams(**constraint))
    assert native != plain
    assert greedy(llm, prompt, processor()) == native


# -- failures -----------------------------------------------------------------------------


def test_bad_spec_is_rejected_by_generate_and_the_engine_still_runs(
    llm: Any, prompt: list[int], plain: list[int]
) -> None:
    bad = SamplingParams(max_tokens=4, extra_args={"anylogits": [{"type": "top_k", "top_k": 0}]})
    with pytest.raises((ValueError, VLLMValidationError)) as raised:
        generate(llm, [(prompt, bad)])
    message = str(raised.value)
    assert "extra_args['anylogits'][0]" in message and "top_k" in message
    assert greedy(llm, prompt) == plain
    assert greedy(llm, prompt, RepetitionPenalty(1.3)) != plain


def test_a_processor_failing_in_the_engine_ends_its_request_and_no_other(
    llm: Any, hf: Any, prompt: list[int], plain: list[int], eos: int
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
        kwargs = {"max_tokens": 12, "temperature": 0.0}
        return for_vllm(*processors, **kwargs) if processors else SamplingParams(**kwargs)

    alone = [generate(llm, [(ids, params(processors))])[0] for ids, processors in requests]
    batched = generate(llm, [(ids, params(processors)) for ids, processors in requests])
    assert batched == alone
    for (_, processors), tokens in zip(requests, batched, strict=True):
        if any(isinstance(p, RaiseAfter) for p in processors):
            # Three tokens, then the failure: EOS, and the request is over.
            assert tokens == [*plain[:3], eos], tokens
        else:
            assert len(tokens) == 12
    assert greedy(llm, prompt) == plain


# -- structured generation: every output valid, batch 1 and 8, greedy and sampled ---------


def structured_outputs(
    llm: Any, tokenizer: Any, processor: LogitsProcessor, batch: int, sample: bool, n: int
) -> list[Generated]:
    """``batch`` requests in one ``generate`` call, each carrying the processor's spec
    (more requests than ``max_num_seqs``: rows join as others finish)."""
    requests = []
    for row in range(batch):
        sampling = {"temperature": 1.0, "seed": row} if sample else {"temperature": 0.0}
        params = for_vllm(processor, max_tokens=n, **sampling)
        prompt = tokenizer.encode(PROMPTS[row % len(PROMPTS)])
        requests.append(({"prompt_token_ids": prompt}, params))
    outputs = llm.generate(
        [prompt for prompt, _ in requests], [params for _, params in requests], use_tqdm=False
    )
    results = []
    for output in outputs:
        completion = output.outputs[0]
        ids = generated(list(completion.token_ids), {tokenizer.eos_token_id}).ids
        results.append(Generated(ids, completion.finish_reason == "stop"))
    return results


@pytest.mark.support("generation", processor="json_schema", backend="vllm")
@GENERATION
@given(schema=SCHEMAS, batch=BATCHES, sample=st.booleans())
def test_generated_json_validates(
    llm: Any, hf: tuple[Any, Any], schema: dict, batch: int, sample: bool
) -> None:
    tokenizer = hf[1]
    outputs = structured_outputs(llm, tokenizer, JSONSchema(schema), batch, sample, JSON_TOKENS)
    check_json(outputs, schema, hf_vocabulary(tokenizer))


@pytest.mark.support("generation", processor="regex", backend="vllm")
@GENERATION
@given(pattern=REGEXES, batch=BATCHES, sample=st.booleans())
def test_generated_text_matches_the_regex(
    llm: Any, hf: tuple[Any, Any], pattern: str, batch: int, sample: bool
) -> None:
    tokenizer = hf[1]
    outputs = structured_outputs(llm, tokenizer, Regex(pattern), batch, sample, REGEX_TOKENS)
    check_regex(outputs, pattern, hf_vocabulary(tokenizer))
