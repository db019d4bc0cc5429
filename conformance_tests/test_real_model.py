"""The real-model level: SmolLM2-135M-Instruct, a trained model, with identical float32
weights in every engine (``anylogits.engines.real_model``), in every backend's session.

- unprocessed greedy tokens on chat prompts equal transformers' on the same weights;
- ten catalogue processors give the tokens of transformers' *own* processors for the same
  job (each first shown to change transformers' output), on every engine;
- JSON schema, regex and choice outputs are valid and parsed, greedy and sampled, and the
  greedy ones are transformers' tokens (and plausible: the person's name, a 1960s date,
  the review's sentiment);
- llama.cpp on the original Q4_1 file, as users run it: our processors give the tokens of
  llama.cpp's own samplers for the same job.

Near-ties: two engines' float32 kernels differ in the last bits, and a trained model's
logits have real near-ties. Where an engine's tokens part from the reference's, the
comparison looks at the reference's processed scores at that step: if its top two lie
within :data:`TIE_TOLERANCE`, the step is a tie and the comparison stops there, saying so
(the tokens agreed up to it); otherwise the difference is real and the test fails. Each
comparison must also cover :data:`MIN_AGREED` tokens, so that ties cannot hide
everything; the last test reports how many comparisons stopped at a tie.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from anylogits import (
    BadWords,
    Choice,
    ExponentialDecayLength,
    FrequencyPenalty,
    JSONSchema,
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    NoRepeatNGram,
    PresencePenalty,
    Regex,
    RepetitionPenalty,
    SequenceBias,
    StopStrings,
    SuppressTokens,
    Watermark,
    to_specs,
)
from anylogits.cli.demo.cases import JSON_PROMPT, PERSON
from anylogits.engines.generation import Generated, GenerationEngine, TransformersEngine
from anylogits.engines.native import Job
from anylogits.engines.real_model import chat_ids, chat_text
from conformance_tests.structured_cases import text_of

pytestmark = pytest.mark.slow

TIE_TOLERANCE = 1e-3  # logits; float32 kernels of two engines differ by ~1e-5 here
MIN_AGREED = 8
NEW_TOKENS = 32
PROMPTS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "List three fruits, then list them again.",
)
REPEATING = PROMPTS[2]  # the processors' prompt: its answer repeats words and phrases

# Every comparison with the reference: (what was compared, tokens agreed, stopped at a tie).
COMPARISONS: list[tuple[str, int, bool]] = []


def before_end(tokens: list[int], eos: int) -> list[int]:
    """``tokens`` without the end-of-text token that ends them (engines differ in whether
    they return it)."""
    return tokens[:-1] if tokens and tokens[-1] == eos else tokens


class Reference(NamedTuple):
    """transformers' greedy tokens (end of text stripped) and its processed scores."""

    tokens: list[int]
    scores: list[Any]


def agreed_until_tie(expected: Reference, actual: list[int], what: str = "") -> int:
    """How many tokens agree: all, or those before a near-tie at step MIN_AGREED or
    later; a parting at a real (not near-tie) step fails."""
    import torch

    for step, (want, got) in enumerate(zip(expected.tokens, actual, strict=False)):
        if want != got:
            top = torch.topk(expected.scores[step].float(), 2).values
            gap = float(top[0] - top[1])
            assert gap < TIE_TOLERANCE, (
                f"{what} step {step}: {got} instead of {want}, the reference's top-2 gap is "
                f"{gap:.2e} (a real difference: over the tie tolerance {TIE_TOLERANCE})"
            )
            print(f"{what}: near-tie at step {step} (gap {gap:.1e}): compared {step} tokens")
            assert step >= MIN_AGREED, f"a near-tie after only {step} tokens: too few compared"
            COMPARISONS.append((what, step, True))
            return step
    assert len(actual) == len(expected.tokens), (
        f"{what}: {len(actual)} tokens, the reference {len(expected.tokens)}"
    )
    COMPARISONS.append((what, len(actual), False))
    return len(actual)


