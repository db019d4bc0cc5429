"""The torch modes that run operations on the emulated device's values (on the CPU) and
count each transfer as CUDA would make it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from test_support.emulated_device.ops import (
    _CHECKED_INDICES,
    _HOST_CONVERSIONS,
    _HOST_READS,
    _INDEXING,
    _KERNEL_SYNCS,
    UNCLASSIFIED,
    _classified,
)
from test_support.emulated_device.tensor import (
    DeviceTensor,
    _caller,
    _flat,
    _is_device,
    _is_emulated,
    _placed,
    _unwrap,
)
from test_support.emulated_device.transfers import ASYNC_D2H

if TYPE_CHECKING:
    from test_support.emulated_device.device import EmulatedDevice


class _Dispatch(TorchDispatchMode):
    """Runs every ATen operation on the CPU values of emulated device tensors."""

    def __init__(self, owner: EmulatedDevice) -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        name = func.overloadpacket.__name__
        count = self.owner.count
        device_args = [a for a in _flat(args, kwargs) if _is_device(a)]
        on_device = bool(device_args) or _is_emulated(kwargs.get("device"))

        if on_device:
            self.owner.count_op(name)
        if on_device and name in _CHECKED_INDICES:
            _check_indices(name, args)
        if name == "_to_copy":
            source = args[0]
            target = kwargs.get("device")
            if _is_device(source) and target is not None and not _is_emulated(target):
                count("d2h cpu", _caller(), source)
                kwargs["device"] = torch.device("cpu")
                return func(source.inner, **kwargs)
            if not _is_device(source) and _is_emulated(target):
                non_blocking = kwargs.get("non_blocking", False)
                count(self.owner.h2d_kind(source, non_blocking), _caller())
        if name == "copy_" and len(args) >= 2:
            target, source = args[0], args[1]
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            if _is_device(target) and isinstance(source, torch.Tensor) and not _is_device(source):
                count(self.owner.h2d_kind(source, non_blocking), _caller())
            elif _is_device(source) and not _is_device(target):
                if non_blocking and self.owner.is_pinned(target):
                    count(ASYNC_D2H, _caller(), source)
                else:
                    count("d2h copy_", _caller(), source)
        elif on_device and name in _HOST_READS and _HOST_READS[name] is not None:
            count(f"d2h {_HOST_READS[name]}", _caller(), device_args[0] if device_args else None)
        elif on_device and name in _KERNEL_SYNCS and _KERNEL_SYNCS[name](args, kwargs):
            count(f"d2h inside {name}", _caller())
        elif on_device and name in _INDEXING and len(args) > 1:
            for index in args[1]:
                if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
                    count("d2h boolean-mask index", _caller())
        elif name == "repeat_interleave" and on_device and kwargs.get("output_size") is None:
            count("d2h repeat_interleave", _caller())
        elif name == "isin" and on_device and _isin_sorts(args):
            count("d2h isin (sorting path)", _caller())
        if on_device and not _classified(name):
            count(f"{UNCLASSIFIED} {name}", _caller())
        if device_args and name not in ("_to_copy", "copy_"):
            for value in _flat(args, kwargs):
                if (
                    isinstance(value, torch.Tensor)
                    and not _is_device(value)
                    and value.device.type == "cpu"
                    and value.dim() > 0
                ):
                    if name not in _INDEXING:
                        # CUDA takes a host tensor only as a 0-dim scalar argument.
                        raise RuntimeError(
                            f"Expected all tensors to be on the same device: {name} got a "
                            f"host tensor of shape {tuple(value.shape)} beside device tensors "
                            f"(CUDA refuses it; at {_caller()})"
                        )
                    count(f"h2d implicit {name}", _caller())

        if _is_emulated(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
        unwrapped_args = tree_map(_unwrap, args)
        result = func(*unwrapped_args, **tree_map(_unwrap, kwargs))
        # In-place and out= operations return an argument: give back the wrapper itself.
        originals = {id(a.inner): a for a in device_args}
        wrap_output = on_device

        def rewrap(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and not _is_device(value):
                original = originals.get(id(value))
                if original is not None:
                    return original
                if wrap_output and value.device.type == "cpu":
                    return DeviceTensor(value)
            return value

        return tree_map(rewrap, result)


class _Functions(TorchFunctionMode):
    """Host->device conversions ATen does not show a dispatch mode: ``torch.tensor`` with
    a device copies inside C++."""

    def __init__(self, owner: EmulatedDevice) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in ("tensor", "as_tensor", "asarray") and _is_emulated(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
            self.owner.count("h2d hidden", _caller())
            return _placed(func(*args, **kwargs))
        if name == "to" and args and isinstance(args[0], torch.Tensor):
            source = args[0]
            target, non_blocking, rest = _to_arguments(name, args[1:], kwargs)
            if not _is_device(source) and target is not None and _is_emulated(target):
                self.owner.count(self.owner.h2d_kind(source, non_blocking), _caller())
                dtype = rest.get("dtype")
                host = source.to(dtype) if dtype is not None else source.clone()
                return _placed(host)
        if name in _HOST_CONVERSIONS and args and _is_device(args[0]):
            self.owner.count(f"d2h {name}", _caller(), args[0])
            return func(args[0].inner, *args[1:], **kwargs)
        if name in ("__repr__", "__str__", "__format__") and args and _is_device(args[0]):
            # Printing a device tensor reads every value it shows.
            self.owner.count(f"d2h {name}", _caller())
            return func(args[0].inner, *args[1:], **kwargs)
        if kwargs.get("pin_memory") and not _is_emulated(kwargs.get("device")):
            kwargs["pin_memory"] = False
            return self.owner.pin(func(*args, **kwargs))
        return func(*args, **kwargs)


def _check_indices(name: str, args: Sequence[Any]) -> None:
    """Raise where CUDA's kernel would assert: an index outside ``[0, size)``."""
    position, dim_position = _CHECKED_INDICES[name]
    if len(args) <= position:
        return
    index, source = _unwrap(args[position]), _unwrap(args[0])
    if not isinstance(index, torch.Tensor) or index.numel() == 0:
        return
    if dim_position is None:  # embedding: rows of the weight
        size = source.shape[0]
    else:
        size = source.shape[args[dim_position]] if source.dim() else 1
    low, high = int(index.min()), int(index.max())
    if low < 0 or high >= size:
        raise RuntimeError(
            f"device-side assert: {name} with index {low if low < 0 else high} outside "
            f"[0, {size}) (on CUDA this ends the context: the engine and every request)"
        )


def _isin_sorts(args: Sequence[Any]) -> bool:
    """Whether ``torch.isin(elements, test_elements)`` takes its sorting path, which on
    CUDA reads the device (``unique``): numpy's rule, which ATen follows. Seen on an
    H100: ``isin`` of 3 elements in 32 synchronized 3 times, of 3 in 1 not at all."""
    elements, test_elements = args[0], args[1]
    if not isinstance(test_elements, torch.Tensor) or not isinstance(elements, torch.Tensor):
        return False
    return test_elements.numel() >= int(10.0 * elements.numel() ** 0.145)


def _to_arguments(
    name: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[Any, bool, dict[str, Any]]:
    """``(device, non_blocking, other options)`` of a ``Tensor.to`` call."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    non_blocking = bool(kwargs.get("non_blocking", False))
    positional = list(args)
    for value in positional:
        if isinstance(value, (str, torch.device)):
            device = value
        elif isinstance(value, torch.dtype):
            dtype = value
        elif isinstance(value, torch.Tensor):
            device, dtype = value.device, value.dtype
        elif isinstance(value, bool):
            non_blocking = value
    return device, non_blocking, {"dtype": dtype}
