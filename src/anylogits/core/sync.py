"""When a processor may read a tensor's value on the host.

``.item()``, ``.tolist()``, ``bool(tensor)``, ``.cpu()`` and ``nonzero`` wait for the
device: on CUDA each one stalls the stream (vLLM's GPU runner queues the next step's
work behind it). On the CPU the same read is free, and it often lets a processor skip
work (stop growing a ``topk`` once every row's nucleus is found). So stateless hot paths
ask :func:`host_sync_allowed` before such a read and, when it says no, take a branch
whose control flow does not depend on tensor values.

:func:`forbid_host_sync` makes every tensor take the accelerator's branch: the tests run
the catalogue under it on the CPU and count the reads (``tests/test_host_sync.py``), so
the branch a GPU takes is the one proven sync-free.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_FORBIDDEN: ContextVar[bool] = ContextVar("anylogits_host_sync_forbidden", default=False)


def host_sync_allowed(tensor: torch.Tensor) -> bool:
    """Whether reading ``tensor``'s values on the host is free: CPU tensors, unless
    :func:`forbid_host_sync` is active."""
    return tensor.device.type == "cpu" and not _FORBIDDEN.get()


@contextmanager
def forbid_host_sync() -> Iterator[None]:
    """Within this block, :func:`host_sync_allowed` is ``False`` for every tensor."""
    token = _FORBIDDEN.set(True)
    try:
        yield
    finally:
        _FORBIDDEN.reset(token)
