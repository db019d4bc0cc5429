"""Cost limits on specs: every size-valued field of the catalogue is bounded, the error
names the field, the size and the limit, the limits can be changed in one place, and a
spec of any shape is a ``ValueError`` (an HTTP 400 on a vLLM server), never another
exception."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anylogits
from anylogits import (
    Choice,
    Grammar,
    LogitBias,
    SuppressTokens,
    TopK,
    Vocabulary,
    from_spec,
    to_specs,
)
from anylogits.adapters.vllm_requests import VllmRequests
from anylogits.core import limits as limits_module
from anylogits.core.limits import (
    ENVIRONMENT_VARIABLE,
    REASONS,
    Limits,
    limits,
    override,
    set_limits,
)
from anylogits.core.wire import request_specs
from test_support.catalogue import (
    PROCESSOR_SPECS,
    VOCABULARY_SPECS,
    catalogue_classes,
)
from test_support.hostile import NOT_SIZES, OVERSIZED, REQUEST_LEVEL
from test_support.probes import RaiseAfter

README = Path(__file__).parents[1] / "README.md"
STRUCTURED = {"regex", "json_schema", "choice", "grammar"}


def _needs_llguidance(spec: dict[str, Any]) -> None:
    if spec["type"] in STRUCTURED:
        pytest.importorskip("llguidance")


@pytest.mark.parametrize("case", sorted(OVERSIZED))
def test_an_oversized_field_is_refused_naming_field_size_and_limit(case: str) -> None:
    field, limit, build = OVERSIZED[case]
    spec = build()
    _needs_llguidance(spec)
    with pytest.raises(ValueError) as raised:
        from_spec(spec)
    message = str(raised.value)
    assert field in message, message
    assert f"anylogits limit {limit!r}" in message, message
    bound = getattr(limits(), limit)
    if limit != "spec_depth":
        assert f"the limit of {bound}" in message and re.search(r" (has|is) \d+", message), message


@pytest.mark.parametrize("case", sorted(OVERSIZED))
def test_the_same_field_under_a_raised_limit_is_accepted(case: str) -> None:
    """The limit, not some other check, refused each case: with that one limit raised,
    the same spec builds."""
    _, limit, build = OVERSIZED[case]
    spec = build()
    _needs_llguidance(spec)
    with override(**{limit: 2 * getattr(limits(), limit) + 1024}):
        from_spec(spec)


def _size_fields() -> set[tuple[str, str]]:
    """(type, field) of every catalogue field whose value is a list, a dict or text."""
    fields = set()
    for name in catalogue_classes():
        spec = PROCESSOR_SPECS.get(name) or VOCABULARY_SPECS[name]
        _needs_llguidance(spec)
        for field, value in from_spec(spec).to_spec().items():
            if field != "type" and isinstance(value, (list, dict, str)):
                fields.add((name, field))
    return fields


def test_every_list_dict_or_text_field_of_the_catalogue_has_an_oversized_case() -> None:
    pytest.importorskip("llguidance")
    covered = {tuple(case.split(".")[:2]) for case in OVERSIZED}
    missing = sorted(_size_fields() - covered - NOT_SIZES)
    assert not missing, f"no oversized case in test_support/hostile.py for {missing}"


@pytest.mark.parametrize("case", sorted(REQUEST_LEVEL))
def test_request_level_shapes_are_refused_at_once(case: str) -> None:
    text, limit = REQUEST_LEVEL[case]
    with pytest.raises(ValueError, match=f"anylogits limit '{limit}'"):
        request_specs({"anylogits": text})


def test_the_grammar_of_issue_14_is_refused_by_size_from_a_request_by_cost_in_python() -> None:
    """A request's grammar text is bounded ('grammar_chars'); built in Python, the same
    grammar is refused by what it costs: 100,000 alternatives."""
    pytest.importorskip("llguidance")
    grammar = json.loads(REQUEST_LEVEL["grammar_100k_alternatives"][0])[0]["grammar"]
    with pytest.raises(ValueError, match=r"grammar has 1288894 characters.*'grammar_chars'"):
        from_spec({"type": "grammar", "grammar": grammar})
    with pytest.raises(ValueError, match=r"alternation in grammar has 100000 .*'alternatives'"):
        Grammar(grammar)


def test_a_grammar_over_llguidances_budget_is_refused() -> None:
    pytest.importorskip("llguidance")
    grammar = 'start: "a" | "b" | "c"'
    from_spec({"type": "grammar", "grammar": grammar})
    with override(grammar_size=2), pytest.raises(ValueError, match="grammar"):
        from_spec({"type": "grammar", "grammar": grammar + ' | "d"'})
    vocab = Vocabulary((b"a", b"b", b"c", b"d", b"<eos>"), eos_token_ids=frozenset({4}))
    with override(grammar_size=2), pytest.raises(ValueError, match="grammar"):
        Grammar(grammar + ' | "d"').bind(vocab)


def test_every_limit_has_a_reason_and_is_listed_in_the_readme() -> None:
    names = [field.name for field in dataclasses.fields(Limits)]
    assert sorted(REASONS) == sorted(names)
    readme = README.read_text()
    for field in dataclasses.fields(Limits):
        assert f"`{field.name}`" in readme, f"README does not list the limit {field.name}"
        assert f"{field.default:,}" in readme or str(field.default) in readme, field.name
    assert ENVIRONMENT_VARIABLE in readme


def test_set_limits_changes_them_and_exports_the_environment_variable() -> None:
    before = limits()
    previous = set_limits(token_ids=3)
    try:
        assert previous == before
        assert limits().token_ids == 3
        assert json.loads(os.environ[ENVIRONMENT_VARIABLE]) == {"token_ids": 3}
        SuppressTokens([1, 2, 3])
        with pytest.raises(ValueError, match="token_ids has 4 items"):
            SuppressTokens([1, 2, 3, 4])
    finally:
        limits_module._install(before)
    assert limits() == before
    assert ENVIRONMENT_VARIABLE not in os.environ


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"no_such_limit": 3}, "'no_such_limit' is not an anylogits limit"),
        ({"items": 0}, "limit 'items' must be an integer >= 1, got 0"),
        ({"items": "many"}, "limit 'items' must be an integer >= 1, got 'many'"),
    ],
)
def test_bad_limits_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        set_limits(**changes)


def test_a_new_process_reads_the_environment_variable() -> None:
    """What an engine process started by vLLM sees: the frontend's limits."""
    code = (
        "from anylogits import SuppressTokens\n"
        "try:\n    SuppressTokens([1, 2, 3])\nexcept ValueError as error:\n    print(error)\n"
    )
    env = {**os.environ, ENVIRONMENT_VARIABLE: '{"token_ids": 2}'}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert "token_ids has 3 items, more than the limit of 2" in result.stdout, result
    env[ENVIRONMENT_VARIABLE] = '{"token_id": 2}'
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "'token_id' is not an anylogits limit" in result.stdout, result