@pytest.fixture(scope="module")
def reference(real_model_dir: Path) -> TransformersEngine:
    """transformers on the real model, float32: the tokens every engine must give."""
    return TransformersEngine.load(real_model_dir)


def greedy_reference(
    reference: TransformersEngine,
    prompt_ids: list[int],
    processors: list[LogitsProcessor] | None = None,
    n: int = NEW_TOKENS,
    **job: Any,
) -> Reference:
    """transformers' greedy tokens for ``job`` done by its own processors (or by
    ``processors`` through anylogits' hook), with the scores at each step."""
    import torch

    hooks = reference.hooks(processors) if processors else None
    with torch.no_grad():
        out = reference.model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=reference.tokenizer.eos_token_id,
            logits_processor=hooks,
            **job,
        )
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    return Reference(
        before_end(tokens, reference.tokenizer.eos_token_id), [s[0] for s in out.scores]
    )


class Engines:
    """The real model in each engine, loaded on first use and kept for the module: in
    this process, or for vLLM in a child process of its own (see ``engine_process``)."""

    def __init__(self, model_dir: Path, reference: TransformersEngine, scratch: Path) -> None:
        self.model_dir = model_dir
        self.reference = reference
        self.scratch = scratch
        self.loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> GenerationEngine:
        from anylogits.engines.backends import BACKENDS

        if name not in self.loaded:
            folder = self.scratch / name
            folder.mkdir()
            if name == "transformers":
                self.loaded[name] = self.reference
            elif name == "vllm":
                from conformance_tests.engine_process import EngineProcess

                vocabulary = self.reference.vocabulary
                self.loaded[name] = EngineProcess(name, self.model_dir, folder, vocabulary)
            else:
                self.loaded[name] = BACKENDS[name].engine(self.model_dir, folder)
        return self.loaded[name]  # type: ignore[no-any-return]

    def close(self) -> None:
        for engine in self.loaded.values():
            if hasattr(engine, "close"):
                engine.close()


@pytest.fixture(scope="module")
def real_engines(
    real_model_dir: Path, reference: TransformersEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engines]:
    engines = Engines(real_model_dir, reference, tmp_path_factory.mktemp("real-engines"))
    yield engines
    engines.close()


@pytest.fixture
def real_engine(backend: Any, real_engines: Engines) -> GenerationEngine:
    """The real model in ``backend``'s engine."""
    return real_engines[backend.name]


# -- weights and plain answers -------------------------------------------------------------


@pytest.mark.only_backend("transformers")
def test_the_gguf_and_the_hf_folder_hold_the_same_float32_weights(real_model_dir: Path) -> None:
    import gguf
    import torch
    from safetensors.torch import load_file

    from anylogits.engines.real_model import F32_FILENAME, _unpermute_qk

    weights = load_file(str(real_model_dir / "model.safetensors"))
    reader = gguf.GGUFReader(real_model_dir / F32_FILENAME)
    config = json.loads((real_model_dir / "config.json").read_text())
    assert all(tensor.tensor_type == gguf.GGMLQuantizationType.F32 for tensor in reader.tensors)
    by_name = {t.name: torch.from_numpy(t.data.copy()) for t in reader.tensors}
    assert torch.equal(by_name["token_embd.weight"], weights["model.embed_tokens.weight"])
    for layer in range(config["num_hidden_layers"]):
        q = by_name[f"blk.{layer}.attn_q.weight"]
        hf_q = weights[f"model.layers.{layer}.self_attn.q_proj.weight"]
        assert torch.equal(_unpermute_qk(q, config["num_attention_heads"]), hf_q)
        down = by_name[f"blk.{layer}.ffn_down.weight"]
        assert torch.equal(down, weights[f"model.layers.{layer}.mlp.down_proj.weight"])


