"""transformers' continuous batching in process: what only this engine mode has (the
generation suite covers the catalogue on it as the ``transformers_cb`` backend).

- ``model.generate_batch`` after ``for_continuous_batching(model, ...)``: every request
  runs the processors, each the tokens of ``generate`` with them;
- a running manager's requests carry their own specs and get the tokens they get alone,
  whichever requests run beside them, whenever they joined, and while another request's
  prompt is prefilled in chunks (rows that sample nothing);
- a re-prefilled request (transformers offloads and restores it as a new state) keeps its
  history;
- bad specs are refused by ``add_request`` before the request is queued;
- what the adapter relies on in transformers' source, and the supported release range.
"""

from __future__ import annotations

import inspect
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import tomllib

pytest.importorskip("transformers")

import torch

from anylogits import (
    DRY,
    Choice,
    JSONSchema,
    LogitBias,
    MinNewTokens,
    NoRepeatNGram,
    PresencePenalty,
    RepetitionPenalty,
    TopK,
    to_specs,
)
from anylogits.engines.generation import NEW_TOKENS, TransformersEngine
from test_support.generation_cases import COUNTING

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("transformers_cb")]

ROOT = Path(__file__).parents[1]
PROMPTS = [COUNTING, "Once upon a time", "The weather today is", "1, 2, 3,"]


@pytest.fixture(scope="module")
def cb_engine(engines: Any) -> Any:
    return engines["transformers_cb"]


def request_cases(plain: list[int]) -> list[list[Any]]:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    return [
        [RepetitionPenalty(1.5)],
        [NoRepeatNGram(2), LogitBias({plain[0]: -100.0})],
        [DRY(multiplier=2.0, allowed_length=1)],
        [JSONSchema(schema)],
    ]


def test_generate_batch_runs_the_processors_for_every_request(
    cb_engine: Any, reference: TransformersEngine
) -> None:
    from transformers import GenerationConfig

    from anylogits.adapters.transformers_cb import (
        for_continuous_batching,
        remove_continuous_batching,
    )

    model, tokenizer = cb_engine.model, cb_engine.tokenizer
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    config = GenerationConfig(
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=model.generation_config.eos_token_id,
    )
    batching = cb_engine.managers.config("greedy")[1]

    def batch() -> list[list[int]]:
        outputs = model.generate_batch(
            prompts, generation_config=config, continuous_batching_config=batching
        )
        return [list(output.generated_tokens) for output in outputs.values()]

    plain = batch()
    for_continuous_batching(model, RepetitionPenalty(1.5), NoRepeatNGram(2), tokenizer=tokenizer)
    try:
        ours = batch()
    finally:
        remove_continuous_batching(model)
    expected = [reference.greedy(p, [RepetitionPenalty(1.5), NoRepeatNGram(2)]) for p in prompts]
    assert expected != plain
    assert ours == expected
    assert batch() == plain  # removed: the next manager runs without


def test_requests_get_what_they_get_alone_whoever_runs_beside_them(cb_engine: Any) -> None:
    tokenizer = cb_engine.tokenizer
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    plain = cb_engine.greedy(prompts[0])
    cases = request_cases(plain)
    alone = [
        cb_engine.greedy(prompt, processors)
        for prompt, processors in zip(prompts, cases, strict=True)
    ]
    assert alone != [cb_engine.greedy(prompt) for prompt in prompts]
    together = cb_engine.submit(
        "greedy", [(p, c, {}) for p, c in zip(prompts, cases, strict=True)], NEW_TOKENS
    )
    assert together == alone
    # Reversed, and with requests without processors between them.
    mixed = [(p, c, {}) for p, c in zip(prompts[::-1], cases[::-1], strict=True)]
    mixed = [
        item for pair in zip(mixed, [(p, (), {}) for p in prompts], strict=True) for item in pair
    ]
    outputs = cb_engine.submit("greedy", mixed, NEW_TOKENS)
    assert outputs[::2] == alone[::-1]