def test_limits_apply_to_processors_built_in_python_before_any_backend() -> None:
    """Factories of transformers, llama.cpp and MLX take built processors: the
    constructor's check is the one every backend gets."""
    with pytest.raises(ValueError, match="'token_ids'"):
        LogitBias({i: 1.0 for i in range(limits().token_ids + 1)})
    with pytest.raises(ValueError, match="'items'"):
        anylogits.BadWords([[1]] * (limits().items + 1))


# -- any JSON is a ValueError or a processor, never another exception ------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)


def _fields(name: str) -> list[str]:
    spec = PROCESSOR_SPECS.get(name) or VOCABULARY_SPECS[name]
    return [field for field in from_spec(spec).to_spec() if field != "type"]


@pytest.mark.parametrize("name", sorted(catalogue_classes()))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_json_in_any_field_is_a_value_error_or_a_processor(name: str, data: Any) -> None:
    spec = dict(PROCESSOR_SPECS.get(name) or VOCABULARY_SPECS[name])
    _needs_llguidance(spec)
    field = data.draw(st.sampled_from(_fields(name)), label="field")
    spec[field] = data.draw(JSON, label="value")
    with contextlib.suppress(ValueError):
        from_spec(spec)


@settings(max_examples=200, deadline=None)
@given(payload=JSON | st.text(max_size=40))
def test_any_vllm_xargs_payload_is_a_value_error_or_specs(payload: Any) -> None:
    for value in (payload, json.dumps(payload)):
        with contextlib.suppress(ValueError):
            request_specs({"anylogits": value})


# -- inside an engine: a failing request ends alone ------------------------------------


def test_a_processor_failing_inside_the_engine_ends_its_request_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    vocab = anylogits.Vocabulary(tuple(bytes([65 + i]) for i in range(8)), frozenset({7}))
    requests = VllmRequests(vocab)
    outputs: list[list[int]] = [[], [], []]
    requests.add(0, {"anylogits": to_specs([TopK(2)])}, prompt_ids=[1], output_ids=outputs[0])
    requests.add(1, {"anylogits": to_specs([RaiseAfter(1)])}, prompt_ids=[1], output_ids=outputs[1])
    requests.add(
        2, {"anylogits": to_specs([LogitBias({3: 2.0})])}, prompt_ids=[1], output_ids=outputs[2]
    )
    logits = torch.arange(24, dtype=torch.float32).reshape(3, 8)
    expected = [
        [float("-inf")] * 6 + [6.0, 7.0],
        list(range(8, 16)),
        [16.0, 17.0, 18.0, 21.0, 20.0, 21.0, 22.0, 23.0],
    ]
    assert requests.process(logits.clone()).tolist() == expected  # nothing generated yet
    for output in outputs:
        output.append(4)
    result = requests.process(logits.clone()).tolist()
    assert result[0] == expected[0] and result[2] == expected[2]
    assert result[1] == [float("-inf")] * 7 + [0.0]
    assert "testing.raise_after" in caplog.text and "failed on slot(s) [1]" in caplog.text
    # The failed request stays ended; the others go on.
    result = requests.process(logits.clone()).tolist()
    assert result == [expected[0], [float("-inf")] * 7 + [0.0], expected[2]]


def test_choice_is_bounded_by_count_before_it_is_compiled() -> None:
    pytest.importorskip("llguidance")
    with pytest.raises(ValueError, match="choices has 1025 items"):
        Choice([str(i) for i in range(1025)])


def test_without_an_eos_a_failed_request_keeps_its_logits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing to end the sequence with: its logits stay as they came (the engine stops
    it at max_tokens) and the error is logged, rather than garbage or an exception."""
    vocab = anylogits.Vocabulary(tuple(bytes([65 + i]) for i in range(8)))
    requests = VllmRequests(vocab)
    requests.add(0, {"anylogits": to_specs([RaiseAfter(0)])}, prompt_ids=[1], output_ids=[])
    logits = torch.arange(8, dtype=torch.float32)[None]
    assert requests.process(logits.clone()).tolist() == logits.tolist()
    assert "testing.raise_after" in caplog.text and "no EOS token" in caplog.text