@pytest.mark.only_backend("transformers")
def test_the_real_model_answers_in_plain_text(reference: TransformersEngine) -> None:
    answer = greedy_reference(reference, chat_ids(reference.tokenizer, PROMPTS[0]))
    assert "Paris" in reference.tokenizer.decode(answer.tokens)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_unprocessed_greedy_equals_transformers_on_the_same_weights(
    backend: Any, real_engine: GenerationEngine, reference: TransformersEngine, prompt: str
) -> None:
    prompt_ids = chat_ids(reference.tokenizer, prompt)
    expected = greedy_reference(reference, prompt_ids)
    if backend.name == "transformers":  # generate() against a plain loop without it
        got = reference.step_by_step(prompt_ids, n=NEW_TOKENS)
    else:
        got = real_engine.greedy(prompt_ids, n=NEW_TOKENS)
    eos = reference.tokenizer.eos_token_id
    agreed_until_tie(expected, before_end(got, eos), f"{backend.name} unprocessed {prompt!r}")


# -- catalogue processors against transformers' own ------------------------------------------


class Case(NamedTuple):
    """Our processors and transformers' own ``generate`` arguments for one job, built
    from the unprocessed greedy tokens ``plain`` (which the job must change) and the
    end-of-text id."""

    processors: Callable[[list[int], int], list[LogitsProcessor]]
    job: Callable[[list[int], int, Any], Job]


def _watermark_job(plain: list[int], eos: int, tokenizer: Any) -> Job:
    from transformers import WatermarkingConfig

    return {"watermarking_config": WatermarkingConfig(bias=4.0, seeding_scheme="selfhash")}


# On REPEATING, whose unprocessed answer is "Here are three additional fruits:\n\n* Banana
# \n* Apple\n* Grapefruit" (end of text stripped): plain[6:8] is "\n" then "\n", before
# its list; plain[-1] is "fruit", favoured: said earlier.
REAL_CASES: dict[str, Case] = {
    "repetition_penalty": Case(
        lambda plain, eos: [RepetitionPenalty(1.3)],
        lambda plain, eos, tok: {"repetition_penalty": 1.3},
    ),
    "no_repeat_ngram": Case(
        lambda plain, eos: [NoRepeatNGram(2)],
        lambda plain, eos, tok: {"no_repeat_ngram_size": 2},
    ),
    "suppress_tokens": Case(
        lambda plain, eos: [SuppressTokens(sorted(set(plain[:4])))],
        lambda plain, eos, tok: {"suppress_tokens": sorted(set(plain[:4]))},
    ),
    "logit_bias": Case(
        lambda plain, eos: [LogitBias({plain[-1]: 4.0})],
        lambda plain, eos, tok: {"sequence_bias": {(plain[-1],): 4.0}},
    ),
    "bad_words": Case(
        lambda plain, eos: [BadWords([plain[6:8]])],
        lambda plain, eos, tok: {"bad_words_ids": [plain[6:8]]},
    ),
    "sequence_bias": Case(
        lambda plain, eos: [SequenceBias([[plain[6:8], -20.0]])],
        lambda plain, eos, tok: {"sequence_bias": {tuple(plain[6:8]): -20.0}},
    ),
    "min_new_tokens": Case(
        lambda plain, eos: [LogitBias({eos: 30.0}), MinNewTokens(5, eos_token_id=eos)],
        lambda plain, eos, tok: {"sequence_bias": {(eos,): 30.0}, "min_new_tokens": 5},
    ),
    "exponential_decay_length": Case(
        lambda plain, eos: [ExponentialDecayLength(8, 1.5, eos_token_id=eos)],
        lambda plain, eos, tok: {"exponential_decay_length_penalty": (8, 1.5)},
    ),
    "stop_strings": Case(
        lambda plain, eos: [StopStrings(["Apple"], eos_token_id=eos)],
        lambda plain, eos, tok: {"stop_strings": ["Apple"], "tokenizer": tok},
    ),
    "watermark": Case(
        lambda plain, eos: [Watermark(bias=4.0, seeding_scheme="selfhash")], _watermark_job
    ),
}


@pytest.fixture(scope="module")
def plain_tokens(reference: TransformersEngine) -> list[int]:
    return greedy_reference(reference, chat_ids(reference.tokenizer, REPEATING)).tokens


