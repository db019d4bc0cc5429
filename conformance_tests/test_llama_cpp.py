"""llama.cpp: vocabulary, hook contract, failure handling, resumed sequences, every
completion API, and llama.cpp's own grammar sampler as an oracle, on the tiny model's
GGUF form (generation against transformers is in ``test_generation``)."""

from __future__ import annotations

import ctypes
import json
from typing import Any

import numpy as np
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")
transformers = pytest.importorskip("transformers")

from anylogits import (  # noqa: E402
    Choice,
    Grammar,
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    MinP,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
    Vocabulary,
    for_llama_cpp,
)
from anylogits.adapters.llama_cpp import SHRINK_BELOW, vocabulary_of  # noqa: E402
from anylogits.engines.generation import LlamaCppEngine  # noqa: E402
from test_support.generation_cases import (  # noqa: E402
    COUNTING,
    SMALL_CHOICES,
    SMALL_GBNF,
)
from test_support.probes import (  # noqa: E402
    GeneratedHashBias,
    GeneratedHashBiasRecompute,
)

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("llama_cpp")]


@pytest.fixture(scope="module")
def engine(engines: Any) -> LlamaCppEngine:
    return engines["llama_cpp"]


@pytest.fixture(scope="module")
def llm(engine: LlamaCppEngine) -> Any:
    return engine.llm


# -- vocabulary ---------------------------------------------------------------------------


def test_vocabulary_from_llama_cpp_agrees_with_the_hf_tokenizer(
    llm: Any, hf_tokenizer: Any
) -> None:
    ours = vocabulary_of(llm)
    theirs = Vocabulary.from_hf_tokenizer(hf_tokenizer)
    assert ours.size == theirs.size == llm.n_vocab()
    differing = [i for i in range(ours.size) if ours.tokens[i] != theirs.tokens[i]]
    assert differing == []
    assert theirs.eos_token_ids <= ours.eos_token_ids  # llama.cpp stops on every EOG id
    assert ours.bos_token_id == theirs.bos_token_id
    assert theirs.special_token_ids - ours.special_token_ids == set()


# -- what the hook receives ---------------------------------------------------------------


def test_the_hook_gets_int32_history_and_a_strided_float32_view(
    engine: LlamaCppEngine, llm: Any
) -> None:
    seen: list[tuple[Any, ...]] = []
    hook = for_llama_cpp(SuppressTokens([0]), model=llm)
    inner = hook[0]

    def recording(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        seen.append(
            (
                input_ids.dtype,
                input_ids.ndim,
                len(input_ids),
                scores.dtype,
                scores.flags.c_contiguous,
                scores.shape,
            )
        )
        return inner(input_ids, scores)

    prompt = engine.encode(COUNTING)
    list(zip(range(3), llm.generate(prompt, temp=0.0, logits_processor=[recording]), strict=False))
    assert seen[0][:3] == (np.intc, 1, len(prompt))
    assert seen[1][2] == len(prompt) + 1
    assert seen[0][3] == np.float32 and not seen[0][4] and seen[0][5] == (llm.n_vocab(),)


# -- generation -------------------------------------------------------------------------


def test_min_new_tokens_holds_against_every_end_of_generation_token(
    engine: LlamaCppEngine, llm: Any
) -> None:
    eog = sorted(vocabulary_of(llm).eos_token_ids)
    prompt = engine.encode(COUNTING)
    push = LogitBias({token: 30.0 for token in eog})
    stopped = engine.generate(prompt, for_llama_cpp(push, model=llm))
    assert len(stopped) == 1 and stopped[0] in eog
    held = engine.generate(prompt, for_llama_cpp(push, MinNewTokens(5), model=llm))
    assert len(held) == 6 and held[-1] in eog and not set(held[:5]) & set(eog)


def test_every_completion_api_runs_the_hook(engine: LlamaCppEngine, llm: Any) -> None:
    prompt = engine.encode(COUNTING)
    plain = engine.generate(prompt, n=8)
    banned = sorted(set(plain[:3]))
    expected = engine.generate(prompt, for_llama_cpp(SuppressTokens(banned), model=llm), n=8)
    text = llm.detokenize(expected).decode("utf-8", errors="replace")
    options = {"max_tokens": 8, "temperature": 0.0, "repeat_penalty": 1.0}

    def hook() -> Any:
        return for_llama_cpp(SuppressTokens(banned), model=llm)

    completion = llm.create_completion(prompt, logits_processor=hook(), **options)
    assert completion["choices"][0]["text"] == text
    called = llm(prompt, logits_processor=hook(), **options)
    assert called["choices"][0]["text"] == text
    streamed = "".join(
        chunk["choices"][0]["text"]
        for chunk in llm.create_completion(prompt, logits_processor=hook(), stream=True, **options)
    )
    assert streamed == text
    chat = llm.create_chat_completion(
        [{"role": "user", "content": "hi"}],
        logits_processor=hook(),
        max_tokens=8,
        temperature=0.0,
    )
    assert chat["choices"][0]["message"]["content"] is not None


def test_logit_bias_next_to_our_processors_keeps_both(engine: LlamaCppEngine, llm: Any) -> None:
    # llama-cpp-python assigns the result of `logits_processor.extend(...)` when
    # logit_bias is given; a plain list would become None and drop our processors.
    prompt = engine.encode(COUNTING)
    plain = engine.generate(prompt, n=6)
    banned = sorted(set(plain[:3]))
    options = {"max_tokens": 6, "temperature": 0.0, "repeat_penalty": 1.0}
    hook = for_llama_cpp(SuppressTokens(banned), model=llm)
    favoured = 5
    both = llm.create_completion(
        prompt, logits_processor=hook, logit_bias={favoured: 100.0}, logprobs=None, **options
    )
    expected = engine.generate(
        prompt,
        for_llama_cpp(SuppressTokens(banned), LogitBias({favoured: 100.0}), model=llm),
        n=6,
    )
    assert both["choices"][0]["text"] == llm.detokenize(expected).decode("utf-8", "replace")
    assert len(hook) == 1  # the caller's list is left as it was


# -- llama.cpp samples only from the candidates our processors leave --------------------

SAMPLING_OFF = {"temp": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}


def _candidate_array(logits: np.ndarray) -> tuple[Any, np.ndarray]:
    """A ``llama_token_data_array`` over ``logits``, built as llama.cpp builds one (ids in
    order, unsorted, nothing selected), and the numpy records it points to."""
    record = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)
    records = np.zeros(len(logits), dtype=record)
    records["id"] = np.arange(len(logits))
    records["logit"] = logits
    array = llama_cpp.llama_token_data_array(
        data=records.ctypes.data_as(llama_cpp.llama_token_data_p),
        size=len(logits),
        selected=-1,
        sorted=False,
    )
    return array, records


