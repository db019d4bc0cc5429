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
from unittest import mock

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


# Operations whose CUDA kernels check every index on the device: an index out of range
# (a negative id included) is a device-side assert, which ends the CUDA context (the
# engine and every request), where the CPU would raise or wrap. The index argument's
# position and the dimension it indexes.
_CHECKED_INDICES = {
    "gather": (2, 1),
    "scatter": (2, 1),
    "scatter_": (2, 1),
    "scatter_add": (2, 1),
    "scatter_add_": (2, 1),
    "scatter_reduce": (2, 1),
    "scatter_reduce_": (2, 1),
    "index_select": (2, 1),
    "index_add": (2, 1),
    "index_add_": (2, 1),
    "index_copy": (2, 1),
    "index_copy_": (2, 1),
    "index_fill": (2, 1),
    "index_fill_": (2, 1),
    "embedding": (1, None),
}


# Operations whose CUDA kernels read device values on the host inside ATen (no Python
# read shows it), with the condition under which they do (PyTorch's CUDA sources:
# aten/src/ATen/native/cuda/).
_KERNEL_SYNCS = {
    # Indexing.cu: masked_fill_ with a Tensor value calls value.item().
    # (a host 0-dim value is read on the host, for free).
    "masked_fill": lambda args, kwargs: len(args) > 2 and _is_device(args[2]),
    "masked_fill_": lambda args, kwargs: len(args) > 2 and _is_device(args[2]),
    # MultinomialKernel.cu: checks the probabilities on the host (a read).
    "multinomial": lambda args, kwargs: True,
    # allclose reduces to a bool on the host.
    "allclose": lambda args, kwargs: True,
    # SummaryOps.cu: histc with min == max reads the input's min and max.
    "histc": lambda args, kwargs: (
        (args[3] if len(args) > 3 else kwargs.get("max", 0))
        == (args[2] if len(args) > 2 else kwargs.get("min", 0))
    ),
}

# Operations that index with tensors: a host index tensor is copied to the device
# (blocking) rather than refused.
_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl", "_index_put_impl_"})

# Operations that launch no kernel: views, metadata, allocations without a fill.
NO_LAUNCH = frozenset(
    {
        "_reshape_alias",
        "_unsafe_view",
        "alias",
        "as_strided",
        "detach",
        "empty",
        "empty_like",
        "empty_strided",
        "expand",
        "lift_fresh",
        "narrow",
        "permute",
        "select",
        "slice",
        "split",
        "squeeze",
        "t",
        "transpose",
        "unbind",
        "unsqueeze",
        "view",
    }
)

