"""What the GPU suite's modules share (``tests/test_cuda.py``: the catalogue on the
device; ``tests/test_cuda_generate.py``: transformers' ``generate`` on it): the device
they run on, their skip without one, the report, and how a decode step is checked (under
``torch.cuda.set_sync_debug_mode``, against the CPU's logits).

``ANYLOGITS_GPU_REPORT=path.json`` writes what each catalogue case did (synchronizing
calls seen, largest difference from the CPU). ``ANYLOGITS_GPU_TEST_DEVICE=cpu`` runs the
same code with the CPU as the "device" (no sync detection): a check of this harness on a
machine without a GPU.

A module using them sets ``pytestmark = REQUIRES_DEVICE`` and imports the autouse
fixtures :func:`write_report` and :func:`fresh_greenlists`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from anylogits import from_spec
from anylogits.core.sync import forbid_host_sync
from anylogits.processors import watermark as watermark_module
from anylogits.processors._greenlist import GreenlistCache
from test_support.device_budget import expected_device_reads
from test_support.engine_rows import CASES
from test_support.kept_sets import without_boundary_flips

DEVICE = torch.device(os.environ.get("ANYLOGITS_GPU_TEST_DEVICE", "cuda"))
ON_CUDA = DEVICE.type == "cuda"


def _device_available() -> bool:
    return torch.cuda.is_available() if ON_CUDA else DEVICE.type == "cpu"


REQUIRES_DEVICE = pytest.mark.skipif(
    not _device_available(),
    reason="no CUDA device here (torch.cuda.is_available() is False): the GPU session "
    "(nox -s gpu, tools/gpu_check.py) runs these",
)

HAS_LLGUIDANCE = importlib.util.find_spec("llguidance") is not None

# The CPU and CUDA kernels of exp, log, pow and the reductions (softmax, cumsum, sums over
# a row) round differently in the last bits (float32 epsilon: 1.2e-7); with logits below
# ~20 in magnitude a few ulps stay well under 1e-5. Truncations leave the kept logits as
# they are, so which entries are -inf must agree exactly (assert_close compares
# infinities exactly); a token at a truncation's boundary flipping would show here.
RTOL = 1e-5
ATOL = 1e-5

# Which steps may synchronize: those the accelerator level's budget allows a device read
# (test_support/device_budget.py: each with its reason; the prefix tracker's read of
# input_ids on the device-history path among them). Every other step must not: so this
# run checks on real hardware what the emulated device claims (tests/test_device_copies.py).
# A step that syncs on CUDA for a reason the emulation cannot see goes here, with it.
CUDA_ONLY_SYNCS: dict[tuple[str, str], str] = {}


REPORT: dict[str, dict[str, Any]] = {}


def expected_sync(name: str, path: str) -> str | None:
    """Why catalogue case ``name`` may synchronize in a step on ``path``, or ``None`` when
    it must not; the budget's reads per step go to the report."""
    reads, why = expected_device_reads(name, from_spec(CASES[name]), path)
    REPORT.setdefault(name, {}).setdefault(path, {})["budget_reads"] = reads
    return why if reads else CUDA_ONLY_SYNCS.get((name, path))


@pytest.fixture(autouse=True)
def write_report() -> Iterator[None]:
    # After every test: a run stopped by its time limit keeps what it saw.
    yield
    path = os.environ.get("ANYLOGITS_GPU_REPORT")
    if path and REPORT:
        Path(path).write_text(json.dumps(REPORT, indent=2, sort_keys=True) + "\n")


@pytest.fixture(autouse=True)
def fresh_greenlists() -> Iterator[None]:
    # Watermark's greenlist cache is process-wide: each case starts from an empty one.
    with mock.patch.object(watermark_module, "GREENLISTS", GreenlistCache()):
        yield


@contextlib.contextmanager
def sync_debug(mode: str) -> Iterator[list[str]]:
    """Run the block under ``torch.cuda.set_sync_debug_mode(mode)`` (``"error"``: a
    synchronizing call raises; ``"warn"``: it is recorded in the list yielded)."""
    seen: list[str] = []
    if not ON_CUDA:
        # The harness check on the CPU: the processors take the accelerator's branch.
        with forbid_host_sync():
            yield seen
        return
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(mode)
        try:
            yield seen
        finally:
            torch.cuda.set_sync_debug_mode("default")
    seen.extend(str(w.message) for w in caught if "synchroniz" in str(w.message).lower())


def checked_step(label: str, reason: str | None, record: dict[str, Any], run: Any) -> torch.Tensor:
    """``run()``: the checked step, strict unless ``reason`` says it syncs by design."""
    if reason is None:
        try:
            with sync_debug("error"):
                result = run()
        except RuntimeError as error:
            if "synchroniz" not in str(error).lower():
                raise
            record["syncs"] = f"raised: {error}"
            raise AssertionError(
                f"{label}: a synchronizing CUDA call in a decode step ({error}); the "
                "traceback above shows where. The accelerator level's budget "
                "(test_support/device_budget.py) allows none here: if the emulated device "
                "missed it, it should count it; if only CUDA syncs there, list the case in "
                "CUDA_ONLY_SYNCS with the reason."
            ) from error
        record["syncs"] = 0
        return result
    with sync_debug("warn") as seen:
        result = run()
    record["syncs"] = len(seen)
    record["expected"] = reason
    return result


def assert_matches_cpu(
    actual: torch.Tensor,
    expected: torch.Tensor,
    label: str,
    record: dict[str, Any],
    boundary: bool = False,
) -> None:
    actual = actual.cpu()
    if boundary:
        actual, expected, flips = without_boundary_flips(actual, expected, label)
        if flips:
            record["boundary_flips"] = record.get("boundary_flips", 0) + flips
    finite = torch.isfinite(actual) & torch.isfinite(expected)
    difference = (actual - expected).abs()[finite]
    record["max_abs_difference"] = max(
        record.get("max_abs_difference", 0.0), float(difference.max()) if difference.numel() else 0
    )
    record["bitwise_equal"] = record.get("bitwise_equal", True) and bool(
        torch.equal(actual.nan_to_num(0.5), expected.nan_to_num(0.5))
    )
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True, msg=label)