@pytest.mark.parametrize(
    ("processors", "left"),
    [
        (lambda: [RepetitionPenalty(1.3), TopK(40), MinP(0.05), Temperature(0.8)], "some"),
        (lambda: [TopK(1)], "one"),
        (lambda: [RepetitionPenalty(1.3)], "all"),
        (lambda: [SuppressTokens([5, 6, 7])], "most"),
    ],
    ids=["truncated", "one_left", "none_removed", "few_removed"],
)
def test_the_next_sampler_in_llama_cpps_chain_sees_only_the_candidates_left(
    engine: LlamaCppEngine, llm: Any, processors: Any, left: str
) -> None:
    prompt = engine.encode(COUNTING)
    engine.generate(prompt, for_llama_cpp(*processors(), model=llm), n=2)
    chain = llm._sampler  # the chain generate() built: our sampler, penalties, greedy
    logits = np.random.default_rng(0).normal(0.0, 5.0, llm.n_vocab()).astype(np.float32)
    array, records = _candidate_array(logits)
    llama_cpp.llama_sampler_apply(chain.sampler, ctypes.byref(array))

    expected = np.asarray(for_llama_cpp(*processors(), model=llm)[0](llm._input_ids, logits.copy()))
    kept = np.flatnonzero(expected != -np.inf)
    assert {
        "some": 1 < len(kept) < len(logits) // SHRINK_BELOW,
        "one": len(kept) == 1,
        "most": len(logits) // SHRINK_BELOW < len(kept) < len(logits),
    }.get(left, True)
    if left == "most":  # moving nearly every record costs more than llama.cpp saves
        assert array.size == len(logits)
        assert records["logit"].tolist() == expected.tolist()  # -inf where removed
    else:
        assert array.size == len(kept)
        assert records["id"][: array.size].tolist() == kept.tolist()  # in order, ids paired
        assert records["logit"][: array.size].tolist() == expected[kept].tolist()
    assert records["id"][array.selected] == kept[np.argmax(expected[kept])]  # greedy's pick