def test_a_schema_sent_again_is_neither_checked_nor_translated_again(
    cb_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``add_request`` checks a request's specs; its row's pipeline is built from them as
    checked (the grammar the check made) and kept by their text: the same request again
    checks, translates and builds nothing."""
    from anylogits.adapters.transformers_cb import AROUND_KEY
    from test_support.grammar_fills import counted_checks

    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 311}
    processors = [JSONSchema(schema)]
    checked = counted_checks(monkeypatch)
    prompt = cb_engine.tokenizer.encode(PROMPTS[1])
    first = cb_engine.submit("greedy", [(prompt, processors, {})], NEW_TOKENS)
    again = cb_engine.submit("greedy", [(prompt, processors, {})], NEW_TOKENS)
    assert first == again and first != cb_engine.submit("greedy", [(prompt, (), {})], NEW_TOKENS)
    assert len(checked) == 1
    # With a generation config's processors around them (``transformers serve``): still
    # built as checked, the config's own specs as they are.
    around = {AROUND_KEY: {"before": [], "after": to_specs([TopK(1)])}}
    for _ in range(2):
        assert cb_engine.submit("greedy", [(prompt, processors, around)], NEW_TOKENS) == first
    assert len(checked) == 1


def test_a_request_joining_a_running_batch_and_chunked_prefill(cb_engine: Any) -> None:
    """A long prompt prefilled in chunks (its rows sample nothing) while requests decode;
    requests that join later: each gets its tokens alone."""
    from anylogits.engines.continuous_batching import results

    tokenizer = cb_engine.tokenizer
    manager = cb_engine.managers["greedy"]
    long_prompt = tokenizer.encode(" ".join(["Count with me: 1 2 3 4 5 6 7 8"] * 60))
    assert len(long_prompt) > 512  # more than a step's token budget: chunked
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    cases = request_cases(cb_engine.greedy(prompts[0]))
    alone = [cb_engine.greedy(p, c, 48) for p, c in zip(prompts, cases, strict=True)]
    long_alone = cb_engine.greedy(long_prompt, [NoRepeatNGram(2)], 8)
    first = manager.add_request(prompts[0], max_new_tokens=48, anylogits=to_specs(cases[0]))
    long_id = manager.add_request(
        long_prompt, max_new_tokens=8, anylogits=to_specs([NoRepeatNGram(2)])
    )
    later = []
    for prompt, case in zip(prompts[1:], cases[1:], strict=True):
        later.append(manager.add_request(prompt, max_new_tokens=48, anylogits=to_specs(case)))
    ids = [first, *later]
    outputs = results(manager, [*ids, long_id])
    assert [list(outputs[i].generated_tokens) for i in ids] == alone
    assert list(outputs[long_id].generated_tokens) == long_alone


def test_rows_that_sample_nothing_are_left_as_they_are(cb_engine: Any) -> None:
    from transformers.generation.continuous_batching.requests import (
        FutureRequestState,
        RequestState,
        RequestStatus,
    )

    from anylogits.adapters.transformers_cb import ContinuousBatchingHook

    hook = ContinuousBatchingHook(None, cb_engine.vocabulary)
    state = RequestState(
        request_id="a",
        initial_tokens=[1, 2, 3],
        logit_processor_kwargs={"anylogits": to_specs([TopK(1)])},
    )
    state.status = RequestStatus.DECODING
    hook.prepare_tensor_args([FutureRequestState(state, True, {}, 1)])
    scores = torch.randn(3, len(cb_engine.tokenizer))
    others = scores[1:].clone()
    out = hook(scores, torch.empty(0, dtype=torch.int32))
    assert torch.isinf(out[0]).sum() == out.shape[1] - 1
    assert torch.equal(out[1:], others)


def test_a_re_prefilled_request_keeps_its_history(cb_engine: Any) -> None:
    """transformers restores an offloaded request as a new state whose prompt holds its
    output so far: the penalty, which counts generated tokens only, still sees them."""
    from transformers.generation.continuous_batching.requests import (
        FutureRequestState,
        RequestState,
        RequestStatus,
    )

    from anylogits.adapters.transformers_cb import ContinuousBatchingHook

    hook = ContinuousBatchingHook(None, cb_engine.vocabulary)
    specs = {"anylogits": to_specs([PresencePenalty(1.0)])}
    state = RequestState(request_id="r", initial_tokens=[5, 6, 7], logit_processor_kwargs=specs)
    state.status = RequestStatus.DECODING
    state.generated_tokens = [5, 9]

    def penalized(current: Any) -> list[int]:
        hook.prepare_tensor_args([FutureRequestState(current, True, {}, 1)])
        scores = torch.zeros(1, len(cb_engine.tokenizer))
        hook(scores, torch.empty(0, dtype=torch.int32))
        return (scores[0] < 0).nonzero().flatten().tolist()

    assert penalized(state) == [5, 9]
    restored = state.create_equivalent_initial_request()  # what offloading does
    assert restored.initial_tokens == [5, 6, 7, 5, 9] and restored.generated_tokens == []
    restored.status = RequestStatus.DECODING
    restored.generated_tokens.append(11)
    assert penalized(restored) == [5, 9, 11]
    assert len(hook) == 1


def test_a_request_left_without_a_token_ends_and_the_manager_serves_on(cb_engine: Any) -> None:
    """Conflicting constraints (one choice, then no end for five tokens) leave a row no
    token: transformers' batch sampler would raise on it and stop the manager for every
    request (the server's 503); the request ends instead."""
    prompt = cb_engine.encode(COUNTING)
    conflicting = [Choice(["1"]), MinNewTokens(5)]
    ended = cb_engine.sampled(prompt, conflicting, NEW_TOKENS, 0)
    eos = cb_engine.vocabulary.eos_token_ids
    assert ended[-1] in eos and len(ended) <= 3, ended
    assert cb_engine.managers["sampled"].is_running()
    assert cb_engine.sampled(prompt, [TopK(5)], 4, 0) == cb_engine.sampled(prompt, [TopK(5)], 4, 0)


def test_a_dropped_request_is_forgotten(cb_engine: Any) -> None:
    """transformers drops a cancelled request's state: the hook lets go of it too."""
    import gc

    from transformers.generation.continuous_batching.requests import (
        FutureRequestState,
        RequestState,
        RequestStatus,
    )

    from anylogits.adapters.transformers_cb import ContinuousBatchingHook

    hook = ContinuousBatchingHook(None, cb_engine.vocabulary)
    specs = {"anylogits": to_specs([TopK(1)])}
    states = [
        RequestState(request_id=name, initial_tokens=[1, 2], logit_processor_kwargs=specs)
        for name in ("kept", "cancelled", "finished")
    ]
    for state in states:
        state.status = RequestStatus.DECODING
    hook.prepare_tensor_args([FutureRequestState(state, True, {}, 1) for state in states])
    assert len(hook) == 3
    states[2].status = RequestStatus.FINISHED
    del states[1]
    gc.collect()
    hook.prepare_tensor_args([FutureRequestState(states[0], True, {}, 1)])
    assert len(hook) == 1


def test_bad_specs_are_refused_before_the_request_is_queued(cb_engine: Any) -> None:
    manager = cb_engine.managers["greedy"]
    prompt = cb_engine.encode(COUNTING)
    with pytest.raises(ValueError, match=r"top_k must be >= 1"):
        manager.add_request(prompt, anylogits=[{"type": "top_k", "top_k": 0}])
    with pytest.raises(ValueError, match="must be a list of processor specs"):
        manager.add_request(prompt, anylogits='[{"type": "top_k", "top_k": 2}]')
    with pytest.raises(ValueError, match="no_such_processor"):
        manager.add_request(prompt, anylogits=[{"type": "no_such_processor"}])
    assert cb_engine.greedy(prompt) == cb_engine.greedy(prompt)  # the manager serves on


def test_a_started_manager_is_refused_and_the_step_is_synchronous(
    cb_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from anylogits.adapters.transformers_cb import for_continuous_batching

    generation, batching = cb_engine.managers.config("greedy")
    started = cb_engine.model.init_continuous_batching(
        generation_config=generation, continuous_batching_config=batching
    )
    started.warmup()  # builds its batch processor, as start() does
    with pytest.raises(ValueError, match="has started"):
        for_continuous_batching(started, TopK(2))
    generation, batching = cb_engine.managers.config("greedy")
    batching.use_cuda_graph, batching.use_async_batching = True, True
    manager = cb_engine.model.init_continuous_batching(
        generation_config=generation, continuous_batching_config=batching
    )
    with caplog.at_level(logging.INFO, logger="anylogits"):
        hook = for_continuous_batching(manager, TopK(2), tokenizer=cb_engine.tokenizer)
    config = manager.continuous_batching_config
    assert config.cuda_graph_booleans == (False, False) and not config.use_async_batching
    assert config.varlen_compile_config is None and config.decode_compile_config is None
    assert "runs synchronously" in caplog.text
    assert for_continuous_batching(manager, TopK(3)) is hook  # one hook a manager
    listed = manager.logit_processor
    assert hook in listed.logits_processor and listed.tensors_required == 1


def test_what_the_adapter_relies_on_is_there() -> None:
    """Every name of transformers that ``anylogits.adapters.transformers_cb`` lists beyond
    its public API, read in the installed source: a release that moves one fails here."""
    from transformers import GenerationMixin
    from transformers.generation.continuous_batching import (
        continuous_api,
        input_outputs,
        model_runner,
    )
    from transformers.generation.continuous_batching import requests as cb_requests
    from transformers.generation.continuous_batching.cb_logits_processors import (
        ContinuousBatchingLogitsProcessor,
        ContinuousBatchingLogitsProcessorList,
    )

    assert {"fill_defaults", "prepare_tensor_args", "__call__"} <= set(
        ContinuousBatchingLogitsProcessor.__abstractmethods__
    )
    assert list(inspect.signature(ContinuousBatchingLogitsProcessor.__call__).parameters) == [
        "self",
        "scores",
        "tensor_arg",
    ]
    init = inspect.signature(ContinuousBatchingLogitsProcessorList.__init__).parameters
    assert {"logits_processor", "per_request_processors", "drop_unsupported_processors"} <= set(
        init
    )
    listing = inspect.getsource(ContinuousBatchingLogitsProcessorList)
    assert "[request for request in requests_in_batch if request.has_new_token]" in listing
    assert "logits_processor_args[current_arg_id]" in listing
    manager = inspect.getsource(continuous_api.ContinuousBatchingManager)
    for name in (
        "self.logit_processor = ContinuousBatchingLogitsProcessorList(",
        "self.model._get_logits_processor(generation_config)",
        "self.continuous_batching_config = resolve_continuous_batching_config(",
        "logit_processor=self.logit_processor",
        "logit_processor_kwargs=logit_processor_kwargs",
    ):
        assert name in manager, name
    mixin = inspect.getsource(continuous_api.ContinuousMixin)
    assert mixin.count("self.init_continuous_batching(") == 1  # generate_batch goes through it
    assert "self.continuous_batching_context_manager(" in mixin
    io = inspect.getsource(input_outputs.ContinuousBatchingIOs.prepare_batch_tensors)
    assert "if future_state.has_new_token:\n                logits_indices.append(" in io
    assert "logits_processors.prepare_tensor_args(" in io
    fields = cb_requests.RequestState.__dataclass_fields__
    for name in ("request_id", "initial_tokens", "generated_tokens", "logit_processor_kwargs"):
        assert name in fields, name
    assert "_true_initial_tokens" in fields
    assert "state" in cb_requests.FutureRequestState.__slots__
    assert "logits_processor" in inspect.signature(GenerationMixin._get_logits_processor).parameters
    runner = inspect.getsource(model_runner.ModelRunner._forward_process_and_sample)
    assert (
        'self.logit_processor(sliced_input_ids_2d, logits_2d, batch_data["logits_processor_args"])'
        in runner
    )


def test_the_supported_range_is_the_extras_and_is_checked() -> None:
    from anylogits.adapters.transformers_cb import (
        SUPPORTED_TRANSFORMERS,
        check_transformers_version,
    )

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (low_major, low_minor), (high_major, _) = SUPPORTED_TRANSFORMERS
    assert f"transformers>={low_major}.{low_minor},<{high_major}" in extras["transformers"]
    check_transformers_version()  # the installed one
    for outside in ("5.10.0", "6.0.0"):
        with pytest.raises(RuntimeError, match=re.escape(f"transformers {outside} is installed")):
            check_transformers_version(outside)