@pytest.mark.parametrize("case", sorted(REAL_CASES))
def test_processors_give_transformers_own_tokens_on_the_real_model(
    backend: Any,
    real_engine: GenerationEngine,
    reference: TransformersEngine,
    plain_tokens: list[int],
    case: str,
) -> None:
    tokenizer, eos = reference.tokenizer, reference.tokenizer.eos_token_id
    prompt_ids = chat_ids(tokenizer, REPEATING)
    processors, job = REAL_CASES[case]
    expected = greedy_reference(reference, prompt_ids, **job(plain_tokens, eos, tokenizer))
    assert expected.tokens != plain_tokens, f"{case} did not change transformers' output"
    got = real_engine.greedy(prompt_ids, processors(plain_tokens, eos), NEW_TOKENS)
    agreed_until_tie(expected, before_end(got, eos), f"{backend.name} {case}")


@pytest.mark.only_backend("transformers")
def test_a_sampled_chain_gives_transformers_own_tokens(reference: TransformersEngine) -> None:
    """transformers draws from what our chain leaves as from what its own warpers leave:
    with the same seed, the same tokens (other engines draw with their own generators)."""
    from anylogits.engines.native import CHAIN, chain_processors_in_generate_order

    prompt_ids = chat_ids(reference.tokenizer, PROMPTS[1])
    native = reference.native(prompt_ids, CHAIN, NEW_TOKENS, seed=3)
    assert native != reference.sampled(prompt_ids, [], NEW_TOKENS, seed=3)
    ours = reference.sampled(prompt_ids, chain_processors_in_generate_order(), NEW_TOKENS, seed=3)
    assert ours == native


# -- structured outputs: valid, parsed, and plausible ----------------------------------------


class Structured(NamedTuple):
    """A structured job: the processor, the chat message, and what every output must
    parse into (a check that raises) and the greedy one besides."""

    processor: Callable[[], LogitsProcessor]
    message: str
    parse: Callable[[str], Any]
    greedy: Callable[[Any], bool]


# [0-9], not \d: llguidance's \d is Unicode's (digits of other scripts, when sampled).
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
SENTIMENTS = ["positive", "negative", "neutral"]


def _person(text: str) -> dict[str, Any]:
    import jsonschema

    person = json.loads(text)
    jsonschema.validate(person, PERSON)
    assert person["name"].strip(), person
    return dict(person)


def _date(text: str) -> str:
    assert re.fullmatch(DATE, text), text
    return text


def _sentiment(text: str) -> str:
    assert text in SENTIMENTS, text
    return text


STRUCTURED: dict[str, Structured] = {
    "json_schema": Structured(
        lambda: JSONSchema(PERSON),
        JSON_PROMPT,
        _person,
        lambda person: person == {"name": "Maria", "age": 34, "city": "Lisbon"},
    ),
    "regex": Structured(
        lambda: Regex(DATE),
        "On what date did Apollo 11 land on the Moon? Answer with the date as YYYY-MM-DD.",
        _date,
        lambda day: date.fromisoformat(day).year == 1969,
    ),
    "choice": Structured(
        lambda: Choice(SENTIMENTS),
        "Is the sentiment of this review positive, negative or neutral? "
        "'A dull, boring film. I walked out.'",
        _sentiment,
        lambda sentiment: sentiment == "negative",
    ),
}
STRUCTURED_TOKENS = 48


def parsed(engine: GenerationEngine, job: Structured, output: Generated) -> Any:
    assert output.finished, f"did not finish within {STRUCTURED_TOKENS} tokens: {output}"
    return job.parse(text_of(engine.vocabulary, output.ids))


