"""Host data onto the logits' device without making the host wait.

On CUDA, ``tensor.to(device)`` from ordinary (pageable) host memory is a copy followed by
a stream synchronize: the host waits for every kernel queued before it, so an engine that
prepares step ``n + 1`` while step ``n`` runs (vLLM's async scheduling) stalls. vLLM
stages per-request data in pinned host buffers and copies them with ``non_blocking=True``.
Two kinds of host data reach a processor:

- constants (a processor's parameters, token ids it bans): :class:`DeviceCopies` makes
  them once per device and keeps them there;
- per-step data (token histories, lengths, positions held in host states):
  :func:`to_device` copies them through pinned memory, ``non_blocking``. PyTorch's pinned
  allocator keeps the pinned block until the copy that reads it has run, so the host
  tensor may be dropped at once.

The other way, device values a host state needs (a grammar's new tokens) are read by a
:class:`HostCopy`: started early (before the engine queues the forward), copied into
pinned memory without blocking, waited for through an event when the values are needed.
The host then waits for the copy, not for the work queued after it.

``test_support.emulated_device`` counts every copy and read on an emulated ``cuda``
device; ``tests/test_device_copies.py`` holds the catalogue to zero blocking copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def pinning_available() -> bool:
    """Whether host memory can be pinned here (a CUDA device is present)."""
    return torch.cuda.is_available()


def record_event(device: torch.device) -> Any:
    """An event recorded on ``device``'s current stream (``None`` on the CPU, where every
    operation has run when it returns)."""
    if device.type == "cpu":
        return None
    event = torch.Event(device=device)
    event.record()
    return event


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``: as it is when it is there already, else copied without
    blocking the host (through pinned memory when the source is on the host)."""
    if tensor.device == device:
        return tensor
    if tensor.device.type == "cpu" and device.type != "cpu" and pinning_available():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def host_tensor_to(
    values: Sequence[Any], device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Python values (per-step data from host states) as a tensor on ``device``, copied
    without blocking; ``torch.tensor(values, device=device)`` would block."""
    return to_device(torch.tensor(values, dtype=dtype), device)


class DeviceCopies:
    """A host tensor and its copy on each device (and dtype) asked for, each made once.

    Args:
        host: the tensor, on the host.

    Example:
        >>> import torch
        >>> ks = DeviceCopies(torch.tensor([5, 50]))
        >>> ks.on(torch.device("cpu")) is ks.on(torch.device("cpu"))
        True
        >>> ks.on(torch.device("cpu"), torch.float64)
        tensor([ 5., 50.], dtype=torch.float64)
    """

    __slots__ = ("_copies", "host")

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host
        self._copies: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def on(self, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor on ``device`` (in ``dtype``, converted on the host first)."""
        key = (device, dtype or self.host.dtype)
        copy = self._copies.get(key)
        if copy is None:
            source = self.host if dtype is None else self.host.to(dtype)
            copy = self._copies[key] = to_device(source, device)
        return copy

    def __getstate__(self) -> dict[str, Any]:
        # Device copies stay in the process that made them.
        return {"host": self.host}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.host = state["host"]
        self._copies = {}


class HostCopy:
    """Device values copied to the host without blocking, read when :meth:`wait` is called.

    The copy is queued on the device's stream now, into pinned memory, with an event
    behind it; :meth:`wait` blocks only until that event, so work queued on the stream
    after the copy (the next forward) runs on while the host reads.

    Args:
        values: the tensor to read, on any device.

    Example:
        >>> import torch
        >>> HostCopy(torch.tensor([3, 4])).wait()
        tensor([3, 4])
    """

    __slots__ = ("_event", "_host")

    def __init__(self, values: torch.Tensor) -> None:
        if values.device.type == "cpu":
            self._host, self._event = values, None
            return
        self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=pinning_available())
        self._host.copy_(values, non_blocking=True)
        self._event = record_event(values.device)

    def wait(self) -> torch.Tensor:
        """The values on the host, once the copy has run."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._host
