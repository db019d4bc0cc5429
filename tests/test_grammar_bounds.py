"""Counts inside structured specs: every count of a JSON schema, a regex and a Lark / GBNF
grammar is bounded before the grammar engine sees it, the error names the keyword, where
it is, the value and the limit; data and recursion are not mistaken for counts; real
schemas pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anylogits.core.limits import limits, override
from anylogits.processors.structured.bounds.counts import (
    check_lark,
    check_regex,
    check_schema,
    regex_cost,
)
from test_support.hostile import STRUCTURED

MASKBENCH = Path(__file__).parents[1] / "conformance_tests" / "data" / "maskbench-sample"


@pytest.mark.parametrize("case", sorted(STRUCTURED))
def test_a_hostile_structured_spec_is_refused_naming_keyword_value_and_limit(case: str) -> None:
    pytest.importorskip("llguidance")
    from anylogits import from_spec

    spec, limit, named = STRUCTURED[case]
    with pytest.raises(ValueError) as raised:
        from_spec(spec)
    message = str(raised.value)
    assert f"anylogits limit {limit!r}" in message and named in message, message
    assert f"the limit of {getattr(limits(), limit)}" in message, message


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "array", "maxItems": 10_001}, "schema['maxItems'] is 10001"),
        ({"type": "array", "minContains": 10_001}, "schema['minContains'] is 10001"),
        ({"type": "object", "maxProperties": 10**9}, "schema['maxProperties']"),
        ({"type": "string", "minLength": 1_048_577}, "schema['minLength'] is 1048577"),
        ({"items": [{"maxItems": 2e9}]}, "schema['items'][0]['maxItems'] is 2000000000"),
        ({"$defs": {"d": {"maxLength": 1e300}}}, "schema['$defs']['d']['maxLength'] is 1e+300"),
        ({"anyOf": [{"type": "null"}] * 10_001}, "schema['anyOf'] has 10001 items"),
        ({"enum": list(range(10_001))}, "schema['enum'] has 10001 items"),
        ({"patternProperties": {"a{200}{200}": {}}}, "schema['patternProperties'] key"),
        ({"properties": {"p": {"pattern": "(a{101}){100}"}}}, "['pattern'] is 10100"),
    ],
)
def test_every_count_keyword_is_bounded_where_it_stands(schema: Any, keyword: str) -> None:
    with pytest.raises(ValueError, match="anylogits limit") as raised:
        check_schema(schema)
    assert keyword in str(raised.value), raised.value


def test_at_the_limits_a_schema_passes() -> None:
    at = {
        "type": "array",
        "minItems": limits().schema_items,
        "items": {"type": "string", "maxLength": limits().string_length, "pattern": "a{10000}"},
        "enum": list(range(limits().schema_items)),
    }
    check_schema(at)


def test_real_world_widths_and_lengths_pass() -> None:
    """Issue 35: a Kubernetes enum of 1,554 values and a maxLength of 131,072 were
    refused ('items', 'string_length') though llguidance compiles them at once."""
    check_schema({"type": "string", "enum": [f"v{i}" for i in range(1554)]})
    check_schema({"type": "string", "maxLength": 131_072})


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": [{"maxItems": 10**9}]},  # data, not a keyword
        {"const": {"minLength": 10**9}},
        {"default": {"maxItems": 10**9}, "examples": [{"maxItems": 10**9}]},
        {"properties": {"maxItems": {"type": "integer"}}},  # a property named so
        {"required": ["x"] * 3},
        {"maxItems": "1000000000"},  # not a number: the engine's own error
    ],
)
def test_data_and_names_are_not_counts(schema: Any) -> None:
    check_schema(schema)


def test_no_real_world_schema_is_refused_by_the_bounds() -> None:
    files = sorted(MASKBENCH.glob("*.json"))
    assert len(files) == 180
    for path in files:
        check_schema(json.loads(path.read_text())["schema"], f"{path.name} schema")


@pytest.mark.parametrize(
    ("pattern", "repeats", "alternatives"),
    [
        ("abc", 1, 1),
        ("a{3}", 3, 1),
        ("a{3,}", 3, 1),
        ("a{2,9}b{4}", 9, 1),
        ("((a{100}){100}){100}", 10**6, 1),
        ("(a{10}|b{20}){3}", 60, 2),
        ("x|y|z", 1, 3),
        (r"\p{L}{5}\x{41}{7}", 7, 1),  # escapes with braces are atoms
        (r"[{]{4}[\]{]{6}[]{]{8}", 8, 1),  # braces inside classes are literals
        ("a{,5}", 1, 1),  # not a repetition in Rust's syntax: literal text
        ("(?i:a{4}){5}", 20, 1),
        ("((a|b|c|d){2})", 2, 4),
    ],
)
def test_regex_cost_reads_counts_groups_and_alternations(
    pattern: str, repeats: int, alternatives: int
) -> None:
    cost = regex_cost(pattern)
    assert (cost.repeats, cost.alternatives) == (repeats, alternatives)


@st.composite
def _nested_counts(draw: Any) -> tuple[str, int]:
    """A regex of groups nested with counts, and the product it must report."""
    counts = draw(st.lists(st.integers(1, 50), min_size=1, max_size=5))
    pattern, product = "a", 1
    for count in counts:
        if draw(st.booleans()):
            pattern = f"(b{pattern}){{{count}}}"
        else:
            pattern = f"(?:[xy]|{pattern}c){{1,{count}}}"
        product *= count
    return pattern, product


@settings(max_examples=200, deadline=None)
@given(_nested_counts())
def test_the_product_of_nested_counts_is_exact(case: tuple[str, int]) -> None:
    pattern, product = case
    assert regex_cost(pattern).repeats == product


def test_a_regex_over_the_limits_names_them() -> None:
    with pytest.raises(ValueError, match=r"in pattern is 10001, .*'repeat_count'"):
        check_regex("a{10001}", "pattern")
    with override(alternatives=3), pytest.raises(ValueError, match=r"has 4 items.*'alternatives'"):
        check_regex("a|b|c|d", "pattern")


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        ('start: "a"~10001', "is 10001"),
        ('start: "a"~2..10001', "is 10001"),
        ('start: "a"{10001}', "is 10001"),
        ("start: x~100\nx: y{101}\ny: /a/", "is 10100"),
        ('start: (x "b"){101}\nx: "a"~100', "is 10100"),
        ("start: /(a{101}){100}/", "is 10100"),
        ('start: %json{"maxItems": 100000}', "(%json block)['maxItems'] is 100000"),
        ('start: %lark{ start: "a"~100000 }', "(%lark block) is 100000"),
    ],
)
def test_lark_counts_multiply_through_groups_rules_and_embedded_specs(
    grammar: str, message: str
) -> None:
    with pytest.raises(ValueError, match="anylogits limit") as raised:
        check_lark(grammar, "grammar")
    assert message in str(raised.value), raised.value


@pytest.mark.parametrize(
    "grammar",
    [
        'start: value\nvalue: "[" value~0..3 "]" | "a"',  # recursion is not expansion
        'start: a\na: b~100\nb: a~100 | "x"',
        'start: x~100 x~100\nx: "a"',  # siblings add, not multiply
        '%llguidance {}\nstart: "a"{2,5} X\nX: /[a-z]/+\n | "b"\n',  # GBNF, converted
        '// "a"~100000 in a comment\nstart: "~100000 {100000}"',
    ],
)
def test_recursion_siblings_comments_and_strings_are_not_products(grammar: str) -> None:
    check_lark(grammar, "grammar")


def test_rules_and_alternatives_of_a_grammar_are_bounded() -> None:
    rules = "start: r0\n" + "\n".join(f'r{i}: "{i}"' for i in range(limits().grammar_rules))
    with pytest.raises(ValueError, match=r"its rules has 1025 items.*'grammar_rules'"):
        check_lark(rules, "grammar")
    with override(alternatives=3), pytest.raises(ValueError, match="'alternatives'"):
        check_lark('start: "a" | "b" | ("c" | "d" | "e" | "f")', "grammar")


def test_a_grammar_whose_chain_of_rules_is_longer_than_pythons_recursion_limit() -> None:
    chain = "\n".join(f"r{i}: r{i + 1}" for i in range(limits().grammar_rules - 2))
    check_lark(f"start: r0\n{chain}\nr{limits().grammar_rules - 2}: " + '"a"~3', "grammar")


def test_lark_blocks_nested_past_the_depth_limit_are_refused_not_a_recursion_error() -> None:
    grammar = "start: " + "%lark { start: " * 2000 + '"a"' + " }" * 2000
    with pytest.raises(ValueError, match="nests %lark blocks more than 64 deep"):
        check_lark(grammar, "grammar")
