"""Lark grammars whose greedy lexer would force one byte forever.

llguidance lexes greedily: a token ends only at a byte that cannot extend it. A token that
ends in an unbounded repetition of one word (``/a+/``, ``"ab"*`` in a terminal) can then
never end if everything the grammar lets follow it starts with that word's first byte
(``start: /a+/ "a"``; GBNF's ``r0 ::= r1 r0  r1 ::= "a"*``). Exactly one byte is allowed
at every step, so llguidance's forced-byte loop (``force_bytes``) pushes it forever inside
one token: no Earley item is added, none of its budgets is charged, and the call that
computes the next token's mask never returns while its memory grows (~11 MB/s measured,
llguidance 1.7.6 and 1.9.1). Found by ``nox -s fuzz``.

:func:`check_greedy_lexing` finds that shape before llguidance sees the grammar: for each
token that can end in such a repetition of a word ``w``, it computes (FIRST/FOLLOW over
the grammar, ``%ignore`` included) what can come next; if nothing but ``w[0]`` can (no
end of input, no other byte), the grammar is refused. It errs towards refusing: a token
or a block it cannot read (``%json``/``%regex`` inside a grammar) counts as possibly
starting with ``w[0]``. Its sets only grow and have a handful of elements (the first
characters of the repeated words, "other", "end", "unknown"), so the fixed point is short.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from anylogits.processors.structured.bounds.counts import (
    _LARK_TOKEN,
    _at_line_start,
    _balanced_braces,
)
from anylogits.processors.structured.bounds.token_shapes import (
    _EMPTY,
    _END,
    _MAX_VISITS,
    _OPAQUE,
    _OTHER,
    _UNKNOWN,
    _WIDE,
    Shape,
    _TooComplex,
    alt,
    cat,
    literal_shape,
    regex_shape,
    repeat,
)

# A parsed expression: (kind, ...) tuples.
Node = tuple[Any, ...]


@dataclass
class _Grammar:
    rules: dict[str, list[tuple[str, str]]]  # name -> its tokens (kind, text)
    terminals: dict[str, list[tuple[str, str]]]
    lazy: set[str]
    ignored: list[list[tuple[str, str]]]
    nested: list[str]  # %lark blocks


# `name[lazy]:`, `name[stop=""]:`, `name[max_tokens=3]:`
_ATTRIBUTES = re.compile(
    r"^([ \t]*[?!]?[A-Za-z_][A-Za-z_0-9]*(?:\.-?\d+)?)\[([^\]\n]*)\](?=\s*:)", re.M
)


def _definitions(grammar: str) -> _Grammar:
    lazy: set[str] = set()

    def strip_attributes(match: re.Match[str]) -> str:
        if "lazy" in match[2]:
            lazy.add(match[1].strip().lstrip("?!").split(".")[0])
        return match[1]

    grammar = _ATTRIBUTES.sub(strip_attributes, grammar)
    parsed = _Grammar({}, {}, lazy, [], [])
    current: list[tuple[str, str]] | None = None
    position = 0
    while position < len(grammar):
        token = _LARK_TOKEN.match(grammar, position)
        assert token is not None  # `other` matches any character
        kind, text = token.lastgroup or "other", token[0]
        position = token.end()
        if kind == "space":
            continue
        if kind == "rule" and _at_line_start(grammar, token.start()):
            name = text.rstrip(":").strip().lstrip("?!").split(".")[0]
            current = []
            (parsed.terminals if name[:1].isupper() else parsed.rules)[name] = current
            continue
        if kind == "directive" and text in ("%json", "%lark", "%regex", "%llguidance"):
            end = _balanced_braces(grammar, position)
            if text == "%lark":
                parsed.nested.append(grammar[position:end].strip()[1:-1])
            position = end
            if current is not None and text != "%llguidance":
                current.append(("opaque", text))
            continue
        if kind == "directive" and _at_line_start(grammar, token.start()):
            current = [] if text == "%ignore" else None
            if current is not None:
                parsed.ignored.append(current)
            continue
        if current is not None:
            if kind == "other" and text == "\n":
                continue
            current.append((kind, text))
    return parsed


def _unquote(text: str) -> tuple[str, bool]:
    ignore_case = text.endswith("i")
    body = text[:-1] if ignore_case else text
    try:
        value = json.loads(body)
    except ValueError:
        value = body[1:-1]
    return (value if isinstance(value, str) else body[1:-1]), ignore_case


class _ExpressionReader:
    """Reads a definition's tokens into a :data:`Node` tree (rules) or a :class:`Shape`
    (terminals: ``terminal_shape``)."""

    def __init__(
        self, tokens: list[tuple[str, str]], terminal: bool, shapes: _Shapes, lazy: bool = False
    ) -> None:
        self.tokens = tokens
        self.position = 0
        self.terminal = terminal
        self.shapes = shapes
        self.lazy = lazy  # a rule[lazy]: its tokens end as soon as they can

    def read(self) -> Node:
        node = self._alternation()
        while self.position < len(self.tokens):  # an unmatched bracket: read on
            self.position += 1
            node = ("seq", [node, self._alternation()])
        return node

    def _alternation(self) -> Node:
        parts = [self._sequence()]
        while self._peek() == "|":
            self.position += 1
            parts.append(self._sequence())
        return parts[0] if len(parts) == 1 else ("alt", parts)

    def _sequence(self) -> Node:
        parts: list[Node] = []
        while self.position < len(self.tokens) and self._peek() not in ("|", ")", "]"):
            parts.append(self._quantified())
        return ("seq", parts)

    def _quantified(self) -> Node:
        node = self._atom()
        while self.position < len(self.tokens):
            kind, text = self.tokens[self.position]
            if kind == "other" and text in "?*+" and text:
                low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[text]
            elif kind == "repeat":
                numbers = [int(n) for n in re.findall(r"\d+", text)]
                low = numbers[0]
                high = numbers[-1] if "," not in text or len(numbers) > 1 else None
            else:
                return node
            self.position += 1
            node = ("repeat", node, low, high)
        return node

    def _atom(self) -> Node:
        kind, text = self.tokens[self.position]
        self.position += 1
        if kind == "other" and text in "([":
            inner = self._alternation()
            if self._peek() in (")", "]"):
                self.position += 1
            return ("repeat", inner, 0, 1) if text == "[" else inner
        if kind == "string":
            if self._peek() == "." and self._peek(1) == ".":
                self.position += 3  # "a".."z": a range of characters
                return self._token(_WIDE, text)
            value, ignore_case = _unquote(text)
            return self._token(literal_shape(value, ignore_case), text)
        if kind == "regex":
            closing = text.rindex("/")
            return self._token(regex_shape(text[1:closing], text[closing + 1 :]), text)
        if kind == "name":
            if text[:1].isupper() or self.terminal:
                return self._token(self.shapes.terminal(text), text)
            return ("rule", text)
        if kind == "special":
            return self._token(_WIDE, text)
        return self._token(_OPAQUE, text)  # %json/%regex blocks, what is not understood

    def _token(self, shape: Shape, text: str) -> Node:
        if self.lazy and not self.terminal:
            shape = Shape(shape.first, shape.nullable, shape.words, frozenset())
        return ("token", shape, text)

    def _peek(self, ahead: int = 0) -> str:
        index = self.position + ahead
        return self.tokens[index][1] if index < len(self.tokens) else ""


class _Shapes:
    """Terminal definitions as shapes, each read once (a terminal that refers back to
    itself is not something llguidance compiles: it reads as opaque here)."""

    def __init__(self, grammar: _Grammar) -> None:
        self.grammar = grammar
        self.done: dict[str, Shape] = {}
        self.reading: set[str] = set()

    def terminal(self, name: str) -> Shape:
        if name in self.done:
            return self.done[name]
        tokens = self.grammar.terminals.get(name)
        if tokens is None or name in self.reading:
            return _OPAQUE
        self.reading.add(name)
        shape = _evaluate(_ExpressionReader(tokens, True, self).read())
        self.reading.discard(name)
        self.done[name] = shape
        return shape


def _evaluate(node: Node) -> Shape:
    """A terminal's node tree as one shape (its references are already shapes)."""
    kind = node[0]
    if kind == "token":
        return node[1]
    if kind == "seq":
        shape = _EMPTY
        for part in node[1]:
            shape = cat(shape, _evaluate(part))
        return shape
    if kind == "alt":
        parts = [_evaluate(part) for part in node[1]]
        shape = parts[0]
        for part in parts[1:]:
            shape = alt(shape, part)
        return shape
    if kind == "repeat":
        return repeat(_evaluate(node[1]), node[2], node[3])
    return _OPAQUE


