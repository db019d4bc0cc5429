"""VllmRequests: vLLM's wire format over the slot batch (torch only, no vLLM needed)."""

from __future__ import annotations

import json
import logging
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anylogits import (
    LogitBias,
    MinP,
    Pipeline,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
    Vocabulary,
    to_specs,
    vllm_xargs,
)
from anylogits.adapters.vllm_requests import PrefetchedVocabulary, VllmRequests
from anylogits.core.persistent_batch import GROUP_CACHE
from anylogits.core.wire import request_specs
from test_support.probes import GeneratedHashBias

VOCAB = Vocabulary(tokens=tuple(bytes([65 + i]) for i in range(8)), eos_token_ids=frozenset({7}))


def args(*processors: object) -> dict[str, object]:
    return {"anylogits": to_specs(list(processors))}


def test_request_specs_accepts_lists_dicts_and_json_text() -> None:
    specs = to_specs([TopK(3)])
    assert request_specs(None) is None and request_specs({"other": 1}) is None
    assert request_specs({"anylogits": specs}) == specs
    assert request_specs({"anylogits": specs[0]}) == specs
    assert request_specs(vllm_xargs(TopK(3))) == specs
    assert request_specs({"anylogits": []}) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (42, r"extra_args\['anylogits'\] must be a list"),
        ([{"type": "top_k", "top_k": 0}], r"\[0\]: top_k must be >= 1, got 0"),
        ([{"type": "top_k", "top_k": 2}, {"type": "nope"}], r"\[1\]: spec field 'type'"),
        ([{"type": "top_k", "top_k": object()}], r"\[0\]\['top_k'\] is a object"),
        ("[{", "not valid JSON"),
    ],
)
def test_request_specs_names_the_bad_field(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        request_specs({"anylogits": value})


def test_rows_without_processors_are_untouched_and_same_specs_share_a_group() -> None:
    requests = VllmRequests(VOCAB)
    bias = args(LogitBias({2: 5.0}))
    requests.add(0, bias, prompt_ids=[1], output_ids=[])
    requests.add(2, bias, prompt_ids=[3], output_ids=[])
    requests.add(3, None, prompt_ids=[3], output_ids=[])
    logits = torch.randn(4, 8)
    out = requests.process(logits.clone())
    assert torch.equal(out[[1, 3]], logits[[1, 3]])
    assert torch.equal(out[[0, 2], 2], logits[[0, 2], 2] + 5.0)
    assert len(requests._groups) == 1


def test_each_row_equals_its_own_pipeline_through_moves_and_growth() -> None:
    requests = VllmRequests(VOCAB)
    outputs = [[], [], []]
    prompts = [[1, 2], [3], [4, 4, 4]]
    specs = [[RepetitionPenalty(2.0)], [GeneratedHashBias(3.0)], [TopK(2), LogitBias({0: 1.0})]]
    for slot in range(3):
        requests.add(slot, args(*specs[slot]), prompt_ids=prompts[slot], output_ids=outputs[slot])
    oracles = [
        Pipeline(s)
        for s in (
            [RepetitionPenalty(2.0)],
            [GeneratedHashBias(3.0)],
            [TopK(2), LogitBias({0: 1.0})],
        )
    ]
    for oracle, prompt in zip(oracles, prompts, strict=True):
        oracle(torch.zeros(1, 8), torch.tensor([prompt]))
    order = [0, 1, 2]  # slot -> request
    generator = torch.Generator().manual_seed(0)
    for step in range(6):
        if step == 3:
            requests.swap(0, 2)
            order[0], order[2] = order[2], order[0]
        logits = torch.randn(3, 8, generator=generator)
        out = requests.process(logits.clone())
        for slot, request in enumerate(order):
            history = torch.tensor([prompts[request] + outputs[request]])
            expected = oracles[request](logits[slot : slot + 1].clone(), history)
            assert torch.equal(out[slot : slot + 1], expected)
        for request in range(3):
            outputs[request].append(step % 5)


def test_engine_outputs_that_shrink_or_are_placeholders() -> None:
    requests = VllmRequests(VOCAB)
    output = [5, 6]
    requests.add(0, args(GeneratedHashBias(1.0)), prompt_ids=[1], output_ids=output)
    oracle = Pipeline([GeneratedHashBias(1.0)])
    oracle(torch.zeros(1, 8), torch.tensor([[1]]))
    requests.process(torch.zeros(1, 8))
    output[:] = [5]  # the engine dropped a token (vLLM: KV-load failure)
    expected = oracle(torch.zeros(1, 8), torch.tensor([[1, 5]]))
    assert torch.equal(requests.process(torch.zeros(1, 8)), expected)
    output.append(-1)  # an asynchronously sampled token not known yet
    assert torch.equal(requests.process(torch.zeros(1, 8)), expected)


def test_specs_that_fail_here_end_the_sequence_and_log(caplog: pytest.LogCaptureFixture) -> None:
    requests = VllmRequests(VOCAB)
    with caplog.at_level(logging.ERROR, logger="anylogits"):
        assert requests.add(0, args(LogitBias({100: 1.0})), prompt_ids=[1], output_ids=[])
        assert requests.add(1, {"anylogits": 3}, prompt_ids=[1], output_ids=[])
    assert "100" in caplog.text and "must be a list" in caplog.text
    assert "extra_args['anylogits'] must be a list" in caplog.text  # the field, named
    out = requests.process(torch.zeros(2, 8))
    expected = torch.full((8,), float("-inf"))
    expected[7] = 0.0
    assert torch.equal(out[0], expected) and torch.equal(out[1], expected)


def test_vocabulary_is_built_once_and_only_for_requests_with_processors() -> None:
    calls = []

    def vocab() -> Vocabulary:
        calls.append(1)
        return VOCAB

    requests = VllmRequests(vocab)
    requests.add(0, None, prompt_ids=[1], output_ids=[])
    requests.process(torch.zeros(1, 8))
    assert calls == []
    requests.add(0, args(TopK(2)), prompt_ids=[1], output_ids=[])
    requests.add(1, args(TopK(3)), prompt_ids=[1], output_ids=[])
    requests.process(torch.zeros(2, 8))
    assert calls == [1]


def test_logits_narrower_than_the_vocabulary_are_rejected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Inside an engine the mismatch ends the request with the error logged: apply()
    never raises (it would take the whole engine down)."""
    requests = VllmRequests(Vocabulary(VOCAB.tokens, eos_token_ids=frozenset({3})))
    requests.add(0, args(TopK(2)), prompt_ids=[1], output_ids=[])
    logits = requests.process(torch.zeros(1, 4))
    assert "vocabulary" in caplog.text and "failed on slot(s) [0]" in caplog.text
    assert logits.tolist() == [[float("-inf")] * 3 + [0.0]]


KINDS = {
    "temperature": lambda draw: [Temperature(draw(st.floats(0.1, 3.0)))],
    "top_k": lambda draw: [TopK(draw(st.integers(1, 10)), draw(st.integers(1, 3)))],
    "min_p": lambda draw: [MinP(draw(st.floats(0.0, 1.0)), 2)],
    "repetition_penalty": lambda draw: [RepetitionPenalty(draw(st.floats(0.5, 2.5)))],
    "logit_bias": lambda draw: [
        LogitBias(draw(st.dictionaries(st.integers(0, 7), st.floats(-5, 5), max_size=4)))
    ],
    "suppress_tokens": lambda draw: [
        SuppressTokens(draw(st.lists(st.integers(0, 7), max_size=3, unique=True)))
    ],
    "penalty_then_top_k": lambda draw: [
        RepetitionPenalty(draw(st.floats(0.5, 2.5))),
        TopK(draw(st.integers(1, 8))),
    ],
    "top_p_does_not_stack": lambda draw: [TopP(draw(st.floats(0.1, 1.0)))],
}


@settings(max_examples=100, deadline=None)
@given(
    st.data(),
    st.sampled_from(sorted(KINDS)),
    st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
)
def test_rows_of_one_kind_with_different_parameters_are_stacked_exactly(
    data: st.DataObject, kind: str, dtype: torch.dtype
) -> None:
    batch = data.draw(st.integers(2, 6))
    requests = VllmRequests(VOCAB)
    rows = [KINDS[kind](data.draw) for _ in range(batch)]
    histories = [data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=6)) for _ in rows]
    for slot, processors in enumerate(rows):
        requests.add(slot, args(*processors), prompt_ids=histories[slot], output_ids=[])
    logits = (torch.randn(batch, 8) * 3).to(dtype)
    actual = requests.process(logits.clone())
    for slot, processors in enumerate(rows):
        expected = Pipeline(processors)(
            logits[slot : slot + 1].clone(), torch.tensor([histories[slot]])
        )
        assert torch.equal(actual[slot : slot + 1], expected), (kind, slot)
    distinct = len({json.dumps(to_specs(p)) for p in rows})
    stacked = len(requests._row_groups(batch, None, None))
    assert stacked == (distinct if kind == "top_p_does_not_stack" else 1)


def test_prefetched_vocabulary_is_built_once_in_the_background() -> None:
    built: list[str] = []

    def source() -> Vocabulary:
        built.append(threading.current_thread().name)
        return VOCAB

    requests = VllmRequests(PrefetchedVocabulary(source))
    assert requests.vocab is VOCAB and requests.vocab is VOCAB
    assert built == ["anylogits-vocabulary"]


def test_a_failed_prefetch_raises_where_the_vocabulary_is_used() -> None:
    def source() -> Vocabulary:
        raise OSError("no tokenizer")

    requests = VllmRequests(PrefetchedVocabulary(source))
    with pytest.raises(OSError, match="no tokenizer"):
        _ = requests.vocab


def test_pipelines_of_finished_requests_are_not_kept_forever() -> None:
    requests = VllmRequests(VOCAB)
    for index in range(GROUP_CACHE + 50):
        requests.add(0, args(TopK(index + 1)), prompt_ids=[1], output_ids=[])
        requests.process(torch.zeros(1, 8))
    assert len(requests._groups) <= GROUP_CACHE
    # A running request keeps its pipeline, cached or not.
    requests.add(1, args(LogitBias({2: -5.0})), prompt_ids=[1], output_ids=[])
    for index in range(GROUP_CACHE + 1):
        requests.add(0, args(TopK(index + 1)), prompt_ids=[1], output_ids=[])
    assert requests.process(torch.zeros(2, 8))[1].tolist() == [0.0, 0.0, -5.0] + [0.0] * 5


def test_a_transformers_object_is_known_only_to_the_process_that_made_it() -> None:
    from anylogits import from_transformers
    from anylogits.core.specs import from_spec

    def ban_last(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores.scatter(1, input_ids[:, -1:], float("-inf"))

    spec = from_transformers(ban_last).to_spec()
    assert from_spec(spec).processor is ban_last  # this process: the same object
    # What a client of a server could send: an id no process of the server knows.
    with pytest.raises(ValueError, match=r"extra_args\['anylogits'\]\[0\].*names no transformers"):
        request_specs({"anylogits": [{**spec, "object_id": "0" * 32}]})
    with pytest.raises(ValueError, match="must be a transformers LogitsProcessor"):
        request_specs({"anylogits": [{"type": "transformers_object", "processor": "os.system"}]})


def test_requests_sending_the_same_specs_share_one_pipeline_built_as_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's engine checks each request's specs, then finds or builds its pipeline: the
    same text is checked once and its pipeline, keyed by that text, built once, from the
    specs as checked."""
    from anylogits.core import specs as _specs

    built: list[object] = []
    real = _specs._build
    monkeypatch.setattr(
        _specs,
        "_build",
        lambda spec, checked_as=None: built.append(checked_as) or real(spec, checked_as),
    )
    _specs.BUILT_SPECS.clear()
    sent = vllm_xargs(LogitBias({2: 5.0}))
    built.clear()  # the client's own check
    requests = VllmRequests(VOCAB)
    for slot in range(3):
        requests.add(slot, sent, prompt_ids=[1], output_ids=[])
    assert built == [(sent["anylogits"], 0)] * 2
    assert len(requests._groups) == 1
    assert requests.process(torch.zeros(3, 8))[:, 2].tolist() == [5.0] * 3
