"""A grammar's first validation runs in a child process under a memory and a time budget:
over either, the grammar is refused with a ``ValueError`` naming the limit, the child is
replaced, and this process carries on."""

from __future__ import annotations

import itertools
import os

import pytest

pytest.importorskip("llguidance")

from anylogits import Grammar, Regex
from anylogits.core.limits import override
from anylogits.processors.structured.guard import GUARD
from test_support.hostile import largest_alternatives_grammar

_unique = itertools.count()


def _fresh(grammar: str) -> str:
    """``grammar`` with a rule of its own: checks are remembered per text."""
    return f'{grammar}\nunused{next(_unique)}: "u"\n'


def test_a_grammar_over_the_memory_budget_is_refused_and_the_checker_replaced() -> None:
    big = largest_alternatives_grammar()
    Grammar(_fresh(big))
    first = GUARD._process
    with override(grammar_check_mb=1), pytest.raises(ValueError) as raised:
        Grammar(_fresh(big))
    assert "needs more than 1 MB to compile (anylogits limit 'grammar_check_mb'" in str(
        raised.value
    )
    Grammar(_fresh(big))  # a new checker, under the default budget
    assert GUARD._process is not None and GUARD._process is not first
    assert GUARD._process.poll() is None


def test_a_grammar_over_the_time_budget_is_refused() -> None:
    big = largest_alternatives_grammar()
    with override(grammar_check_ms=1), pytest.raises(ValueError) as raised:
        Grammar(_fresh(big))
    assert "takes longer than 1 ms to compile (anylogits limit 'grammar_check_ms'" in str(
        raised.value
    )
    Regex("[a-z]{1,3}")


def test_the_checker_is_one_long_lived_process() -> None:
    Regex("a{2}")
    process = GUARD._process
    for count in range(3, 8):
        Regex(f"b{{{count}}}")
    assert GUARD._process is process and process is not None and process.poll() is None


def test_an_invalid_grammar_is_the_engines_error_not_a_budget() -> None:
    with pytest.raises(ValueError, match="does not compile") as raised:
        Grammar(_fresh("start: missing_rule"))
    assert "anylogits limit" not in str(raised.value)


def test_a_forked_process_starts_its_own_checker_and_leaves_the_parents() -> None:
    Regex("c{2}")
    parent_checker = GUARD._process
    pid = os.fork()
    if pid == 0:  # the child: its own checker, never the parent's pipes
        try:
            Regex(f"d{{{next(_unique) + 2}}}")
            code = 0 if GUARD._process is not parent_checker else 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert GUARD._process is parent_checker and parent_checker is not None
    assert parent_checker.poll() is None
    Regex(f"e{{{next(_unique) + 2}}}")