class _Flow:
    """FIRST, nullable and FOLLOW over the rules, each token's FOLLOW recorded."""

    def __init__(self, rules: dict[str, Node], ignored: frozenset[str]) -> None:
        self.rules = rules
        self.ignored = ignored
        self.first: dict[str, frozenset[str]] = {name: frozenset() for name in rules}
        self.nullable: dict[str, bool] = {name: False for name in rules}
        self.follow: dict[str, frozenset[str]] = {name: frozenset() for name in rules}
        self.token_follow: dict[int, tuple[Shape, str, set[str]]] = {}
        self.inner: dict[int, tuple[Node, Node]] = {}
        self.changed: set[str] = set()
        self.visits = 0

    def first_of(self, node: Node) -> tuple[frozenset[str], bool]:
        self._visit()
        kind = node[0]
        if kind == "token":
            shape: Shape = node[1]
            return shape.first, shape.nullable
        if kind == "rule":
            name: str = node[1]
            if name not in self.rules:
                return frozenset({_UNKNOWN}), False
            return self.first[name], self.nullable[name]
        if kind == "seq":
            first: frozenset[str] = frozenset()
            for part in node[1]:
                part_first, part_nullable = self.first_of(part)
                first |= part_first
                if not part_nullable:
                    return first, False
            return first, True
        if kind == "alt":
            results = [self.first_of(part) for part in node[1]]
            return frozenset().union(*(f for f, _ in results)), any(n for _, n in results)
        first, nullable = self.first_of(node[1])
        return first, nullable or node[2] == 0

    def solve_first(self) -> None:
        users: dict[str, set[str]] = {name: set() for name in self.rules}
        for name, node in self.rules.items():
            for used in _nodes([node]):
                if used[0] == "rule" and used[1] in users:
                    users[used[1]].add(name)
        pending = list(self.rules)
        queued = set(pending)
        while pending:
            name = pending.pop()
            queued.discard(name)
            first, nullable = self.first_of(self.rules[name])
            if first != self.first[name] or nullable != self.nullable[name]:
                self.first[name], self.nullable[name] = first, nullable
                for user in users[name] - queued:
                    pending.append(user)
                    queued.add(user)

    def solve_follow(self) -> None:
        if "start" in self.follow:
            self.follow["start"] = frozenset({_END})
        pending = list(self.rules)
        queued = set(pending)
        while pending:
            name = pending.pop()
            queued.discard(name)
            self.changed = set()
            self._walk(self.rules[name], self.follow[name] | self.ignored)
            for grown in self.changed - queued:
                pending.append(grown)
                queued.add(grown)

    def _visit(self) -> None:
        self.visits += 1
        if self.visits > _MAX_VISITS:
            raise _TooComplex

    def _walk(self, node: Node, after: frozenset[str]) -> None:
        self._visit()
        kind = node[0]
        if kind == "token":
            entry = self.token_follow.setdefault(id(node), (node[1], node[2], set()))
            entry[2].update(after)
        elif kind == "rule":
            name: str = node[1]
            if name in self.follow and not after <= self.follow[name]:
                self.follow[name] = self.follow[name] | after
                self.changed.add(name)
        elif kind == "seq":
            current = after
            for part in reversed(node[1]):
                self._walk(part, current)
                first, nullable = self.first_of(part)
                current = (first | self.ignored | current) if nullable else (first | self.ignored)
        elif kind == "alt":
            for part in node[1]:
                self._walk(part, after)
        else:
            body, low, high = node[1], node[2], node[3]
            first, _ = self.first_of(body)
            again = first | self.ignored if high is None or high > 1 else frozenset()
            self._walk(body, after | again)
            if low >= 2:
                # Every instance but the last is followed by another, and by nothing else:
                # in `/a+/~2` the first /a+/ can only be followed by "a" (a stall the
                # fuzzer found), which the union with what follows the last one hides.
                self._walk(self._inner_instance(body), again)

    def _inner_instance(self, body: Node) -> Node:
        """A copy of ``body`` whose tokens are recorded apart from ``body``'s own (the
        same copy at every pass of the fixed point)."""
        found = self.inner.get(id(body))
        if found is None:
            # Rules are inlined: a rule's FOLLOW is the union over its uses, which hides
            # this use's (`start: r1~2`, `r1: /a+/`). Held with body, so its id stays.
            found = self.inner[id(body)] = (body, self._fresh(body, frozenset()))
        return found[1]

    def _fresh(self, node: Node, inlined: frozenset[str]) -> Node:
        """``node`` rebuilt in new tuples, rule references inlined once per path (a rule
        inside its own expansion stays a reference)."""
        self._visit()
        kind = node[0]
        if kind == "token":
            return ("token", node[1], node[2])
        if kind in ("seq", "alt"):
            return (kind, [self._fresh(part, inlined) for part in node[1]])
        if kind == "repeat":
            return ("repeat", self._fresh(node[1], inlined), node[2], node[3])
        if kind == "rule" and node[1] in self.rules and node[1] not in inlined:
            return self._fresh(self.rules[node[1]], inlined | {node[1]})
        return node


