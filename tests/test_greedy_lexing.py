"""Grammars whose greedy lexer would force one byte forever are refused where they are
parsed; their near misses are served. The stall itself is shown on llguidance (a child
process, killed after its time) so that the refusal is seen to be needed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

llguidance = pytest.importorskip("llguidance")

from anylogits import Grammar  # noqa: E402
from anylogits.processors.structured.bounds.greedy_lexing import check_greedy_lexing  # noqa: E402
from anylogits.processors.structured.bounds.token_shapes import regex_shape  # noqa: E402

STALLS = {
    "a regex followed by its own character": 'start: /a+/ "a"',
    "a word repeated, then the word": 'start: /(ab)+/ "ab"',
    "two such tokens": "start: /a+/ /a+/",
    "after a literal": 'start: "x" /a+/ "a"',
    "the repetition at the end of the token": 'start: /ab*/ "b"',
    "a nullable repetition, optional": 'start: r0\nr0: [/(?:a)*/ "a"]',
    "through a rule": 'start: /a+/ x\nx: "a" | "ab"',
    "a terminal": 'start: A "a"\nA: "a"+',
    "an escape": 'start: /\\x61+/ "a"',
    "a one-character class": 'start: /[a]+/ "a"',
    "words that are powers of one": 'start: /(a|aa)+/ "a"',
    "an open count": 'start: /a{2,}/ "a"',
    "nothing can follow": "start: r\nr: /a+/ r",
    "a rule with a stop string": 'start: a "a"\na[stop=""]: /a+/',
    "a rule with max_tokens": 'start: a "a"\na[max_tokens=3]: /a+/',
    # Found by `nox -s fuzz` (llguidance 1.7.6; 1.9.1 stalls too): every repetition but
    # the last is followed by the next one only.
    "a repeated token (the fuzzer's)": 'start: r0\nr0: "a" /(?:a){1,}/~2\nr1: "a" "a"',
    "a repeated token, then more": 'start: /a+/~2 "b"',
    "a repeated token, counted in braces": "start: /a+/{2}",
    "a repeated rule": "start: r1~2\nr1: /a+/",
}
NEAR_MISSES = {
    "another character may follow": 'start: /a*/ "b"',
    "a class": 'start: /[0-9]+/ "1"',
    "the end may follow": 'start: /a+/ "a"?',
    "one of the followers differs": 'start: /a+/ x\nx: "a" | "b"',
    "whitespace is ignored between tokens": 'start: /a+/ "a"\n%ignore / +/',
    "a lazy rule": 'start: a "a"\na[lazy]: /a+/',
    "case-insensitive": 'start: /a+/i "a"',
    "a bounded count": 'start: /a{2,5}/ "a"',
    "a heading": 'start: /#+/ " " /[a-z]+/',
    "the token alone": "start: /a+/",
    "a repetition that may stop after one": "start: /a+/~1..3",
    "a repetition that may stop at none": "start: /a+/~0..2",
    "a repeated group ending elsewhere": 'start: (/a+/ "b")~2',
    "a repeated group starting elsewhere": 'start: ("x" /a+/)~3',
    "a repeated rule ending elsewhere": 'start: r1~2\nr1: /a+/ "b"',
}


@pytest.mark.parametrize("grammar", list(STALLS.values()), ids=list(STALLS))
def test_a_token_forced_forever_is_refused_naming_it(grammar: str) -> None:
    with pytest.raises(ValueError, match="greedy lexer would extend it forever"):
        Grammar(grammar)


def test_the_gbnf_the_fuzzer_found_is_refused_after_conversion() -> None:
    with pytest.raises(ValueError, match="token R1 can end in a repetition of 'a'"):
        Grammar('root ::= r0\nr0 ::= (r1) (r0)\nr1 ::= "a"*\n', syntax="gbnf")


_RUN = """
import sys, torch
from anylogits import Grammar, Pipeline, Vocabulary
from anylogits.processors import structured
if sys.argv[1] == "unchecked":
    structured.check_greedy_lexing = lambda grammar, where: None
pieces = [b"a", b"b", b"aa", b"ab", b"x", b"1", b"0", b" ", b"#", b"<eos>"]
vocab = Vocabulary(tokens=tuple(pieces), eos_token_ids=frozenset({9}),
                   special_token_ids=frozenset({9}))
for grammar in sys.argv[2:]:
    pipeline = Pipeline([Grammar(grammar)], vocab)
    ids = [[0]]
    for _ in range(4):
        out = pipeline(torch.zeros(1, 10), torch.tensor(ids))
        allowed = [t for t in torch.nonzero(out[0] > float("-inf")).flatten().tolist() if t != 9]
        if not allowed:
            break
        ids[0].append(allowed[0])
    print("served", repr(grammar), flush=True)
"""


def _run(mode: str, grammars: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_RUN), mode, *grammars],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "stall", ["a regex followed by its own character", "a repeated token (the fuzzer's)"]
)
def test_without_the_check_llguidance_never_returns_a_mask(stall: str) -> None:
    """The oracle: the shape is a real stall, not a guess (llguidance's forced-byte loop)."""
    with pytest.raises(subprocess.TimeoutExpired):
        _run("unchecked", [STALLS[stall]], timeout=8)


def test_near_misses_are_served_promptly() -> None:
    done = _run("checked", list(NEAR_MISSES.values()), timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("served") == len(NEAR_MISSES)


@pytest.mark.parametrize(
    ("pattern", "cycles", "first"),
    [
        ("a+", {"a"}, {"a"}),
        ("x(ab)+", {"ab"}, {"x"}),
        ("(ab)+c", set(), {"a"}),
        ("[ab]+", set(), {"<other>"}),
        ("(?:a|aa)*b?", {"a"}, {"a", "b"}),
        ("\\d+", set(), {"<other>"}),
        ("(?i)a+", set(), {"<other>"}),
        ("a{3}", set(), {"a"}),
    ],
)
def test_regex_shapes(pattern: str, cycles: set[str], first: set[str]) -> None:
    shape = regex_shape(pattern)
    assert set(shape.cycles) == cycles and set(shape.first) == first


def test_a_long_grammar_is_checked_in_one_pass_per_change() -> None:
    # FOLLOW flows start -> r0 -> ... -> r1000 with the rules listed backwards: a pass
    # budget would stop early and refuse; the worklist reaches the end.
    rules = [f"r{i}: r{i + 1}" for i in range(1000)] + ["r1000: /a+/"]
    check_greedy_lexing("\n".join(reversed(rules)) + '\nstart: r0 "b"\n', "grammar")


def test_nesting_too_deep_to_check_is_refused_by_name() -> None:
    # How deep the check can go is the interpreter's recursion limit, which is process-wide:
    # torch.compile (the bitmask kernel, compiled by earlier tests) raises it to 2,000, and
    # then 400 levels are checked in full. Python's default, as where nothing compiled:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        with pytest.raises(ValueError, match="nests groups too deeply to check"):
            check_greedy_lexing("start: " + "(" * 400 + "/a+/" + ")" * 400, "grammar")
    finally:
        sys.setrecursionlimit(limit)