@pytest.mark.parametrize("kind", sorted(STRUCTURED))
def test_structured_greedy_output_is_transformers_own_and_plausible(
    backend: Any, real_engine: GenerationEngine, reference: TransformersEngine, kind: str
) -> None:
    job = STRUCTURED[kind]
    prompt_ids = chat_ids(reference.tokenizer, job.message)
    expected = greedy_reference(reference, prompt_ids, [job.processor()], STRUCTURED_TOKENS)
    got = real_engine.greedy(prompt_ids, [job.processor()], STRUCTURED_TOKENS)
    eos = reference.tokenizer.eos_token_id
    agreed_until_tie(expected, before_end(got, eos), f"{backend.name} {kind}")
    value = parsed(real_engine, job, Generated(before_end(got, eos), got[-1:] == [eos]))
    assert job.greedy(value), f"{kind}: {value!r} is not the answer the text gives"


@pytest.mark.parametrize("kind", sorted(STRUCTURED))
def test_structured_sampled_outputs_parse(
    real_engine: GenerationEngine, reference: TransformersEngine, kind: str
) -> None:
    """Two sequences in one call (a batch where the engine batches), temperature 1."""
    job = STRUCTURED[kind]
    prompts = [chat_text(reference.tokenizer, job.message)] * 2
    outputs = real_engine.structured(job.processor(), prompts, True, STRUCTURED_TOKENS, seed=5)
    values = [parsed(real_engine, job, output) for output in outputs]
    assert len(values) == 2


# -- llama.cpp on the Q4_1 file users run ---------------------------------------------------


@pytest.fixture(scope="module")
def q4_engine() -> Any:
    """llama.cpp on the original Q4_1 GGUF, with its default settings (f16 KV cache)."""
    import llama_cpp

    from anylogits.engines.generation import LlamaCppEngine
    from anylogits.engines.real_model import real_model_q4_gguf

    llm = llama_cpp.Llama(
        model_path=str(real_model_q4_gguf()), n_ctx=512, n_threads=1, seed=0, verbose=False
    )
    return LlamaCppEngine(llm)


# llama-cpp-python's penalties sampler counts only the tokens it sampled (its `generate`
# never feeds it the prompt), the last 64 of them (last_n_tokens_size): our output-token
# penalties count the same within 64 new tokens. Its repeat_penalty has no counterpart
# here: RepetitionPenalty counts the prompt, as transformers, vLLM, mlx-lm and llama.cpp's
# own server do (see native.py).
Q4_JOBS: dict[str, tuple[Callable[[], list[LogitsProcessor]], dict[str, float]]] = {
    "presence_penalty": (lambda: [PresencePenalty(1.5)], {"presence_penalty": 1.5}),
    "frequency_penalty": (lambda: [FrequencyPenalty(0.7)], {"frequency_penalty": 0.7}),
    "both": (
        lambda: [PresencePenalty(0.4), FrequencyPenalty(0.6)],
        {"presence_penalty": 0.4, "frequency_penalty": 0.6},
    ),
}


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.parametrize("job", sorted(Q4_JOBS))
def test_on_the_q4_file_our_processors_give_llama_cpps_own_sampler_tokens(
    q4_engine: Any, reference: TransformersEngine, job: str
) -> None:
    """Both sides run the same quantized kernels: the tokens are equal, no tie aside."""
    processors, own = Q4_JOBS[job]
    prompt_ids = chat_ids(reference.tokenizer, REPEATING)
    native = q4_engine.generate(prompt_ids, None, NEW_TOKENS, **own)
    assert native != q4_engine.greedy(prompt_ids, n=NEW_TOKENS), f"{job} changed nothing"
    assert q4_engine.greedy(prompt_ids, processors(), NEW_TOKENS) == native


@pytest.mark.only_backend("llama_cpp")
def test_on_the_q4_file_a_json_extraction_parses(
    q4_engine: Any, reference: TransformersEngine
) -> None:
    job = STRUCTURED["json_schema"]
    prompt_ids = chat_ids(reference.tokenizer, job.message)
    got = q4_engine.greedy(prompt_ids, [job.processor()], STRUCTURED_TOKENS)
    eos = reference.tokenizer.eos_token_id
    person = parsed(q4_engine, job, Generated(before_end(got, eos), got[-1:] == [eos]))
    assert job.greedy(person), person


