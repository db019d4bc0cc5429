"""Comparing truncated logits where float rounding may move a boundary.

Truncations that keep a token by comparing its probability (a softmax, its running sum,
the row's entropy) with a threshold may keep a token within the last bits of that
threshold on one path and cut it on another: CUDA's kernels against the CPU's (measured
on an H100, 2026-11-26: EtaCutoff stacked, one token of one row), and the accelerator
branch (a softmax) against the CPU's (an exact row sum, so that its candidates path
agrees bit for bit). For them at most one token a row may differ in being kept, and every
token kept on both must agree; such flips are counted, never hidden.
"""

from __future__ import annotations

import torch

BOUNDARY_TYPES = frozenset(
    {"top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_n_sigma", "top_h"}
)


def without_boundary_flips(
    actual: torch.Tensor, expected: torch.Tensor, label: str
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``actual`` and ``expected`` without the tokens kept (finite) in only one of them,
    flattened when any is, and how many there were; at most one a row."""
    flipped = torch.isfinite(actual) != torch.isfinite(expected)
    count = int(flipped.sum())
    if not count:
        return actual, expected, 0
    assert int(flipped.sum(dim=-1).max()) <= 1, f"{label}: more than one token a row flipped"
    keep = ~flipped
    return actual[keep], expected[keep], count


def assert_same_logits(
    actual: torch.Tensor,
    expected: torch.Tensor,
    label: str,
    *,
    boundary: bool = False,
    rtol: float = 0.0,
    atol: float = 0.0,
) -> int:
    """``actual`` equals ``expected`` (within ``rtol`` / ``atol``; NaN equal to NaN), but
    for boundary flips when ``boundary``; returns how many tokens flipped."""
    flips = 0
    if boundary:
        actual, expected, flips = without_boundary_flips(actual, expected, label)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True, msg=label)
    return flips
