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


def test_specs_that_built_are_not_built_again_under_the_same_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server checks each request's specs (vLLM twice: in its frontend and its engine):
    specs that built before, sent as the same text under the same limits, are not built
    again; other limits, a client's check, and a failure do not count as built."""
    from anylogits.core import specs as _specs
    from anylogits.core.limits import checking_client_side, override

    built: list[object] = []
    real = _specs._build_checked

    def counting(spec: object, text: str, index: int) -> LogitsProcessor:
        built.append(spec)
        return real(spec, text, index)

    monkeypatch.setattr(_specs, "_build_checked", counting)
    _specs.BUILT_SPECS.clear()
    # As vllm_xargs sends them (compact JSON): the text is their key.
    text = '[{"type":"top_k","top_k":7},{"type":"temperature","temperature":0.5}]'
    for _ in range(3):
        assert _specs.parse_specs(text, "request") == json.loads(text)
    assert len(built) == 2
    as_sent = json.loads(text)
    for _ in range(2):  # the same specs as dicts: keyed by json.dumps' text
        assert _specs.parse_specs(as_sent, "request") == as_sent
    assert len(built) == 4
    with checking_client_side():  # a client's check vouches for the server's: no
        _specs.parse_specs(text, "request")
    assert len(built) == 6
    with override(processors=1), pytest.raises(ValueError, match="processors"):
        _specs.parse_specs(text, "request")  # built under other limits: checked again
    with override(spec_bytes=64), pytest.raises(ValueError, match="spec_bytes"):
        _specs.parse_specs(text, "request")
    with override(items=1000):  # any other limits: built again, then found
        _specs.parse_specs(text, "request")
        _specs.parse_specs(text, "request")
    assert len(built) == 8
    bad = '[{"type": "top_k", "top_k": 0}]'
    for _ in range(2):
        with pytest.raises(ValueError, match="top_k"):
            _specs.parse_specs(bad, "request")
    assert len(built) == 10


def test_a_checked_spec_key_goes_to_the_processor_its_spec_names_once() -> None:
    from anylogits.core.limits import building_checked_spec, claim_checked_spec

    assert claim_checked_spec(TopK) is None
    with building_checked_spec(TopK, ("[]", 0)):
        assert claim_checked_spec(TopP) is None  # a processor the spec does not name
        assert claim_checked_spec(TopK) == ("[]", 0)
        assert claim_checked_spec(TopK) is None  # built by the first, within its build
    assert claim_checked_spec(TopK) is None


def test_a_servers_specs_around_checked_ones_leave_those_built_as_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``around_checked``: the checked specs keep their key (text, index) however many of a
    server's own specs go before them; the whole is keyed by all three parts."""
    from anylogits.core import specs as _specs

    keys: list[tuple[object, str, int]] = []
    real = _specs._build_checked

    def recording(spec: dict, text: str, index: int) -> LogitsProcessor:
        keys.append((spec["type"], text, index))
        return real(spec, text, index)

    monkeypatch.setattr(_specs, "_build_checked", recording)
    text = '[{"type":"top_k","top_k":7},{"type":"temperature","temperature":0.5}]'
    own = _specs.parse_specs(text, "request")
    keys.clear()
    before, after = to_specs([RepetitionPenalty(1.3)]), to_specs([TopP(0.9), MinP(0.1)])
    joined = _specs.around_checked(before, own, after)
    assert joined == [*before, *own, *after]
    built = _specs.build_specs(joined)
    assert [type(p) for p in built] == [RepetitionPenalty, TopK, Temperature, TopP, MinP]
    assert keys == [("top_k", text, 0), ("temperature", text, 1)]
    nested = _specs.around_checked(after, joined, before)
    keys.clear()
    _specs.build_specs(nested)
    assert keys == [("top_k", text, 0), ("temperature", text, 1)]
    assert _specs.around_checked([], own, []) is own
    others = {
        _specs.around_checked(before, own, []).text,
        _specs.around_checked([], own, before).text,
        joined.text,
        nested.text,
        own.text,
    }
    assert len(others) == 5
    # No client's text, one JSON value, is such a key.
    with pytest.raises(ValueError, match="not valid JSON"):
        _specs.parse_specs(joined.text, "request")