@pytest.mark.only_backend("llama_cpp")
def test_anylogits_serve_llama_cpp_serves_the_q4_file_with_our_processors(
    q4_engine: Any, reference: TransformersEngine, tmp_path: Path
) -> None:
    """The file users serve, through the command they run (a native build of llama.cpp
    crashed here on its first completion, on an AMX host): the server's tokens are the
    in-process engine's on the same file. One request: a second would reuse the first's
    KV cache, and a Q4 model's logits depend on how its tokens were batched."""
    pytest.importorskip("fastapi")
    pytest.importorskip("openai")
    from anylogits.engines.real_model import real_model_q4_gguf
    from conformance_tests.servers import MODEL_NAMES, _stop, client_of, start

    options = ["--model", str(real_model_q4_gguf()), "--model_alias", MODEL_NAMES["llama_cpp"]]
    options += ["--n_ctx", "512", "--n_threads", "1", "--seed", "0", "--verbose", "false"]
    server = start("llama_cpp", Path(), tmp_path, options)
    client = client_of(server)
    processors = [PresencePenalty(1.5)]
    try:
        response = client.completions.create(
            model=client.served_model,
            prompt=chat_text(reference.tokenizer, REPEATING),
            max_tokens=NEW_TOKENS,
            temperature=0.0,
            extra_body={
                "return_token_ids": True,
                "repeat_penalty": 1.0,
                "vllm_xargs": {"anylogits": json.dumps(to_specs(processors))},
            },
        )
    finally:
        _stop(server.process)
    prompt_ids = list(response.choices[0].model_extra["prompt_token_ids"])
    tokens = list(response.choices[0].model_extra["token_ids"])
    assert prompt_ids == chat_ids(reference.tokenizer, REPEATING)
    assert tokens != q4_engine.greedy(prompt_ids, n=NEW_TOKENS), "the penalty changed nothing"
    assert tokens == q4_engine.greedy(prompt_ids, processors, NEW_TOKENS)


# -- near-ties: shown on synthetic scores, counted on the real runs ---------------------------


def test_a_near_tie_stops_the_comparison_and_a_real_difference_fails() -> None:
    import torch

    expected = list(range(12))
    tied, clear = torch.zeros(12, 4), torch.zeros(12, 4)
    tied[:, 0], tied[:, 1] = 5.0, 5.0 - 1e-5  # step 10: two tokens 1e-5 apart
    clear[:, 0], clear[:, 1] = 5.0, 3.0
    parted = [*expected[:10], 99, 98]
    recorded = len(COMPARISONS)
    assert agreed_until_tie(Reference(expected, list(tied)), parted) == 10
    with pytest.raises(AssertionError, match="a real difference"):
        agreed_until_tie(Reference(expected, list(clear)), parted)
    with pytest.raises(AssertionError, match="too few compared"):
        agreed_until_tie(Reference(expected, list(tied)), [0, 1, 99])
    assert agreed_until_tie(Reference(expected, list(clear)), expected) == 12
    del COMPARISONS[recorded:]  # synthetic: not counted with the real runs


def tie_summary() -> str:
    """How many real-model comparisons ran and which stopped at a near-tie (the
    session's closing summary prints it: conftest's ``pytest_terminal_summary``)."""
    ties = [f"{what} at step {step}" for what, step, tied in COMPARISONS if tied]
    return (
        f"real model: {len(COMPARISONS)} comparisons with transformers, {len(ties)} stopped "
        f"at a near-tie (top-2 within {TIE_TOLERANCE}){': ' if ties else ''}{'; '.join(ties)}"
    )


def test_near_ties_stopped_few_comparisons() -> None:
    """Runs last in this module: ties stop at most a quarter of the comparisons, or the
    level would prove little."""
    if not COMPARISONS:
        pytest.skip("no real-model comparison ran in this session")
    tied = sum(tie for _, _, tie in COMPARISONS)
    assert tied * 4 <= len(COMPARISONS), tie_summary()