# Operations whose CUDA kernels run without the host reading any device value (their
# output sizes follow from their input sizes and arguments). An operation in none of
# these tables fails the accelerator level until it is classified.
_FREE = frozenset(
    [
        "abs",
        "add",
        "add_",
        "addmm",
        "alias",
        "all",
        "amax",
        "amin",
        "aminmax",
        "any",
        "arange",
        "argmax",
        "argmin",
        "as_strided",
        "bitwise_and",
        "bitwise_and_",
        "bitwise_left_shift",
        "bitwise_not",
        "bitwise_or",
        "bitwise_or_",
        "bitwise_right_shift",
        "bitwise_xor",
        "bmm",
        "cat",
        "ceil",
        "clamp",
        "clamp_",
        "clamp_max",
        "clamp_min",
        "clone",
        "copy_",
        "count_nonzero",
        "cumprod",
        "cumsum",
        "cumsum_",
        "detach",
        "diff",
        "div",
        "div_",
        "empty",
        "empty_like",
        "empty_strided",
        "eq",
        "exp",
        "exp_",
        "expand",
        "fill",
        "fill_",
        "flip",
        "floor",
        "floor_divide",
        "full",
        "full_like",
        "gather",
        "ge",
        "gt",
        "index",
        "index_add",
        "index_add_",
        "index_copy",
        "index_copy_",
        "index_fill",
        "index_fill_",
        "index_put",
        "index_put_",
        "index_select",
        "isclose",
        "isfinite",
        "isinf",
        "isnan",
        "le",
        "lift_fresh",
        "log",
        "log_",
        "log_softmax",
        "logical_and",
        "logical_not",
        "logical_or",
        "logical_xor",
        "logsumexp",
        "lt",
        "masked_fill",
        "masked_fill_",
        "max",
        "maximum",
        "mean",
        "min",
        "minimum",
        "mm",
        "mul",
        "mul_",
        "ne",
        "neg",
        "new_empty",
        "new_full",
        "new_ones",
        "new_zeros",
        "ones",
        "ones_like",
        "permute",
        "pow",
        "remainder",
        "reshape",
        "resize_",
        "rsub",
        "scalar_tensor",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "scatter_reduce",
        "scatter_reduce_",
        "select",
        "select_scatter",
        "sigmoid",
        "sign",
        "slice",
        "slice_scatter",
        "softmax",
        "sort",
        "split",
        "sqrt",
        "squeeze",
        "stack",
        "sub",
        "sub_",
        "sum",
        "t",
        "topk",
        "transpose",
        "tril",
        "triu",
        "trunc",
        "unbind",
        "unsqueeze",
        "view",
        "where",
        "zero_",
        "zeros",
        "zeros_like",
        "_index_put_impl",
        "_log_softmax",
        "_softmax",
        "_to_copy",
        "_unsafe_view",
        "_reshape_alias",
        "lerp",
        "reciprocal",
        "rsqrt",
        "exponential_",
        "uniform_",
        "normal_",
        "bernoulli_",
        "argsort",
        "cummax",
        "cummin",
        "searchsorted",
        "bucketize",
        "sub_",
        "neg_",
        "mul_",
        "log1p",
        "expm1",
        "nan_to_num",
        "nan_to_num_",
        "repeat",
        "constant_pad_nd",
        "narrow",
        "roll",
        "unfold",
        "expand_as",
        "view_as",
        "contiguous",
        "_unsafe_index",
        "round",
        "round_",
        "exp2",
        "exp2_",
        "__rshift__",
        "__lshift__",
        "logical_or_",
        "logical_and_",
        "logical_not_",
        "nansum",
        "prod",
        "sum_",
        "abs_",
        "where_",
        "pow_",
        "div_",
        "clamp_min_",
        "clamp_max_",
        "floor_",
        "ceil_",
        "trunc_",
        "sqrt_",
        "rsqrt_",
        "reciprocal_",
        "sigmoid_",
        "lt_",
        "le_",
        "gt_",
        "ge_",
        "eq_",
        "ne_",
        "fmod",
        "randperm",
    ]
)


def _classified(name: str) -> bool:
    return (
        name in _FREE
        or name in _HOST_READS
        or name in _KERNEL_SYNCS
        or name in ("repeat_interleave", "isin")
    )


UNCLASSIFIED = "unclassified"


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


# A device->host copy into pinned memory with non_blocking: queued, not waited for.
ASYNC_D2H = "async d2h into pinned memory"
# The host waits on an event (:class:`_Event`): for the work queued before it only.
EVENT_WAIT = "wait on an event"


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
        self.read_bytes = 0  # what the host reads, copied or converted
        self.ops: collections.Counter[str] = collections.Counter()  # device ops, by name

    def add(self, kind: str, detail: str = "", nbytes: int = 0) -> None:
        self.kinds[kind] += 1
        self.read_bytes += nbytes
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
        """Device values read on the host, each a stream synchronize."""
        return sum(n for kind, n in self.kinds.items() if kind.startswith("d2h"))

    @property
    def unclassified(self) -> list[str]:
        """Device operations the emulation does not know (:data:`_FREE`): the level fails
        until each is classified from PyTorch's CUDA sources."""
        return sorted(kind for kind in self.kinds if kind.startswith(UNCLASSIFIED))

    @property
    def event_waits(self) -> int:
        """Waits for an event recorded earlier (a copy started before the step)."""
        return self.kinds[EVENT_WAIT]

    def summary(self) -> str:
        return ", ".join(f"{kind} x{count}" for kind, count in sorted(self.kinds.items()))

    @property
    def launches(self) -> int:
        """Device operations that run a kernel (views, allocations and metadata do not):
        on a GPU each is a launch, ~5-10 us of host time with the Python around it."""
        return sum(n for name, n in self.ops.items() if name not in NO_LAUNCH)


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
