"""Hypothesis strategies for hostile structured specs: JSON schemas (every keyword of the
draft llguidance supports, nested, with extreme numbers), regexes (nested counted
repetition, alternation, classes, anchors, Unicode) and Lark / GBNF grammars (recursion,
ambiguity, counted repeats, embedded JSON schemas)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# Numbers a client may put anywhere: the edges of int32, float64's exact integers, huge.
EXTREME_INTEGERS = [0, 1, 2, 3, 7, 100, 10_000, 65_536, 2**31 - 1, 2**31, 2**53, 10**9, 10**18]
EXTREME_NUMBERS = [*EXTREME_INTEGERS, -1, -(2**31), -(2**53), 0.5, 1e-9, 1e300, -1e300, 1e-300]

# Mostly small (so that specs with several counts still reach the engine), often extreme.
counts = st.one_of(
    st.integers(0, 12), st.integers(0, 12), st.integers(0, 300), st.sampled_from(EXTREME_INTEGERS)
)
numbers = st.one_of(
    st.sampled_from(EXTREME_NUMBERS),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
)

# ---- regexes ---------------------------------------------------------------------------

_REGEX_ATOMS = st.sampled_from(
    [
        "a",
        "b",
        "x",
        "0",
        "é",
        "中",
        "😀",
        r"\.",
        r"\\",
        r"\d",
        r"\w",
        r"\s",
        r"\D",
        r"\p{L}",
        r"\p{Greek}",
        r"\x{41}",
        ".",
        "[a-z]",
        "[^a]",
        "[0-9a-fA-F]",
        r"[\[\]]",
        "[[:alpha:]]",
        "[a-z&&[^aeiou]]",
        "^",
        "$",
        r"\b",
    ]
)


def _quantified(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    quantifier = st.one_of(
        st.sampled_from(["", "*", "+", "?", "*?", "+?"]),
        counts.map(lambda n: f"{{{n}}}"),
        counts.map(lambda n: f"{{{n},}}"),
        st.tuples(counts, counts).map(lambda c: f"{{{min(c)},{max(c)}}}"),
    )
    return st.tuples(inner, quantifier).map(lambda parts: f"(?:{parts[0]}){parts[1]}")


regexes: st.SearchStrategy[str] = st.recursive(
    _REGEX_ATOMS,
    lambda inner: st.one_of(
        _quantified(inner),
        st.lists(inner, min_size=1, max_size=4).map("".join),
        st.lists(inner, min_size=2, max_size=5).map(lambda parts: "(" + "|".join(parts) + ")"),
        inner.map(lambda r: f"({r})"),
        inner.map(lambda r: f"(?i){r}"),
    ),
    max_leaves=12,
)

# ---- JSON schemas ----------------------------------------------------------------------

_FORMATS = ["date-time", "date", "time", "email", "uuid", "ipv4", "ipv6", "hostname", "uri"]
_NAMES = st.sampled_from(["a", "name", "tags", "x y", "é", "$ref", "maxItems", ""])


def _keywords(draw: Any, kind: str) -> dict[str, Any]:
    """Optional keywords of one type, each with a chance of an extreme value."""
    options: dict[str, st.SearchStrategy[Any]] = {
        "integer": {
            "minimum": numbers,
            "maximum": numbers,
            "exclusiveMinimum": numbers,
            "exclusiveMaximum": numbers,
            "multipleOf": st.sampled_from([1, 2, 7, 37, 1000, 10**9 + 7, 2**53]),
        },
        "number": {
            "minimum": numbers,
            "maximum": numbers,
            "exclusiveMinimum": numbers,
            "multipleOf": st.sampled_from([0.5, 0.01, 1e-9, 3]),
        },
        "string": {
            "minLength": counts,
            "maxLength": counts,
            "pattern": regexes,
            "format": st.sampled_from(_FORMATS),
        },
        "array": {
            "minItems": counts,
            "maxItems": counts,
            "minContains": counts,
            "maxContains": counts,
        },
        "object": {
            "minProperties": counts,
            "maxProperties": counts,
            "additionalProperties": st.booleans(),
        },
    }.get(kind, {})
    chosen = draw(st.lists(st.sampled_from(sorted(options)), unique=True)) if options else []
    keywords = {name: draw(options[name]) for name in chosen}
    # Keywords llguidance refuses: drawn, but rarely (one anywhere refuses the schema).
    if kind == "array" and draw(st.integers(0, 9)) == 0:
        keywords["uniqueItems"] = draw(st.booleans())
    if kind == "object" and draw(st.integers(0, 9)) == 0:
        keywords["propertyNames"] = {"pattern": draw(regexes)}
    return keywords


@st.composite
def _leaf_schema(draw: Any) -> Any:
    kind = draw(st.sampled_from(["integer", "number", "string", "boolean", "null"]))
    schema: dict[str, Any] = {"type": kind, **_keywords(draw, kind)}
    if draw(st.integers(0, 9)) == 0:
        schema = draw(
            st.sampled_from(
                [
                    {
                        "enum": draw(
                            st.lists(st.one_of(st.integers(), st.text(max_size=5)), max_size=20)
                        )
                    },
                    {"const": draw(st.one_of(st.integers(), st.text(max_size=8)))},
                    True,
                    {},
                ]
            )
        )
    return schema


@st.composite
def _composite_schema(draw: Any, inner: st.SearchStrategy[Any]) -> Any:
    # llguidance refuses `not`, `if` and `contains`: drawn, but rarely.
    shape = draw(st.sampled_from(["array"] * 3 + ["object"] * 3 + ["anyOf", "oneOf", "allOf"]))
    if draw(st.integers(0, 9)) == 0:
        shape = draw(st.sampled_from(["not", "if"]))
    if shape == "array":
        schema: dict[str, Any] = {"type": "array", **_keywords(draw, "array")}
        if draw(st.booleans()):
            schema["items"] = draw(inner)
        if draw(st.booleans()):
            schema["prefixItems"] = draw(st.lists(inner, max_size=3))
        if draw(st.integers(0, 9)) == 0:
            schema["contains"] = draw(inner)
        else:
            schema.pop("minContains", None)
            schema.pop("maxContains", None)
        return schema
    if shape == "object":
        properties = draw(st.dictionaries(_NAMES, inner, max_size=4))
        schema = {"type": "object", "properties": properties, **_keywords(draw, "object")}
        if properties and draw(st.booleans()):
            schema["required"] = sorted(properties)[: draw(st.integers(1, len(properties)))]
        if draw(st.booleans()):
            schema["patternProperties"] = {draw(regexes): draw(inner)}
        return schema
    if shape == "not":
        return {"not": draw(inner)}
    if shape == "if":
        return {"if": draw(inner), "then": draw(inner), "else": draw(inner)}
    return {shape: draw(st.lists(inner, min_size=1, max_size=4))}


def _with_definitions(schema: Any, definitions: dict[str, Any], recursive: bool) -> Any:
    if not definitions:
        return schema
    refs = [{"$ref": f"#/$defs/{name}"} for name in definitions]
    document = {"$defs": definitions, "anyOf": [schema, *refs]}
    if recursive:  # a definition that refers to itself (a tree)
        name = next(iter(definitions))
        definitions[name] = {
            "type": "array",
            "items": {"$ref": f"#/$defs/{name}"},
            "maxItems": 3,
        }
    return document


_schema_bodies = st.recursive(_leaf_schema(), lambda inner: _composite_schema(inner), max_leaves=8)


@st.composite
def json_schemas(draw: Any) -> Any:
    schema = draw(_schema_bodies)
    definitions = draw(
        st.dictionaries(st.sampled_from(["d0", "d1", "d2"]), _schema_bodies, max_size=2)
    )
    return _with_definitions(schema, definitions, draw(st.booleans()))


# ---- Lark and GBNF grammars ------------------------------------------------------------


def _rule_bodies(
    atom: st.SearchStrategy[str], repeat: st.SearchStrategy[str], *, optionals: bool
) -> st.SearchStrategy[str]:
    """Sequences of atoms and groups, each with a repeat (and Lark's ``[...]``)."""
    items = [
        st.tuples(atom, repeat).map("".join),
        st.tuples(st.lists(atom, min_size=1, max_size=3), repeat).map(
            lambda parts: "(" + " | ".join(parts[0]) + ")" + parts[1]
        ),
    ]
    if optionals:
        items.append(st.lists(atom, min_size=1, max_size=2).map(lambda a: "[" + " ".join(a) + "]"))
    return st.lists(st.one_of(*items), min_size=1, max_size=4).map(" ".join)


@st.composite
def lark_grammars(draw: Any) -> str:
    """Rules r0..rn (r0 is the start) whose alternatives mix literals, regexes,
    references (recursion included), groups, counted repeats and embedded JSON schemas."""
    names = [f"r{i}" for i in range(draw(st.integers(1, 4)))]
    literal = st.sampled_from(['"a"', '"b"', '"ab"', '"{"', '"\\""', '"é"', '"a"i'])
    regex_token = regexes.map(lambda r: "/" + r.replace("/", "\\/") + "/")
    repeat = st.one_of(
        st.sampled_from(["", "*", "+", "?"]),
        counts.map(lambda n: f"~{n}"),
        st.tuples(counts, counts).map(lambda c: f"~{min(c)}..{max(c)}"),
        counts.map(lambda n: f"{{{n}}}"),
    )
    atom = st.one_of(literal, regex_token, st.sampled_from(names))
    body = _rule_bodies(atom, repeat, optionals=True)
    rules = [
        f"{name}: " + "\n    | ".join(draw(st.lists(body, min_size=1, max_size=3)))
        for name in names
    ]
    if draw(st.integers(0, 3)) == 0:
        rules.append(f"r{len(names)}: %json " + json.dumps(draw(json_schemas())))
        rules[0] += f" r{len(names)}"
    return "start: r0\n" + "\n".join(rules) + "\n"


@st.composite
def gbnf_grammars(draw: Any) -> str:
    names = [f"r{i}" for i in range(draw(st.integers(1, 4)))]
    atom = st.one_of(
        st.sampled_from(['"a"', '"b"', '"ab"', "[a-z]", "[^\\n]", "[0-9]", '"\\""']),
        st.sampled_from(names),
    )
    repeat = st.one_of(
        st.sampled_from(["", "*", "+", "?"]),
        counts.map(lambda n: f"{{{n}}}"),
        st.tuples(counts, counts).map(lambda c: f"{{{min(c)},{max(c)}}}"),
        counts.map(lambda n: f"{{{n},}}"),
    )
    body = _rule_bodies(atom, repeat, optionals=False)
    rules = [
        f"{name} ::= " + " | ".join(draw(st.lists(body, min_size=1, max_size=3))) for name in names
    ]
    return "root ::= r0\n" + "\n".join(rules) + "\n"


# Every structured type, as a client sends it: the fuzzer draws from each.
SPECS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "json_schema": json_schemas().map(lambda schema: {"type": "json_schema", "schema": schema}),
    "regex": regexes.map(lambda pattern: {"type": "regex", "pattern": pattern}),
    "lark": lark_grammars().map(lambda text: {"type": "grammar", "grammar": text}),
    "gbnf": gbnf_grammars().map(
        lambda text: {"type": "grammar", "grammar": text, "syntax": "gbnf"}
    ),
}
