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
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

# The device the emulated tensors report. ``meta``: PyTorch's own device without memory,
# which every C++ path accepts (a ``cuda`` device fails in C++ device guards on a build
# without CUDA). Code that tests ``device.type != "cpu"`` takes its accelerator branch.
DEVICE = torch.device("meta")

# Operations on device tensors whose result the host must wait for (their output size
# or value depends on device data).
_HOST_READS = {
    "_local_scalar_dense": "item",
    "is_nonzero": "item",
    "equal": "item",
    "nonzero": "nonzero",
    "masked_select": "masked_select",
    "_unique2": "unique",
    "unique_dim": "unique",
    "unique_consecutive": "unique",
    "_unique": "unique",
    "bincount": "bincount",
    "histc": None,  # fixed size: not a read
}


# Tensor methods that hand device values to Python.
_HOST_CONVERSIONS = frozenset({"tolist", "numpy", "__array__", "__dlpack__"})


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

    def __repr__(self) -> str:  # reading every value: only for debugging
        return f"DeviceTensor({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise RuntimeError(
            f"{func} ran on an emulated device tensor outside EmulatedDevice: keep every use "
            "inside the block"
        )


def _is_device(value: Any) -> bool:
    return isinstance(value, DeviceTensor)


def _is_emulated(device: Any) -> bool:
    return device is not None and not isinstance(device, int) and torch.device(device) == DEVICE


class Transfers:
    """Counts, by kind, the transfers made while :meth:`EmulatedDevice.counting` is active.

    Kinds: ``h2d blocking`` / ``h2d non_blocking`` (explicit copies to the device),
    ``h2d hidden`` (``torch.tensor(values, device=device)``: built on the host and copied,
    blocking), ``h2d implicit <op>`` (a host tensor of more than one element mixed into a
    device operation), ``d2h <kind>`` (a device value read on the host).
    """

    def __init__(self) -> None:
        self.kinds: collections.Counter[str] = collections.Counter()
        self.where: collections.defaultdict[str, list[str]] = collections.defaultdict(list)

    def add(self, kind: str, detail: str = "") -> None:
        self.kinds[kind] += 1
        if detail and len(self.where[kind]) < 8:
            self.where[kind].append(detail)

    @property
    def blocking_copies(self) -> int:
        """Host->device copies that block the host."""
        return sum(
            n for kind, n in self.kinds.items() if kind.startswith("h2d") and "non_" not in kind
        )

    @property
    def device_reads(self) -> int:
        """Device values read on the host."""
        return sum(n for kind, n in self.kinds.items() if kind.startswith("d2h"))

    def summary(self) -> str:
        return ", ".join(f"{kind} x{count}" for kind, count in sorted(self.kinds.items()))


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

        if name == "_to_copy":
            source = args[0]
            target = kwargs.get("device")
            if _is_device(source) and target is not None and not _is_emulated(target):
                count("d2h cpu", _caller())
                kwargs["device"] = torch.device("cpu")
                return func(source.inner, **kwargs)
            if not _is_device(source) and _is_emulated(target):
                blocking = not kwargs.get("non_blocking", False)
                count("h2d blocking" if blocking else "h2d non_blocking", _caller())
        if name == "copy_" and len(args) >= 2:
            target, source = args[0], args[1]
            if _is_device(target) and isinstance(source, torch.Tensor) and not _is_device(source):
                blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
                count("h2d blocking" if blocking else "h2d non_blocking", _caller())
            elif _is_device(source) and not _is_device(target):
                count("d2h copy_", _caller())
        elif on_device and name in _HOST_READS and _HOST_READS[name] is not None:
            count(f"d2h {_HOST_READS[name]}", _caller())
        elif on_device and name in ("index", "index_put", "_index_put_impl") and len(args) > 1:
            for index in args[1]:
                if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
                    count("d2h boolean-mask index", _caller())
        elif name == "repeat_interleave" and on_device and kwargs.get("output_size") is None:
            count("d2h repeat_interleave", _caller())
        elif name == "isin" and on_device and _isin_sorts(args):
            count("d2h isin (sorting path)", _caller())
        if device_args and name not in ("_to_copy", "copy_"):
            for value in _flat(args, kwargs):
                if (
                    isinstance(value, torch.Tensor)
                    and not _is_device(value)
                    and value.device.type == "cpu"
                    and value.numel() > 1
                ):
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
                self.owner.count("h2d non_blocking" if non_blocking else "h2d blocking", _caller())
                dtype = rest.get("dtype")
                host = source.to(dtype) if dtype is not None else source.clone()
                return _placed(host)
        if name in _HOST_CONVERSIONS and args and _is_device(args[0]):
            self.owner.count(f"d2h {name}", _caller())
            return func(args[0].inner, *args[1:], **kwargs)
        if name == "pin_memory" and args and isinstance(args[0], torch.Tensor):
            # No pinned memory without a device: the copy that follows is what counts.
            return args[0]
        if name == "is_pinned":
            return False
        return func(*args, **kwargs)


def _isin_sorts(args: Sequence[Any]) -> bool:
    """Whether ``torch.isin(elements, test_elements)`` takes its sorting path, which on
    CUDA reads the device (``unique``): numpy's rule, which ATen follows. Seen on an
    H100: ``isin`` of 3 elements in 32 synchronized 3 times, of 3 in 1 not at all."""
    elements, test_elements = args[0], args[1]
    if not isinstance(test_elements, torch.Tensor) or not isinstance(elements, torch.Tensor):
        return False
    return test_elements.numel() >= int(10.0 * elements.numel() ** 0.145)


def _placed(host: torch.Tensor) -> DeviceTensor:
    return DeviceTensor(host if host.is_contiguous() else host.contiguous())


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


def _unwrap(value: Any) -> Any:
    return value.inner if isinstance(value, DeviceTensor) else value


def _flat(args: Any, kwargs: Any) -> list[Any]:
    flat: list[Any] = []
    tree_map(flat.append, (args, kwargs))
    return flat


def _caller() -> str:
    """The first frame outside torch and this module: where a transfer was asked for."""
    import sys

    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if "/torch/" not in filename and not filename.endswith("emulated_device.py"):
            return (
                f"{filename.rsplit('/', 3)[-1] if '/' in filename else filename}:{frame.f_lineno}"
            )
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


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

    def count(self, kind: str, detail: str = "") -> None:
        for counter in self._counters:
            counter.add(kind, detail)

    @contextlib.contextmanager
    def counting(self) -> Iterator[Transfers]:
        counter = Transfers()
        self._counters.append(counter)
        try:
            yield counter
        finally:
            self._counters.remove(counter)

    def __enter__(self) -> EmulatedDevice:
        stack = contextlib.ExitStack()
        stack.enter_context(_Dispatch(self))
        stack.enter_context(_Functions(self))
        self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stack is not None
        self._stack.close()
        self._stack = None


def host_values(tensor: torch.Tensor) -> torch.Tensor:
    """A device tensor's values as a CPU tensor, without counting a read (for tests that
    compare results after the counted block)."""
    return tensor.inner if isinstance(tensor, DeviceTensor) else tensor


def on_device(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor's values as an emulated device tensor, without counting a copy (for
    inputs an engine already holds on the device)."""
    return DeviceTensor(tensor.clone())


__all__ = [
    "DEVICE",
    "DeviceTensor",
    "EmulatedDevice",
    "Transfers",
    "host_values",
    "on_device",
]
