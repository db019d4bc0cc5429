"""What the oracle comparisons share: the dtypes they draw, their hypothesis settings,
histories as engines pass them, and the bit-for-bit check that names the first cells that
differ."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import HealthCheck, settings

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
NEG_INF = float("-inf")


def dtype_id(dtype: torch.dtype) -> str:
    """A dtype as a test id: ``float16`` rather than ``torch.float16``."""
    return str(dtype).removeprefix("torch.")


def oracle_settings(max_examples: int) -> settings:
    """hypothesis settings for oracle comparisons: no deadline (oracles are slow on large
    vocabularies, which are also the large draws the health checks would refuse)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def assert_identical(logits: torch.Tensor, ours: torch.Tensor, oracle: torch.Tensor) -> None:
    """``ours`` equals ``oracle`` bit for bit, in the input's dtype; otherwise the error
    lists up to five differing cells as (row, column, input, ours, oracle)."""
    assert ours.dtype == oracle.dtype == logits.dtype, (logits.dtype, ours.dtype, oracle.dtype)
    if torch.equal(ours, oracle):
        return
    where = (ours != oracle).nonzero()[:5].tolist()
    details = [
        (r, c, logits[r, c].item(), ours[r, c].item(), oracle[r, c].item()) for r, c in where
    ]
    raise AssertionError(f"ours != oracle at (row, col, input, ours, oracle): {details}")


def right_aligned(rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, L)`` history, each row in its last columns (padding 0 on the left), and the
    rows' lengths."""
    width = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    for index, row in enumerate(rows):
        if row:
            ids[index, width - len(row) :] = torch.tensor(row)
    return ids, torch.tensor([len(row) for row in rows])
