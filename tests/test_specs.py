"""Specs: every processor round-trips through plain JSON; bad specs name the field."""

from __future__ import annotations

import json

import pytest

from anylogits import (
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    MinP,
    NoRepeatNGram,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
    from_spec,
    to_specs,
)

EXAMPLES: list[LogitsProcessor] = [
    Temperature(0.7),
    TopK(40, min_tokens_to_keep=2),
    TopP(0.9),
    MinP(0.05, min_tokens_to_keep=3),
    RepetitionPenalty(1.3),
    NoRepeatNGram(3),
    MinNewTokens(5),
    MinNewTokens(2, eos_token_id=[1, 2]),
    LogitBias({7: 2.5, 9: -1.0}),
    SuppressTokens([0, 3]),
]


@pytest.mark.parametrize("processor", EXAMPLES, ids=repr)
def test_spec_round_trips_through_json(processor: LogitsProcessor) -> None:
    spec = processor.to_spec()
    wire = json.loads(json.dumps(spec))
    rebuilt = from_spec(wire)
    assert type(rebuilt) is type(processor)
    assert rebuilt.config() == processor.config()
    assert type(processor).from_spec(wire).to_spec() == spec


def test_a_class_builds_only_specs_of_its_own_type() -> None:
    assert isinstance(LogitsProcessor.from_spec({"type": "top_k", "top_k": 3}), TopK)
    with pytest.raises(ValueError, match="spec type 'temperature' builds Temperature, not TopK"):
        TopK.from_spec({"type": "temperature", "temperature": 0.5})


def test_spec_strings_are_parsed() -> None:
    assert from_spec('{"type": "top_k", "top_k": 3}').config()["top_k"] == 3


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "top_q"}, "'type' is 'top_q'; known processor types: .*top_k"),
        ({"top_k": 3}, "'type' is None"),
        ({"type": "top_k", "top_k": 3, "k": 2}, r"unknown field\(s\) \['k'\]"),
        ({"type": "top_k"}, r"missing required field\(s\) \['top_k'\]"),
        ({"type": "top_k", "top_k": "3"}, "top_k must be an integer, got '3'"),
        ({"type": "temperature", "temperature": float("nan")}, "finite numbers"),
        ({"type": "logit_bias", "bias": {"x": 1.0}}, "bias key 'x' is not a token id"),
        ({"type": "logit_bias", "bias": {1: 1.0}}, "keys must be strings"),
        ({"type": "suppress_tokens", "token_ids": {1, 2}}, "spec values must be JSON"),
        ("[1, 2]", "must be a dict"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_specs_name_the_bad_field(spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_spec(spec)  # type: ignore[arg-type]


def test_to_specs_returns_plain_json() -> None:
    specs = to_specs(EXAMPLES)
    assert json.loads(json.dumps(specs)) == specs
