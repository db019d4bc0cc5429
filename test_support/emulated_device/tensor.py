"""The emulated device's tensors: :data:`DEVICE`, :class:`DeviceTensor` (values in a CPU
tensor) and the helpers that place, unwrap and read them without counting."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_map

if TYPE_CHECKING:
    from test_support.emulated_device.device import EmulatedDevice

# The device the emulated tensors report. ``meta``: PyTorch's own device without memory,
# which every C++ path accepts (a ``cuda`` device fails in C++ device guards on a build
# without CUDA). Code that tests ``device.type != "cpu"`` takes its accelerator branch.
DEVICE = torch.device("meta")


class DeviceTensor(torch.Tensor):
    """A tensor on the emulated device; its values live in :attr:`inner` (CPU)."""

    inner: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> DeviceTensor:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.size(),
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=DEVICE,
            requires_grad=False,
        )
        wrapper.inner = inner
        return wrapper

    def __repr__(self) -> str:
        # Printing reads every value shown: a read on a real device.
        _count_on_active("d2h __repr__")
        return f"DeviceTensor({self.inner!r})"

    def __str__(self) -> str:
        _count_on_active("d2h __str__")
        return f"DeviceTensor({self.inner})"

    def __format__(self, spec: str) -> str:
        _count_on_active("d2h __format__")
        return self.inner.__format__(spec)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise RuntimeError(
            f"{func} ran on an emulated device tensor outside EmulatedDevice: keep every use "
            "inside the block"
        )


# The emulators active now, innermost last.
_ACTIVE: list[EmulatedDevice] = []


def _count_on_active(kind: str) -> None:
    for emulator in _ACTIVE:
        emulator.count(kind, _caller())


def _is_device(value: Any) -> bool:
    return isinstance(value, DeviceTensor)


def _is_emulated(device: Any) -> bool:
    return device is not None and not isinstance(device, int) and torch.device(device) == DEVICE


def _placed(host: torch.Tensor) -> DeviceTensor:
    return DeviceTensor(host if host.is_contiguous() else host.contiguous())


def _unwrap(value: Any) -> Any:
    return value.inner if isinstance(value, DeviceTensor) else value


def _flat(args: Any, kwargs: Any) -> list[Any]:
    flat: list[Any] = []
    tree_map(flat.append, (args, kwargs))
    return flat


def _in_this_package(filename: str) -> bool:
    return os.path.basename(os.path.dirname(filename)) == "emulated_device"


def _caller() -> str:
    """The first frame outside torch and this package: where a transfer was asked for."""
    import sys

    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if "/torch/" not in filename and not _in_this_package(filename):
            return (
                f"{filename.rsplit('/', 3)[-1] if '/' in filename else filename}:{frame.f_lineno}"
            )
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def host_values(tensor: torch.Tensor) -> torch.Tensor:
    """A device tensor's values as a CPU tensor, without counting a read (for tests that
    compare results after the counted block)."""
    return tensor.inner if isinstance(tensor, DeviceTensor) else tensor


def on_device(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor's values as an emulated device tensor, without counting a copy (for
    inputs an engine already holds on the device)."""
    return DeviceTensor(tensor.clone())
