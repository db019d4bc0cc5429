"""Every count inside a structured spec, bounded before the grammar engine sees it.

A client controls each number in a JSON schema, a regex or a grammar, and some of them
are costs: llguidance 1.7 allocates per array item when it compiles ``maxItems``, nested
counted repetitions multiply into forced literals it tokenizes, and a Lark grammar can
embed a JSON schema (``%json {...}``). These checks read the spec's text or dict without
compiling it and raise ``ValueError`` naming the keyword, where it is, the value and the
limit (:mod:`anylogits.core.limits`). The engine's own budgets (lexer fuel, grammar size)
and the guarded first validation (:mod:`anylogits.processors.structured.guard`) bound
whatever these checks do not know about.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from anylogits.core.limits import check_size, exceeded, limits
from anylogits.core.specs import (
    PathLink,
    check_json_scalar,
    depth_error,
    format_path,
    key_type_error,
)

# Counts of items or properties, string lengths, divisors: (keyword, limit).
_SCHEMA_COUNTS = {
    "minItems": "schema_items",
    "maxItems": "schema_items",
    "minContains": "schema_items",
    "maxContains": "schema_items",
    "minProperties": "schema_items",
    "maxProperties": "schema_items",
    "minLength": "string_length",
    "maxLength": "string_length",
    "multipleOf": "multiple_of",
}
# Keywords holding lists or maps of alternatives or members: their widths use
# 'schema_items' (a Kubernetes enum has 1,772 values).
_SCHEMA_WIDTHS = frozenset(
    (
        "enum",
        "anyOf",
        "oneOf",
        "allOf",
        "prefixItems",
        "properties",
        "patternProperties",
        "required",
        "$defs",
        "definitions",
        "dependentSchemas",
        "dependentRequired",
    )
)
# Keywords whose values are data, not schemas: nothing inside them is a keyword.
_SCHEMA_DATA = frozenset(("enum", "const", "default", "examples", "required", "dependentRequired"))


def check_schema(schema: Any, where: str = "schema") -> None:
    """Bound every count, width and pattern of a JSON schema (nested schemas included),
    and check that it is plain JSON nested at most ``limits().spec_depth`` deep (what
    :func:`~anylogits.core.specs.check_json_value` checks), in one walk: both walks
    apart cost a third of a small schema's compile before its first mask.

    Example:
        >>> check_schema({"type": "array", "maxItems": 10**9})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: schema['maxItems'] is 1000000000, more than the limit of 10000 ...
    """
    current = limits()
    widest, depth_limit = current.schema_items, current.spec_depth
    # (value, where it is, its depth, whether its keys are keywords or data's)
    pending: list[tuple[Any, PathLink, int, bool]] = [(schema, None, 0, True)]
    while pending:
        node, link, depth, keywords = pending.pop()
        if isinstance(node, dict):
            children: Any = node.items()
        elif isinstance(node, (list, tuple)):
            children = enumerate(node)
        else:
            check_json_scalar(node, where, link)
            continue
        if depth >= depth_limit:
            raise depth_error(where, link, depth_limit)
        is_dict = isinstance(node, dict)
        for key, value in children:
            if is_dict:
                if not isinstance(key, str):
                    raise key_type_error(where, link, key)
                if keywords:
                    limit = _SCHEMA_COUNTS.get(key)
                    if limit is not None and _is_number(value) and value > getattr(current, limit):
                        raise exceeded(format_path(where, (link, key)), _as_int(value), limit, None)
                    if key == "pattern" and type(value) is str:
                        check_regex(value, format_path(where, (link, key)))
                    elif key in _SCHEMA_WIDTHS and isinstance(value, (dict, list)):
                        if len(value) > widest:
                            raise exceeded(
                                format_path(where, (link, key)), len(value), "schema_items"
                            )
                        if key == "patternProperties" and isinstance(value, dict):
                            at = format_path(where, (link, key))
                            for pattern in value:
                                check_regex(pattern, f"{at} key {pattern!r}")
            kind = type(value)
            if kind is str or kind is int or kind is bool or value is None:
                continue
            if kind is float and math.isfinite(value):
                continue
            pending.append(
                (value, (link, key), depth + 1, keywords and not (is_dict and key in _SCHEMA_DATA))
            )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_int(value: float) -> int | float:
    return int(value) if float(value).is_integer() and abs(value) < 2**63 else value


@dataclass
class _Frame:
    """One group of a regex (or of a grammar rule) while it is scanned."""

    best: int = 1  # the largest repetition product inside the group
    last: int = 1  # the product of the last atom, which a quantifier multiplies
    branches: int = 1
    refs: list[tuple[int, str]] = field(default_factory=list)  # (multiplier, rule)
    last_refs: list[tuple[int, str]] = field(default_factory=list)


_SATURATED = 2**62  # products stop growing here: far over any limit
_COUNTED = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_ESCAPE_WITH_BRACES = set("pPxuUN")


@dataclass(frozen=True)
class RegexCost:
    repeats: int  # the largest product of nested counted repetitions
    alternatives: int  # the widest alternation


def regex_cost(pattern: str) -> RegexCost:
    """The repetition product and the widest alternation of a regex, read from its text
    (Rust ``regex`` syntax; what is not understood counts as a literal).

    Example:
        >>> regex_cost("((a{100}){100}|b|c){3}")
        RegexCost(repeats=30000, alternatives=3)
    """
    stack = [_Frame()]
    widest = 1
    position, end = 0, len(pattern)
    while position < end:
        char = pattern[position]
        frame = stack[-1]
        if char == "\\":
            position = _skip_escape(pattern, position)
            frame.last = 1
            continue
        if char == "[":
            position = _skip_class(pattern, position)
            frame.last = 1
            continue
        if char == "(":
            stack.append(_Frame())
        elif char == ")" and len(stack) > 1:
            group = stack.pop()
            widest = max(widest, group.branches)
            stack[-1].last = group.best
            stack[-1].best = max(stack[-1].best, group.best)
        elif char == "|":
            frame.branches += 1
            frame.last = 1
        elif char == "{" and (counted := _COUNTED.match(pattern, position)):
            count = max(int(counted[1]), int(counted[2] or 0))
            frame.last = min(frame.last * count, _SATURATED)
            frame.best = max(frame.best, frame.last)
            position = counted.end()
            continue
        else:
            frame.last = 1
        position += 1
    for frame in stack:
        widest = max(widest, frame.branches)
    return RegexCost(max(frame.best for frame in stack), widest)


def _skip_escape(pattern: str, position: int) -> int:
    """The position after the escape starting at ``position`` (``\\p{L}``, ``\\x{41}``)."""
    position += 2
    if (
        pattern[position - 1 : position] in _ESCAPE_WITH_BRACES
        and pattern[position : position + 1] == "{"
    ):
        closing = pattern.find("}", position)
        return len(pattern) if closing < 0 else closing + 1
    return position


def _skip_class(pattern: str, position: int) -> int:
    """The position after the character class starting at ``position`` (nested classes,
    escapes and a leading ``]`` included)."""
    depth, start = 0, position
    while position < len(pattern):
        char = pattern[position]
        if char == "\\":
            position = _skip_escape(pattern, position)
            continue
        if char == "[":
            depth += 1
        elif char == "]" and position > start + 1 + (pattern[start + 1 : start + 2] == "^"):
            depth -= 1
            if depth == 0:
                return position + 1
        position += 1
    return position


def check_regex(pattern: str, where: str) -> None:
    """Bound a regex's nested counted repetitions and its alternations."""
    cost = regex_cost(pattern)
    if cost.repeats > limits().repeat_count:
        raise exceeded(
            f"the product of nested counted repetitions in {where}",
            cost.repeats,
            "repeat_count",
            unit=None,
        )
    if cost.alternatives > limits().alternatives:
        raise exceeded(f"an alternation in {where}", cost.alternatives, "alternatives")


