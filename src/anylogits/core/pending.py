"""Logits an engine is still computing, for work that does not need them."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch


class PendingLogits(NamedTuple):
    """``(rows, V)`` logits not computed yet, and the function that waits for them.

    MLX evaluates lazily: a step's logits exist once its forward has run, on the GPU (or
    MLX's own CPU thread) while Python goes on. Given these instead of the logits, a
    pipeline first does what needs only the rows' tokens and states (a grammar's mask,
    :meth:`~anylogits.core.fast_paths.FastPaths.prepare`), so that work overlaps the
    forward, and then waits.

    Args:
        rows: the logits' rows.
        device: the device :meth:`wait` returns them on.
        wait: returns the ``(rows, V)`` logits, waiting for them: once, and again by a
            server's request pipeline whose processors failed, to end its sequence.
    """

    rows: int
    device: torch.device
    wait: Callable[[], torch.Tensor]
