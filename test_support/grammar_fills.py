"""A count of the structured processors' mask fills and spec checks, for tests that say
when and how many happen."""

from __future__ import annotations

import pytest


def counted_fills(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each grammar mask fill from now on (until ``monkeypatch`` undoes it)."""
    from anylogits.processors import structured

    fills: list[int] = []
    original_fill = structured.fill_bitmask
    monkeypatch.setattr(
        structured,
        "fill_bitmask",
        lambda engine, cursors, *rest: (
            fills.append(len(cursors)),
            original_fill(engine, cursors, *rest),
        ),
    )
    return fills


def counted_checks(monkeypatch: pytest.MonkeyPatch, check: str = "check_schema") -> list[tuple]:
    """The arguments of each call of the structured processors' ``check`` (a spec's
    bounds: ``check_schema``, ``check_lark``) from now on (until ``monkeypatch`` undoes
    it)."""
    from anylogits.processors import structured

    calls: list[tuple] = []
    original = getattr(structured, check)
    monkeypatch.setattr(structured, check, lambda *args: (calls.append(args), original(*args))[1])
    return calls