# Lark (llguidance's dialect; GBNF arrives converted to it).
_LARK_TOKEN = re.compile(
    r"""
    (?P<space>\s+|//[^\n]*)
    |(?P<string>"(?:[^"\\\n]|\\.)*"i?)
    |(?P<regex>/(?![/*])(?:[^/\\\n]|\\.)+/[imslux]*)
    |(?P<directive>%[a-z_]+)
    |(?P<rule>[?!]?[A-Za-z_][A-Za-z_0-9]*(?:\.-?\d+)?\s*:(?!:))
    |(?P<name>[A-Za-z_][A-Za-z_0-9]*)
    |(?P<repeat>~\s*\d+(?:\s*\.\.\s*\d+)?|\{\s*\d+\s*(?:,\s*\d*\s*)?\})
    |(?P<special><[^<>\n]*>)
    |(?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)


def check_lark(grammar: str, where: str, depth: int = 0) -> None:
    """Bound a Lark grammar: rule count, alternatives, the product of nested counted
    repetitions through rule references, its regexes, and the JSON schemas and grammars
    it embeds (``%json {...}``, ``%lark {...}``, nested at most ``spec_depth`` deep)."""
    if depth > limits().spec_depth:
        raise ValueError(
            f"{where} nests %lark blocks more than {limits().spec_depth} deep (anylogits "
            "limit 'spec_depth')"
        )
    rules: dict[str, _Frame] = {}
    stack: list[_Frame] = []
    widest = 1
    position = 0
    while position < len(grammar):
        token = _LARK_TOKEN.match(grammar, position)
        assert token is not None  # `other` matches any character
        kind, text = token.lastgroup, token[0]
        position = token.end()
        if kind == "space":
            continue
        if kind == "rule" and (not stack or _at_line_start(grammar, token.start())):
            for frame in stack:
                widest = max(widest, frame.branches)
            name = text.rstrip(":").strip().lstrip("?!").split(".")[0]
            stack = [rules.setdefault(name, _Frame())]
            check_size(f"{where}: its rules", len(rules), "grammar_rules")
            continue
        if kind == "directive" and text in ("%json", "%lark", "%regex", "%llguidance"):
            body_end = _balanced_braces(grammar, position)
            body = grammar[position:body_end].strip()
            position = body_end
            if text == "%lark":
                check_lark(body[1:-1], f"{where} (%lark block)", depth + 1)
            elif text == "%json":
                _check_embedded_schema(body, f"{where} (%json block)")
            if stack:
                stack[-1].last, stack[-1].last_refs = 1, []
            continue
        if not stack:
            continue  # directives' arguments (%ignore, %import) outside any rule
        frame = stack[-1]
        if kind == "regex":
            cost = regex_cost(text[1 : text.rindex("/")])
            widest = max(widest, cost.alternatives)
            frame.last, frame.last_refs = cost.repeats, []
            frame.best = max(frame.best, frame.last)
        elif kind == "name":
            frame.last, frame.last_refs = 1, [(1, text)]
            frame.refs.append((1, text))
        elif kind == "repeat":
            counts = [int(number) for number in re.findall(r"\d+", text)]
            multiplier = max(counts)
            frame.last = min(frame.last * multiplier, _SATURATED)
            frame.best = max(frame.best, frame.last)
            scaled = [
                (min(factor * multiplier, _SATURATED), rule) for factor, rule in frame.last_refs
            ]
            frame.refs.extend(scaled)
            frame.last_refs = scaled
        elif kind == "other" and text in "([":
            stack.append(_Frame())
        elif kind == "other" and text in ")]" and len(stack) > 1:
            group = stack.pop()
            widest = max(widest, group.branches)
            parent = stack[-1]
            parent.last, parent.last_refs = group.best, list(group.refs)
            parent.best = max(parent.best, group.best)
            parent.refs.extend(group.refs)
        elif kind == "other" and text == "|":
            frame.branches += 1
            frame.last, frame.last_refs = 1, []
        else:
            frame.last, frame.last_refs = 1, []
    for frame in (*stack, *rules.values()):
        widest = max(widest, frame.branches)
    if widest > limits().alternatives:
        raise exceeded(f"an alternation in {where}", widest, "alternatives")
    repeats = _rule_products(rules)
    if repeats > limits().repeat_count:
        raise exceeded(
            f"the product of nested counted repetitions in {where}",
            repeats,
            "repeat_count",
            unit=None,
        )


def _at_line_start(text: str, position: int) -> bool:
    line_start = text.rfind("\n", 0, position) + 1
    return not text[line_start:position].strip()


def _balanced_braces(text: str, position: int) -> int:
    """The position after the ``{...}`` block starting at or after ``position`` (strings
    inside it respected), or the end of ``text``."""
    opening = text.find("{", position)
    if opening < 0 or text[position:opening].strip():
        return position
    depth, index, in_string = 0, opening, False
    while index < len(text):
        char = text[index]
        if in_string:
            if char == "\\":
                index += 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return len(text)


def _check_embedded_schema(body: str, where: str) -> None:
    try:
        schema = json.loads(body)
    except (ValueError, RecursionError):
        return  # not JSON: the engine refuses it
    check_schema(schema, where)


def _rule_products(rules: dict[str, _Frame]) -> int:
    """The largest repetition product of any rule, through the rules it references. A
    reference back into the rules being expanded counts once: recursion is not
    expansion."""
    products: dict[str, int] = {}
    for root in rules:
        if root in products:
            continue
        best = {root: rules[root].best}
        # (rule, its references still to visit, the multiplier its parent applies)
        path: list[tuple[str, Iterator[tuple[int, str]], int]] = [(root, iter(rules[root].refs), 1)]
        on_path = {root}
        while path:
            name, references, applied = path[-1]
            for multiplier, reference in references:
                if reference in products:
                    best[name] = max(best[name], multiplier * products[reference])
                elif reference in rules and reference not in on_path:
                    best[reference] = rules[reference].best
                    path.append((reference, iter(rules[reference].refs), multiplier))
                    on_path.add(reference)
                    break
                else:
                    best[name] = max(best[name], multiplier)
            else:
                path.pop()
                on_path.discard(name)
                products[name] = min(best[name], _SATURATED)
                if path:
                    parent = path[-1][0]
                    best[parent] = min(max(best[parent], applied * products[name]), _SATURATED)
    return max(products.values(), default=1)
