"""A count of the structured processors' mask fills, for tests that say when and how
many happen."""

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