@pytest.mark.parametrize(
    "native",
    [SAMPLING_OFF, {"temp": 0.7, "top_k": 20, "top_p": 0.95, "min_p": 0.02, "repeat_penalty": 1.1}],
    ids=["ours_only", "with_native_samplers"],
)
def test_sampling_from_the_candidates_left_draws_the_tokens_of_the_full_array(
    engine: LlamaCppEngine, llm: Any, native: dict[str, Any]
) -> None:
    prompt = engine.encode(COUNTING)

    def sampled(seed: int, shrink: bool) -> list[int]:
        hook = for_llama_cpp(RepetitionPenalty(1.3), TopK(50), TopP(0.9), model=llm)
        if not shrink:  # a plain callable in the list: llama-cpp-python's own sampler
            inner = hook[0]
            hook = [lambda input_ids, scores: inner(input_ids, scores)]
        llm.set_seed(seed)
        return engine.generate(prompt, hook, n=24, **native)

    for seed in range(3):
        assert sampled(seed, shrink=True) == sampled(seed, shrink=False)
    assert len({tuple(sampled(seed, shrink=True)) for seed in range(3)}) > 1  # it samples


def test_the_hook_copies_llama_cpps_contiguous_logits_row_equal_to_its_candidates(
    engine: LlamaCppEngine, llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our sampler is the first of the chain, so the candidates llama.cpp hands it are
    the row ``llama_get_logits_ith(ctx, idx)`` in token order: the hook copies that
    contiguous row rather than gathering the records' strided logit column."""
    import anylogits.adapters.llama_cpp.candidates as adapter

    rows: list[np.ndarray] = []
    columns: list[np.ndarray] = []
    logits_ith = llama_cpp.llama_get_logits_ith
    candidate_records = adapter._candidate_records

    def row_read(ctx: Any, idx: int) -> Any:
        pointer = logits_ith(ctx, idx)
        rows.append(np.ctypeslib.as_array(pointer, shape=(llm.n_vocab(),)).copy())
        return pointer

    def records_seen(candidates: Any) -> np.ndarray:
        records = candidate_records(candidates)
        assert records["id"].tolist() == list(range(llm.n_vocab()))  # token order
        columns.append(records["logit"].copy())
        return records

    monkeypatch.setattr(llama_cpp, "llama_get_logits_ith", row_read)
    monkeypatch.setattr(adapter, "_candidate_records", records_seen)
    hook = for_llama_cpp(RepetitionPenalty(1.3), TopK(50), TopP(0.9), model=llm)
    engine.generate(engine.encode(COUNTING), hook, n=4, **SAMPLING_OFF)
    assert len(rows) == len(columns) == 4
    for row, column in zip(rows, columns, strict=True):
        assert row.tobytes() == column.tobytes()


# -- failures stop generation and reach the caller --------------------------------------


class Boom(LogitsProcessor):
    """Fails on its ``after``-th call."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.calls = 0

    def process(self, logits: torch.Tensor, batch: Any) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.after:
            raise KeyError(f"boom at call {self.calls}")
        return logits


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_processor_stops_generation_and_raises(
    engine: LlamaCppEngine, llm: Any, stream: bool
) -> None:
    boom = Boom(after=3)
    prompt = engine.encode(COUNTING)
    with pytest.raises(KeyError, match="boom at call 4"):
        result = llm.create_completion(
            prompt,
            logits_processor=for_llama_cpp(boom, model=llm),
            max_tokens=20,
            temperature=0.0,
            stream=stream,
        )
        if stream:
            list(result)
    assert boom.calls == 4  # nothing ran after the failure
    # The model is usable afterwards and an earlier failure does not leak into it.
    assert engine.generate(prompt, n=4) == engine.generate(prompt, n=4)


def test_a_failing_processor_raises_from_generate(engine: LlamaCppEngine, llm: Any) -> None:
    prompt = engine.encode(COUNTING)
    with pytest.raises(KeyError):
        engine.generate(prompt, for_llama_cpp(Boom(after=0), model=llm))


# -- resumed sequences ------------------------------------------------------------------


def test_a_resumed_completion_continues_the_stateful_state(
    engine: LlamaCppEngine, llm: Any
) -> None:
    prompt = engine.encode(COUNTING)
    whole = engine.generate(prompt, for_llama_cpp(GeneratedHashBias(12.0), model=llm), n=12)
    hook = for_llama_cpp(GeneratedHashBias(12.0), model=llm)
    first = engine.generate(prompt, hook, n=6)
    second = engine.generate(prompt + first, hook, n=6)
    assert first + second == whole
    # Resuming after text the user added (several tokens at once) replays them.
    extra = engine.encode(" and so on")[1:]
    resumed = prompt + first + second + extra
    twin = for_llama_cpp(GeneratedHashBiasRecompute(len(prompt), 12.0), model=llm)
    assert engine.generate(resumed, hook, n=6) == engine.generate(resumed, twin, n=6)
    # An unrelated prompt with the same hook starts from a fresh state.
    other = engine.encode("the cat sat on the mat")
    fresh = engine.generate(other, for_llama_cpp(GeneratedHashBias(12.0), model=llm), n=8)
    assert engine.generate(other, hook, n=8) == fresh


def test_for_llama_cpp_rejects_a_model_of_the_wrong_type() -> None:
    with pytest.raises(ValueError, match=r"model must be a llama_cpp\.Llama"):
        for_llama_cpp(SuppressTokens([0]), model="model.gguf")


# llama.cpp's own grammar sampler against ours on the same engine. Where the grammar
# leaves a choice at every step, both allow the same tokens, so greedy picks the same.
# Where it forces text (the rest of "red alert" once "red" is out), llama.cpp allows
# every tokenization of that text and llguidance, under ours, only the canonical one
# (guidance-ai/llguidance#263): the same text, possibly other tokens. llama.cpp's
# JSON-schema converter allows whitespace ours does not (optional spaces, newlines and
# up to 20 indentation characters between items), so JSON is not compared here.
def _choice_gbnf(choices: list[str]) -> str:
    return "root ::= " + " | ".join(json.dumps(choice) for choice in choices)


@pytest.mark.support("oracle", processor="grammar", backend="llama_cpp")
def test_grammar_gives_the_tokens_of_llama_cpps_grammar_sampler(
    engine: LlamaCppEngine, llm: Any
) -> None:
    prompt = engine.encode(COUNTING)
    native = engine.generate(prompt, grammar=llama_cpp.LlamaGrammar.from_string(SMALL_GBNF))
    assert native != engine.generate(prompt)
    ours = for_llama_cpp(Grammar(SMALL_GBNF, syntax="gbnf"), model=llm)
    assert engine.generate(prompt, ours) == native


@pytest.mark.support("oracle", processor="choice", backend="llama_cpp")
def test_choice_gives_the_text_of_llama_cpps_grammar_sampler_in_canonical_tokens(
    engine: LlamaCppEngine,
    llm: Any,
) -> None:
    prompt = engine.encode(COUNTING)
    grammar = llama_cpp.LlamaGrammar.from_string(_choice_gbnf(SMALL_CHOICES))
    native = engine.generate(prompt, grammar=grammar)
    ours = engine.generate(prompt, for_llama_cpp(Choice(SMALL_CHOICES), model=llm))
    eos = vocabulary_of(llm).eos_token_ids
    assert native[-1] in eos and ours[-1] in eos
    text = llm.detokenize(native[:-1]).decode()
    assert text in SMALL_CHOICES and llm.detokenize(ours[:-1]).decode() == text
    canonical = llm.tokenize(text.encode(), add_bos=False, special=False)
    assert ours[:-1] == canonical
    # Pinned: llama.cpp took a non-canonical split of the forced rest (here " " + "al" +
    # "ert" for " alert"); should both ever agree, this comparison can become exact.
    assert native[:-1] != canonical


def test_every_private_the_adapter_lists_is_there(llm: Any) -> None:
    """Each name of llama-cpp-python that ``anylogits.adapters.llama_cpp``'s docstring
    lists beyond its documented API exists on the installed version (CI installs the
    pinned one): a release that moves one fails here, by name."""
    import importlib
    import re

    import anylogits.adapters.llama_cpp as adapter
    from anylogits.testing.pins import LLAMA_CPP_PYTHON_VERSION

    listed = re.findall(r"^- ``([\w.]+)\.(\w+)``:", adapter.__doc__ or "", re.M)
    assert len(listed) >= 10, listed
    sampler = llm._init_sampler(logits_processor=[lambda ids, scores: scores])
    owners: dict[str, Any] = {
        "Llama": llm,
        "LlamaSampler": sampler,
        "CustomSampler": sampler.custom_samplers[0][1],
    }
    for owner, name in listed:
        if owner not in owners:
            owners[owner] = importlib.import_module(owner)  # a module of llama-cpp-python
        assert hasattr(owners[owner], name), (
            f"llama-cpp-python {llama_cpp.__version__} (pinned: {LLAMA_CPP_PYTHON_VERSION}) "
            f"has no {owner}.{name}, which anylogits.adapters.llama_cpp relies on"
        )
