"""The structured-spec fuzzer: generated JSON schemas, regexes, Lark and GBNF grammars,
each built, compiled for the real 128k-token vocabulary and advanced a few tokens in a
child process under a memory (``RLIMIT_AS``) and a wall-clock budget. Each must be
refused with a ``ValueError`` or complete within both; a crash, a signal, a budget breach
or another exception fails with the shrunk example.

Runs in the transformers session (the newest llguidance) and the vLLM session (vLLM's
pinned llguidance, 1.7 today); ``ANYLOGITS_FUZZ_EXAMPLES`` sets the examples per kind
(``nox -s fuzz`` runs thousands, with a fresh seed each run).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llguidance")
pytest.importorskip("transformers")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance_tests.structured_fuzz import FuzzWorker
from conformance_tests.structured_strategies import SPECS
from test_support.hostile import FOUND_BY_FUZZING, STRUCTURED

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("transformers", "vllm")]

EXAMPLES = int(os.environ.get("ANYLOGITS_FUZZ_EXAMPLES", "40"))
# CI replays the same examples every run (a new failure is found by `nox -s fuzz`, then
# kept in hostile.STRUCTURED); the fuzz session draws new ones each time.
DERANDOMIZE = os.environ.get("ANYLOGITS_FUZZ_RANDOM", "") != "1"

ORDINARY = {"type": "regex", "pattern": "[0-9]{3}-[0-9]{4}"}


@pytest.fixture(scope="module")
def worker(tiny_model_dir: Path) -> Iterator[FuzzWorker]:
    worker = FuzzWorker(tiny_model_dir)
    yield worker
    worker.stop()
    # What the examples did (a fuzzer whose examples are all refused proves little).
    print("\nstructured fuzz outcomes:", dict(sorted(worker.outcomes.items())), file=sys.stderr)


def _check(worker: FuzzWorker, spec: dict[str, Any]) -> str:
    outcome = worker.run(spec)
    assert outcome.kind in ("ok", "refused"), (
        f"{outcome.kind} after {outcome.seconds:.2f} s: {outcome.detail}\nspec: {json.dumps(spec)}"
    )
    return outcome.kind


@pytest.mark.parametrize("kind", sorted(SPECS))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
@given(data=st.data())
def test_a_generated_spec_is_refused_or_compiles_and_advances_within_budget(
    worker: FuzzWorker, kind: str, data: st.DataObject
) -> None:
    _check(worker, data.draw(SPECS[kind], label="spec"))


@pytest.mark.parametrize("case", sorted(STRUCTURED))
def test_every_structured_spec_the_fuzzer_found_is_refused_naming_its_limit(
    worker: FuzzWorker, case: str
) -> None:
    spec, limit, named = STRUCTURED[case]
    outcome = worker.run(spec)
    assert outcome.kind == "refused", outcome
    assert f"anylogits limit {limit!r}" in outcome.detail and named in outcome.detail, outcome


@pytest.mark.parametrize("case", sorted(FOUND_BY_FUZZING))
def test_every_failure_the_fuzzer_found_is_now_refused_or_served(
    worker: FuzzWorker, case: str
) -> None:
    _check(worker, FOUND_BY_FUZZING[case])


def test_the_harness_fails_an_exception_a_death_and_a_stall_and_starts_afresh(
    worker: FuzzWorker,
) -> None:
    """The harness itself: an exception other than ``ValueError``, a worker that dies and
    one that stops answering are failures, and each worker that had one is replaced."""
    restarts = worker.restarts
    raised = worker.run({"type": "testing.raise_after", "tokens": 1})
    assert raised.kind == "failed" and "RuntimeError" in raised.detail, raised
    assert worker.run(ORDINARY).kind == "ok" and worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)
    died = worker.run(ORDINARY)
    assert died.kind == "failed" and "died" in died.detail, died
    assert worker.run(ORDINARY).kind == "ok" and worker.pid is not None
    os.kill(worker.pid, signal.SIGSTOP)
    stalled = worker.run(ORDINARY, time_budget=1.0)
    assert stalled.kind == "failed" and "no answer within" in stalled.detail, stalled
    assert worker.run(ORDINARY).kind == "ok"
    assert worker.restarts == restarts + 3
