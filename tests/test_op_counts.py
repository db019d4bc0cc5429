"""Kernel launches per decode step on an accelerator, pinned (issue 43): each catalogue
processor along transformers' path, and no job above transformers' own processors.
The table and how it is counted: ``test_support/op_counts.py``."""

from __future__ import annotations

import pytest

from test_support.engine_rows import CASES
from test_support.op_counts import (
    BATCHES,
    JOBS,
    LAUNCHES,
    TRANSFORMERS_LAUNCHES,
    case_launches,
    count_launches,
    hook_step,
    runnable_cases,
    transformers_jobs,
    transformers_step,
)


def test_every_case_is_in_the_table() -> None:
    assert set(LAUNCHES) == set(CASES)


@pytest.mark.parametrize("name", runnable_cases())
def test_launches_per_step_are_as_pinned(name: str) -> None:
    counted = case_launches(name)
    assert counted == LAUNCHES[name], (
        f"{name} launches {dict(zip(BATCHES, counted, strict=True))} kernels per call at B = "
        f"{BATCHES}, the table says {LAUNCHES[name]}: "
        + (
            "more launches cost every GPU user ~5-10 us each; find the new operations "
            "(count_launches returns them by name)"
            if any(c > p for c, p in zip(counted, LAUNCHES[name], strict=True))
            else "fewer: update LAUNCHES in test_support/op_counts.py"
        )
    )


@pytest.mark.parametrize("job", sorted(JOBS))
def test_no_job_launches_more_than_transformers(job: str) -> None:
    for batch in BATCHES:
        launches, ops = count_launches(hook_step(JOBS[job]()), batch)
        assert launches <= TRANSFORMERS_LAUNCHES[job], (job, batch, launches, ops)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_transformers_launches_are_as_pinned(job: str) -> None:
    pytest.importorskip("transformers")
    launches, ops = count_launches(transformers_step(transformers_jobs()[job]), BATCHES[0])
    assert launches == TRANSFORMERS_LAUNCHES[job], (
        f"transformers' processors for {job} launch {launches} ({ops}); the table says "
        f"{TRANSFORMERS_LAUNCHES[job]}: update TRANSFORMERS_LAUNCHES"
    )
