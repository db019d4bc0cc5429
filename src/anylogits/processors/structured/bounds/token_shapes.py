"""What a lexer token's language looks like to the greedy-lexing check
(:mod:`~anylogits.processors.structured.bounds.greedy_lexing`): the characters it can
start with, whether it can be empty, and its "word" form (one fixed string, the powers of
one primitive word, or mixed) with the words it can end repeating; read from llguidance's
Rust regex syntax (:func:`regex_shape`) or a literal (:func:`literal_shape`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Elements of FIRST/FOLLOW sets besides single characters.
_END = "<end>"  # the input may end here
_OTHER = "<other>"  # a character class of several, a special token: never forced
_UNKNOWN = "<unknown>"  # not read (an embedded block): may be anything, w[0] included
_MAX_FIXED = 100_000  # longer fixed strings are only known as mixed
# Work of the FIRST/FOLLOW fixed point (node visits): ordinary grammars need thousands; a
# grammar built to need more, of any size, is refused (~1 s of Python at most).
_MAX_VISITS = 2_000_000


class _TooComplex(Exception):
    pass


@dataclass(frozen=True)
class Shape:
    """What the greedy-lexing check needs of a token's language.

    ``first``: the characters it can start with (``_OTHER`` for several at once);
    ``nullable``: it matches the empty string; ``words``: ``("fixed", s)`` one string,
    ``("powers", w)`` only powers of the primitive word ``w``, ``("mixed", "")`` anything
    else (``("fixed", "")`` is the empty string); ``cycles``: the words ``w`` such that
    the token can end inside an unbounded repetition of ``w``.
    """

    first: frozenset[str]
    nullable: bool
    words: tuple[str, str]
    cycles: frozenset[str]


_EMPTY = Shape(frozenset(), True, ("fixed", ""), frozenset())
_WIDE = Shape(frozenset({_OTHER}), False, ("mixed", ""), frozenset())
_OPAQUE = Shape(frozenset({_UNKNOWN}), False, ("mixed", ""), frozenset())


def _root(word: str) -> str:
    """The primitive root: ``"abab"`` → ``"ab"``."""
    period = (word + word).find(word, 1)
    return word[:period] if 0 < period < len(word) else word


def _char(char: str, ignore_case: bool = False) -> Shape:
    if ignore_case and char.lower() != char.upper():
        return _WIDE
    return Shape(frozenset({char}), False, ("fixed", char), frozenset())


def _powers_root(words: tuple[str, str]) -> str | None:
    """``w`` when every string of ``words`` is a power of ``w`` (None: mixed or empty)."""
    kind, value = words
    if kind == "powers":
        return value
    if kind == "fixed" and value:
        return _root(value)
    return None


def _within(words: tuple[str, str], word: str) -> bool:
    """Every string of ``words`` is a power of ``word`` (the empty string included)."""
    return words == ("fixed", "") or _powers_root(words) == word


def _cat_words(left: tuple[str, str], right: tuple[str, str]) -> tuple[str, str]:
    if left == ("fixed", ""):
        return right
    if right == ("fixed", ""):
        return left
    if left[0] == right[0] == "fixed":
        joined = left[1] + right[1]
        return ("fixed", joined) if len(joined) <= _MAX_FIXED else ("mixed", "")
    root = _powers_root(left)
    if root is not None and root == _powers_root(right):
        return ("powers", root)
    return ("mixed", "")


def _alt_words(left: tuple[str, str], right: tuple[str, str]) -> tuple[str, str]:
    if left == right:
        return left
    roots = {_powers_root(words) for words in (left, right) if words != ("fixed", "")}
    root = roots.pop() if len(roots) == 1 else None
    return ("powers", root) if root is not None else ("mixed", "")


def cat(left: Shape, right: Shape) -> Shape:
    """``left`` then ``right``."""
    cycles = set(right.cycles)
    cycles.update(w for w in left.cycles if right.nullable or _within(right.words, w))
    return Shape(
        left.first | (right.first if left.nullable else frozenset()),
        left.nullable and right.nullable,
        _cat_words(left.words, right.words),
        frozenset(cycles),
    )


def alt(left: Shape, right: Shape) -> Shape:
    """``left`` or ``right``."""
    return Shape(
        left.first | right.first,
        left.nullable or right.nullable,
        _alt_words(left.words, right.words),
        left.cycles | right.cycles,
    )


def repeat(body: Shape, low: int, high: int | None) -> Shape:
    """``body`` repeated ``low`` to ``high`` times (None: unbounded)."""
    kind, value = body.words
    if body.words == ("fixed", ""):
        words = body.words
    elif kind == "fixed" and low == high:
        words = ("fixed", value * low) if len(value) * low <= _MAX_FIXED else ("mixed", "")
    elif low == high == 0:
        words = ("fixed", "")
    else:
        root = _powers_root(body.words)
        words = ("powers", root) if root is not None else ("mixed", "")
    cycles = set(body.cycles)
    root = _powers_root(body.words)
    if high is None and root is not None:
        cycles.add(root)
    return Shape(body.first, low == 0 or body.nullable, words, frozenset(cycles))


# Rust `regex` syntax, as llguidance's lexer reads a /regex/.
_CLASS_ESCAPES = set("dDwWsSpP")
_ANCHOR_ESCAPES = set("bBAzZ<>")
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "0": "\0"}
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}")


class _RegexReader:
    def __init__(self, pattern: str, ignore_case: bool) -> None:
        self.text = pattern
        self.position = 0
        self.ignore_case = ignore_case

    def read(self) -> Shape:
        shape = self._alternation()
        while self.position < len(self.text):  # an unmatched ")": read on
            self.position += 1
            shape = cat(shape, self._alternation())
        return shape

    def _alternation(self) -> Shape:
        shape = self._sequence()
        while self._peek() == "|":
            self.position += 1
            shape = alt(shape, self._sequence())
        return shape

    def _sequence(self) -> Shape:
        shape = _EMPTY
        while self.position < len(self.text) and self._peek() not in "|)":
            shape = cat(shape, self._quantified())
        return shape

    def _quantified(self) -> Shape:
        shape = self._atom()
        while self.position < len(self.text):
            char = self._peek()
            bounds: tuple[int, int | None]
            if char in "*+?":
                bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
                self.position += 1
            elif char == "{" and (counted := _QUANTIFIER.match(self.text, self.position)):
                low = int(counted[1])
                high = low if counted[2] is None else (int(counted[3]) if counted[3] else None)
                bounds = (low, high)
                self.position = counted.end()
            else:
                return shape
            if self._peek() in ("?", "+"):  # lazy or possessive: the same language
                self.position += 1
            shape = repeat(shape, *bounds)
        return shape

    def _atom(self) -> Shape:
        char = self._peek()
        self.position += 1
        if char == "(":
            return self._group()
        if char == "[":
            return self._class()
        if char == "\\":
            return self._escape()
        if char in "^$":
            return _EMPTY
        if char == ".":
            return _WIDE
        return _char(char, self.ignore_case)

    def _group(self) -> Shape:
        saved = self.ignore_case
        if self._peek() == "?":
            flags = re.match(r"\?(?:P?<[^>]*>|([a-zA-Z-]*)(:|\)))", self.text[self.position :])
            if flags is None:
                self.position += 1
            else:
                self.position += flags.end()
                if flags[1] is not None:
                    on = flags[1].split("-")[0]
                    if "i" in on:
                        self.ignore_case = True
                    if flags[2] == ")":  # (?i) sets the flag for the rest of the group
                        return _EMPTY
        shape = self._alternation()
        if self._peek() == ")":
            self.position += 1
        self.ignore_case = saved
        return shape

    def _escape(self) -> Shape:
        char = self._peek()
        self.position += 1
        if char in _CLASS_ESCAPES:
            if self._peek() == "{":
                self.position = self.text.find("}", self.position) % (len(self.text) + 1) + 1
            else:
                self.position += char in "pP"
            return _WIDE
        if char in _ANCHOR_ESCAPES:
            return _EMPTY
        if char in "xuU":
            digits = re.match(r"\{([0-9a-fA-F]+)\}|([0-9a-fA-F]{1,8})", self.text[self.position :])
            if digits is None:
                return _WIDE
            self.position += digits.end()
            try:
                return _char(chr(int(digits[1] or digits[2], 16)), self.ignore_case)
            except (ValueError, OverflowError):
                return _WIDE
        return _char(_CONTROL_ESCAPES.get(char, char), self.ignore_case)

    def _class(self) -> Shape:
        """One character if the class names exactly one, else several."""
        start = self.position - 1
        depth, members = 1, set()
        simple = self._peek() != "^"
        while self.position < len(self.text) and depth:
            char = self._peek()
            self.position += 1
            if char == "\\":
                escaped = self._peek()
                self.position += 1
                if escaped in _CLASS_ESCAPES or escaped in "xuU":
                    simple = False
                members.add(_CONTROL_ESCAPES.get(escaped, escaped))
            elif char == "[":
                depth += 1
                simple = False
            elif char == "]" and self.position - 1 > start + 1:
                depth -= 1
            elif char == "-" and members and self._peek() != "]":
                simple = False
            else:
                members.add(char)
        if simple and len(members) == 1:
            return _char(members.pop(), self.ignore_case)
        return _WIDE

    def _peek(self) -> str:
        return self.text[self.position] if self.position < len(self.text) else ""


def regex_shape(pattern: str, flags: str = "") -> Shape:
    """The :class:`Shape` of a regex (Rust syntax).

    Example:
        >>> sorted(regex_shape("x(ab)+").cycles), sorted(regex_shape("[ab]+").cycles)
        (['ab'], [])
    """
    return _RegexReader(pattern, "i" in flags).read()


def literal_shape(text: str, ignore_case: bool = False) -> Shape:
    """The shape of ``text``'s characters one after another, written out: what folding
    :func:`cat` over them gives, in one step (a grammar of 2,700 literals was 0.17 s
    to check, one ``cat`` per character)."""
    if not text:
        return _EMPTY
    first = _char(text[0], ignore_case).first
    if ignore_case and any(char.lower() != char.upper() for char in text):
        return Shape(first, False, ("mixed", ""), frozenset())
    words = ("fixed", text) if len(text) <= _MAX_FIXED else ("mixed", "")
    return Shape(first, False, words, frozenset())


# The grammar: rules (lowercase) over tokens; terminals (uppercase) are one token each.
# A rule's tree: ("token", Shape, its text) one token; ("rule", name); ("seq" | "alt",
# [parts]); ("repeat", body, low, high or None).
