"""The processor x backend support matrix, generated from conformance runs.

A test that proves something about one processor on one backend says so with
``@pytest.mark.support(level)``, level being ``hook``, ``oracle`` or ``generation``.
The processor is the test's ``name`` or ``case`` parameter unless the marker names it
(``processor=``, a spec name or class name); the backend is its ``backend`` parameter
unless the marker names it (``backend=``). With ``ANYLOGITS_SUPPORT_DIR`` set, each
pytest run writes its outcomes there as JSON, and

    python -m conformance_tests.support_matrix DIR docs/support-matrix.md \\
        src/anylogits/support_matrix.json

renders the table the way narwhals renders its completeness pages, and writes the same
matrix as the JSON the package ships (``anylogits list`` reads it there; see
:mod:`anylogits.support`). A cell reads pass (with the levels that passed), known gap (an
xfail's reason), fail, or not run (a skip's reason); a cell no test covers reads "no test
yet" (``--strict`` fails instead). Every catalogue processor gets a row and every backend
a column.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from anylogits.core.processor import LogitsProcessor
from anylogits.support import LEVELS, cell_text, render_markdown
from test_support.catalogue import catalogue_classes

DIRECTORY_VARIABLE = "ANYLOGITS_SUPPORT_DIR"


def _spec_name(value: str) -> str | None:
    names = catalogue_classes()
    if value in names:
        return value
    by_class = {class_name: spec for spec, class_name in names.items()}
    return by_class.get(value)


def record_of(item: pytest.Item, report: pytest.TestReport) -> list[dict[str, Any]]:
    """The matrix entries a finished test phase contributes (one per processor it names;
    none unless it is a support test)."""
    marker = item.get_closest_marker("support")
    if marker is None:
        return []
    level = marker.args[0]
    if level not in LEVELS:
        raise pytest.UsageError(f"{item.nodeid}: support level {level!r} is not one of {LEVELS}")
    params = getattr(item, "callspec", None)
    params = params.params if params is not None else {}
    processor = marker.kwargs.get("processor") or params.get("name") or params.get("case")
    for value in params.values():
        if processor is None and isinstance(value, LogitsProcessor):
            processor = value.spec_name
    backend = marker.kwargs.get("backend") or getattr(params.get("backend"), "name", None)
    if processor is None or backend is None:
        raise pytest.UsageError(f"{item.nodeid}: a support test needs a processor and a backend")
    # A test comparing several processors at once names them all (a tuple).
    names = [processor] if isinstance(processor, str) else list(processor)
    spec_names = [spec for spec in map(_spec_name, names) if spec is not None]
    if not spec_names:
        return []  # a probe or a test-only case, not a catalogue processor
    if report.when == "call":
        outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
    elif report.skipped:
        outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.failed:
        outcome = "failed"
    else:
        return []
    reason = getattr(report, "wasxfail", "")
    if report.skipped and not reason and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2].removeprefix("Skipped: ")
    return [
        {
            "processor": spec_name,
            "backend": backend,
            "level": level,
            "outcome": outcome,
            "reason": reason,
            "test": item.nodeid,
        }
        for spec_name in spec_names
    ]


class SupportRecorder:
    """The pytest plugin: collects records and writes them at the end of the run."""

    def __init__(self, directory: Path, backends: list[str]) -> None:
        self.directory = directory
        self.backends = set(backends)
        self.records: list[dict[str, Any]] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        outcome = yield
        # Tests of backends this run did not select only say "not selected": another
        # run (another nox session) speaks for those backends.
        records = record_of(item, outcome.get_result())
        self.records += [r for r in records if r["backend"] in self.backends]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.records:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        # Named by the selected backends: a session replacing its own stale records
        # (support-<backend>-*.json) must never delete another session's.
        backends = "-".join(sorted(self.backends))
        path = self.directory / f"support-{backends}-{os.getpid()}.json"
        path.write_text(json.dumps(self.records, indent=1))


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell (see :mod:`anylogits.support`) from every record of one processor on one
    backend."""
    if not records:
        return {"status": "no test yet", "levels": [], "notes": []}
    failed = {r["level"] for r in records if r["outcome"] == "failed"}
    if failed:
        return {"status": "fail", "levels": _in_order(failed), "notes": []}
    passed = {r["level"] for r in records if r["outcome"] == "passed"}
    gaps = sorted({r["reason"] for r in records if r["outcome"] == "xfailed"})
    if passed:
        return {"status": "pass", "levels": _in_order(passed), "notes": gaps}
    if gaps:
        return {"status": "known gap", "levels": [], "notes": gaps}
    reasons = sorted({r["reason"] for r in records if r["reason"]})
    return {"status": "not run", "levels": [], "notes": reasons}


def _in_order(levels: set[str]) -> list[str]:
    return [level for level in LEVELS if level in levels]


def cell(records: list[dict[str, Any]]) -> str:
    """One table cell from every record of one processor on one backend ("" if none)."""
    return cell_text(summarize(records)) if records else ""


def build_matrix(
    records: list[dict[str, Any]], backends: list[str], *, strict: bool
) -> dict[str, Any]:
    """The matrix (the JSON :mod:`anylogits.support` reads). Cells without any test read
    "no test yet"; with ``strict`` they raise ``ValueError`` naming them instead."""
    by_cell: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_cell[record["processor"], record["backend"]].append(record)
    names = catalogue_classes()
    empty = [
        f"{names[spec]} on {backend}"
        for spec in sorted(names)
        for backend in backends
        if not by_cell[spec, backend]
    ]
    if empty and strict:
        raise ValueError("support matrix cells without any test: " + ", ".join(empty))
    processors = {
        spec: {
            "class": names[spec],
            "support": {backend: summarize(by_cell[spec, backend]) for backend in backends},
        }
        for spec in sorted(names)
    }
    return {"levels": list(LEVELS), "backends": list(backends), "processors": processors}


def render(records: list[dict[str, Any]], backends: list[str], *, strict: bool) -> str:
    """The markdown page of the records (see :func:`build_matrix`)."""
    return render_markdown(build_matrix(records, backends, strict=strict))


def render_json(matrix: dict[str, Any]) -> str:
    """The packaged JSON of a matrix (:func:`build_matrix`)."""
    return json.dumps(matrix, indent=1) + "\n"


def main(arguments: list[str]) -> int:
    from anylogits.engines.backends import BACKENDS

    strict = "--strict" in arguments
    arguments = [a for a in arguments if a != "--strict"]
    if len(arguments) != 3:
        print(
            "usage: python -m conformance_tests.support_matrix [--strict] RESULTS_DIR OUT.md "
            "OUT.json"
        )
        return 2
    directory, page, packaged = (Path(argument) for argument in arguments)
    records = [r for path in sorted(directory.glob("*.json")) for r in json.loads(path.read_text())]
    matrix = build_matrix(records, list(BACKENDS), strict=strict)
    for out, text in ((page, render_markdown(matrix)), (packaged, render_json(matrix))):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out} from {len(records)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
