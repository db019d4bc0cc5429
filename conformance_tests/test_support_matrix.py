"""The support matrix renderer: every catalogue processor x backend cell is filled."""

from __future__ import annotations

import pytest

from conformance_tests.support_matrix import cell, render
from test_support.catalogue import catalogue_classes


def record(processor: str, backend: str, level: str, outcome: str, reason: str = "") -> dict:
    return {
        "processor": processor,
        "backend": backend,
        "level": level,
        "outcome": outcome,
        "reason": reason,
        "test": "t",
    }


def test_a_cell_lists_passed_levels_in_order_and_known_gaps() -> None:
    records = [
        record("top_k", "mlx", "oracle", "passed"),
        record("top_k", "mlx", "hook", "passed"),
        record("top_k", "mlx", "generation", "xfailed", "mlx-lm samples in bf16"),
    ]
    assert cell(records) == "pass (hook, oracle); known gap: mlx-lm samples in bf16"


def test_one_failure_makes_the_cell_fail() -> None:
    records = [record("top_k", "mlx", "hook", "passed"), record("top_k", "mlx", "oracle", "failed")]
    assert cell(records) == "fail: oracle"


def test_only_skipped_reads_not_run_with_the_reason() -> None:
    assert cell([record("top_k", "vllm", "hook", "skipped", "vllm is not installed")]) == (
        "not run: vllm is not installed"
    )


def test_every_catalogue_processor_gets_a_row_and_strict_names_empty_cells() -> None:
    names = catalogue_classes()
    assert {"top_k", "json_schema", "repetition_penalty"} <= set(names)
    records = [record(spec, "mlx", "hook", "passed") for spec in names]
    page = render(records, ["mlx"], strict=True)
    assert all(f"| `{class_name}` | pass (hook) |" in page for class_name in names.values())
    with pytest.raises(ValueError, match="TopK on vllm"):
        render(records, ["mlx", "vllm"], strict=True)
    assert "**no test yet**" in render(records, ["mlx", "vllm"], strict=False)
