""":class:`EmulatedDevice`: while active, tensors on :data:`~.tensor.DEVICE` are emulated
device tensors, and :meth:`EmulatedDevice.counting` counts the transfers of a block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from test_support.emulated_device.dispatch import _Dispatch, _Functions
from test_support.emulated_device.tensor import (
    _ACTIVE,
    DEVICE,
    _caller,
    _is_device,
    _is_emulated,
    _unwrap,
)
from test_support.emulated_device.transfers import EVENT_WAIT, Transfers


class EmulatedDevice:
    """While active: tensors on :data:`DEVICE` are :class:`DeviceTensor` s computed on the
    CPU.

    Use :attr:`device` as the device; :meth:`counting` counts the transfers of a block.
    ``torch.cuda.is_available()`` stays ``False`` (no memory can be pinned), so code that
    pins when it can takes its unpinned branch; its ``non_blocking`` flag still shows.
    """

    device = DEVICE

    def __init__(self) -> None:
        self._counters: list[Transfers] = []
        self._stack: contextlib.ExitStack | None = None
        # Storages of pinned host tensors, kept alive so that an address is never reused.
        self._pinned: dict[int, torch.Tensor] = {}

    def count(self, kind: str, detail: str = "", read: Any = None) -> None:
        """Count a transfer of ``kind``; ``read``: the device tensor the host reads."""
        nbytes = _unwrap(read).nbytes if isinstance(read, torch.Tensor) else 0
        for counter in self._counters:
            counter.add(kind, detail, nbytes)

    def count_op(self, name: str) -> None:
        for counter in self._counters:
            counter.ops[name] += 1

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``, marked as pinned host memory."""
        self._pinned[tensor.untyped_storage().data_ptr()] = tensor
        return tensor

    def is_pinned(self, tensor: Any) -> bool:
        return (
            isinstance(tensor, torch.Tensor)
            and not _is_device(tensor)
            and tensor.untyped_storage().data_ptr() in self._pinned
        )

    def h2d_kind(self, source: torch.Tensor, non_blocking: bool) -> str:
        """How CUDA runs a copy of host ``source``: without blocking only from pinned
        memory (from pageable memory ``non_blocking`` still waits for the stream)."""
        if non_blocking and self.is_pinned(source):
            return "h2d non_blocking"
        return "h2d blocking (pageable memory)" if non_blocking else "h2d blocking"

    @contextlib.contextmanager
    def counting(self) -> Iterator[Transfers]:
        counter = Transfers()
        self._counters.append(counter)
        try:
            yield counter
        finally:
            self._counters.remove(counter)

    def __enter__(self) -> EmulatedDevice:
        from anylogits.core import transfer

        stack = contextlib.ExitStack()
        # As on a CUDA machine: host memory can be pinned, events can be recorded.
        stack.enter_context(mock.patch.object(transfer, "pinning_available", lambda: True))
        stack.enter_context(
            mock.patch.object(transfer, "record_event", lambda device: _Event(self, device))
        )
        # CUDA's pinned allocator: a pinned copy, known as pinned by the copies that read
        # it. Patched on the class, not caught as a torch function: vLLM's CPU worker
        # replaces Tensor.pin_memory process-wide with one that returns the tensor.
        stack.enter_context(
            mock.patch.object(
                torch.Tensor, "pin_memory", lambda tensor, *_: self.pin(tensor.clone())
            )
        )
        stack.enter_context(
            mock.patch.object(torch.Tensor, "is_pinned", lambda tensor, *_: self.is_pinned(tensor))
        )
        stack.enter_context(_Dispatch(self))
        stack.enter_context(_Functions(self))
        _ACTIVE.append(self)
        stack.callback(_ACTIVE.remove, self)
        self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stack is not None
        self._stack.close()
        self._stack = None


class _Event:
    """A CUDA event on the emulated device: waiting for it is counted (the host waits
    for what was queued before it was recorded)."""

    def __init__(self, owner: EmulatedDevice, device: torch.device) -> None:
        if not _is_emulated(device):
            raise RuntimeError(f"an event on {device} inside EmulatedDevice")
        self.owner = owner

    def synchronize(self) -> None:
        self.owner.count(EVENT_WAIT, _caller())

    def query(self) -> bool:
        return True
