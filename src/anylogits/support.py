"""The support matrix as shipped in the package: which backend passes which conformance
level for each catalogue processor.

``nox -s matrix`` (``python -m conformance_tests.support_matrix``) writes it from the
conformance runs' records twice, as ``docs/support-matrix.md`` and as the
``support_matrix.json`` beside this module, which an installed package (no checkout, no
records) reads for ``anylogits list``. The cell texts of both come from :func:`cell_text`.

The JSON::

    {"levels": [...], "backends": [...],
     "processors": {spec_name: {"class": class name,
                                "support": {backend: cell}}}}

where a cell is ``{"status": one of STATUSES, "levels": [...], "notes": [...]}``:
``levels`` are the levels that passed (``pass``) or failed (``fail``); ``notes`` the known
gaps (``pass``, ``known gap``) or the reasons tests did not run (``not run``).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

LEVEL_MEANINGS = {
    "hook": "the adapter called as the backend calls it equals the core result",
    "oracle": "equals the backend's native implementation on identical inputs",
    "generation": "a real engine generates with it on a tiny model",
}
LEVELS = tuple(LEVEL_MEANINGS)
"""Conformance levels, weakest first."""

STATUSES = ("pass", "fail", "known gap", "not run", "no test yet")

PACKAGED_FILE = "support_matrix.json"


def cell_text(cell: dict[str, Any]) -> str:
    """A cell as the matrix page writes it, e.g. ``pass (hook, oracle)``."""
    status, levels, notes = cell["status"], cell["levels"], cell["notes"]
    if status == "pass":
        text = "pass (" + ", ".join(levels) + ")"
        return text + ("; known gap: " + "; ".join(notes) if notes else "")
    if status == "fail":
        return "fail: " + ", ".join(levels)
    if status == "known gap":
        return "known gap: " + "; ".join(notes)
    if status == "not run":
        return "not run: " + ("; ".join(notes) or "skipped")
    if status == "no test yet":
        return status
    raise ValueError(f"support matrix cell status {status!r} is not one of {STATUSES}")


def packaged_support_matrix() -> dict[str, Any]:
    """The support matrix shipped in the package (see the module's docstring)."""
    text = resources.files("anylogits").joinpath(PACKAGED_FILE).read_text(encoding="utf-8")
    matrix: dict[str, Any] = json.loads(text)
    return matrix
