"""An emulated accelerator on the CPU: real values, and every transfer counted.

On the CPU, host and device are one memory: a copy to the device or a read of a device
value costs nothing, so no test can see one. On CUDA each matters:

- ``t.to(device)`` from pageable host memory, ``torch.tensor(values, device=device)`` and
  indexing a device tensor with a host tensor are a copy plus a stream synchronize: the
  host waits for every kernel queued before it (vLLM's async scheduling then stalls);
  ``non_blocking=True`` from pinned memory is not.
- ``.item()``, ``.tolist()``, ``bool(t)``, ``.cpu()``, ``nonzero``, boolean-mask indexing,
  ``unique``, ``masked_select``, and ``isin`` against many values (it sorts) read device
  values on the host: a synchronize each.

Inside :class:`EmulatedDevice`, tensors made on its :data:`DEVICE` (by a factory,
``torch.tensor``, ``.to``) are :class:`DeviceTensor` s: they report that device (not the
CPU, so every processor takes its accelerator branch) and carry their values in a CPU
tensor, so every computation gives the CPU's bits while :class:`Transfers` counts, by
kind, each host->device copy (blocking or not) and each device->host read. A host tensor
of more than one element mixed into an operation on device tensors is counted too: on
CUDA it is either an implicit blocking copy (indices) or a device-mismatch error. Plain
``meta`` tensors show copies as well, but carry no values: a processor whose state needs
a value stops there, and no result can be compared.

``tests/test_cuda.py`` checks the same steps on a real GPU under
``torch.cuda.set_sync_debug_mode("error")``; what it found that this emulation missed
(``isin``'s sorting path) is counted here since.

Example:
    >>> import torch
    >>> with EmulatedDevice() as device:
    ...     logits = torch.zeros(2, 4, device=device.device)
    ...     with device.counting() as transfers:
    ...         _ = logits + torch.tensor([1.0, 2.0, 3.0, 4.0]).to(device.device)
    ...         _ = logits.sum().item()
    >>> dict(transfers.kinds)
    {'h2d blocking': 1, 'd2h item': 1}

The modules: :mod:`.tensor` (:data:`DEVICE`, :class:`DeviceTensor`, the helpers that
place and read values), :mod:`.ops` (which ATen operations read the device, check
indices or launch a kernel: classify a new operation there), :mod:`.transfers` (the
counter), :mod:`.dispatch` (the torch modes that run operations and count transfers) and
:mod:`.device` (:class:`EmulatedDevice` itself).
"""

from __future__ import annotations

from test_support.emulated_device.device import EmulatedDevice
from test_support.emulated_device.ops import NO_LAUNCH, UNCLASSIFIED
from test_support.emulated_device.tensor import DEVICE, DeviceTensor, host_values, on_device
from test_support.emulated_device.transfers import ASYNC_D2H, EVENT_WAIT, Transfers

__all__ = [
    "ASYNC_D2H",
    "DEVICE",
    "EVENT_WAIT",
    "NO_LAUNCH",
    "UNCLASSIFIED",
    "DeviceTensor",
    "EmulatedDevice",
    "Transfers",
    "host_values",
    "on_device",
]