def _collapse(elements: frozenset[str], keep: set[str]) -> frozenset[str]:
    return frozenset(e if e in keep or e in (_END, _UNKNOWN) else _OTHER for e in elements)


def check_greedy_lexing(grammar: str, where: str, depth: int = 0) -> None:
    """Refuse a Lark grammar in which a token can end in an unbounded repetition of a
    word ``w`` while nothing but ``w[0]`` can follow it (llguidance would force ``w``
    forever: a stall). See the module docstring.

    Example:
        >>> check_greedy_lexing('start: /a+/ "b"', "grammar")
        >>> check_greedy_lexing('start: /a+/ "a"', "grammar")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: grammar: the token /a+/ can end in a repetition of 'a' and only 'a' can...
    """
    try:
        _check(grammar, where, depth)
    except RecursionError:
        raise ValueError(
            f"{where} nests groups too deeply to check (more than about 200 levels)"
        ) from None
    except _TooComplex:
        raise ValueError(
            f"{where}: checking what can follow each repeated token took more than "
            f"{_MAX_VISITS} steps; simplify the grammar"
        ) from None


def _check(grammar: str, where: str, depth: int) -> None:
    parsed = _definitions(grammar)
    for nested in parsed.nested:
        if depth < 8:
            _check(nested, f"{where} (%lark block)", depth + 1)
    shapes = _Shapes(parsed)
    rules = {
        name: _ExpressionReader(tokens, False, shapes, lazy=name in parsed.lazy).read()
        for name, tokens in parsed.rules.items()
    }
    ignored = [_evaluate(_ExpressionReader(t, True, shapes).read()) for t in parsed.ignored]
    tokens = [node for node in _nodes(rules.values()) if node[0] == "token"]
    cycle_starts = {word[0] for node in tokens for word in node[1].cycles}
    if not cycle_starts:
        return  # the usual case: no token ends in a repetition of one word
    # Characters that are not the first of any cycle's word only need telling apart
    # from them: one element for all keeps the fixed point short.
    flow = _Flow(
        {name: _collapsed(node, cycle_starts) for name, node in rules.items()},
        _collapse(frozenset().union(*(s.first for s in ignored)), cycle_starts),
    )
    flow.solve_first()
    flow.solve_follow()
    for shape, text, follow in flow.token_follow.values():
        for word in sorted(shape.cycles):
            if follow <= {word[0], _UNKNOWN}:
                raise ValueError(
                    f"{where}: the token {text} can end in a repetition of {word!r} and only "
                    f"{word[0]!r} can follow it: llguidance's greedy lexer would extend it "
                    "forever (a stall). Bound the repetition, or let what follows start "
                    "differently"
                )


def _nodes(roots: Iterable[Node]) -> Iterator[Node]:
    """Every node of the trees under ``roots``."""
    stack = list(roots)
    while stack:
        node = stack.pop()
        yield node
        if node[0] in ("seq", "alt"):
            stack.extend(node[1])
        elif node[0] == "repeat":
            stack.append(node[1])


def _collapsed(node: Node, keep: set[str]) -> Node:
    kind = node[0]
    if kind == "token":
        shape: Shape = node[1]
        collapsed = Shape(_collapse(shape.first, keep), shape.nullable, shape.words, shape.cycles)
        return ("token", collapsed, node[2])
    if kind in ("seq", "alt"):
        return (kind, [_collapsed(part, keep) for part in node[1]])
    if kind == "repeat":
        return ("repeat", _collapsed(node[1], keep), node[2], node[3])
    return node
