"""Counting host reads: operations that read a tensor's values on the host.

``.item()``, ``.tolist()``, ``bool(t)``, ``nonzero``, boolean-mask indexing,
``torch.unique`` and their kin wait for the device; on a GPU each one stalls the stream.
:class:`HostReads` counts them, by kind, while it is active, so a test on the CPU can show
that a processor's accelerator branch (under
:func:`~anylogits.core.sync.forbid_host_sync`) reads nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Operations that always read values on the host (or size their output from them).
_ALWAYS_READ = frozenset(
    {
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__complex__",
        "__array__",
        "__format__",
        "__repr__",
        "__contains__",
        "item",
        "tolist",
        "cpu",
        "numpy",
        "nonzero",
        "argwhere",
        "unique",
        "unique_consecutive",
        "masked_select",
        "equal",
        "allclose",
        "is_nonzero",
        "bincount",
    }
)


def _reading_index(index: Any) -> str | None:
    """Why indexing with ``index`` reads values on the host, if it does."""
    for item in index if isinstance(index, (tuple, list)) else (index,):
        if isinstance(item, torch.Tensor) and item.dtype in (torch.bool, torch.uint8):
            return "boolean-mask index"
        if isinstance(item, slice) and any(
            isinstance(bound, torch.Tensor) for bound in (item.start, item.stop, item.step)
        ):
            return "tensor slice bound"
    return None


def host_read(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """The kind of host read ``func(*args, **kwargs)`` makes, or ``None``."""
    name = getattr(func, "__name__", "")
    if name in _ALWAYS_READ:
        return name
    if name in ("__getitem__", "__setitem__") and len(args) > 1:
        return _reading_index(args[1])
    if name in ("index_put", "index_put_") and len(args) > 1:
        return _reading_index(args[1])
    if name == "repeat_interleave":
        # The output size is the sum of the repeats unless the caller gives it.
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if args else None)
        if isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None:
            return "repeat_interleave without output_size"
    if name == "where" and len(args) + len(kwargs) == 1:
        return "where(condition)"
    if name == "to" and any(
        isinstance(a, str) and a.startswith("cpu") for a in (*args[1:], kwargs.get("device"))
    ):
        return "to('cpu')"
    return None


class TorchCallObserver(TorchFunctionMode):
    """Runs every torch function called while it is active, after showing it to
    :meth:`observe` (what the subclasses count or record)."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self.observe(func, args, kwargs)
        return func(*args, **kwargs)

    def observe(
        self, func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> None:
        raise NotImplementedError


class HostReads(TorchCallObserver):
    """Counts the host reads made while it is active, by kind."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: collections.Counter[str] = collections.Counter()

    def observe(
        self, func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> None:
        kind = host_read(func, args, kwargs)
        if kind is not None:
            self.kinds[kind] += 1

    @property
    def total(self) -> int:
        return sum(self.kinds.values())


class TorchCalls(TorchCallObserver):
    """The names of the torch functions and methods called while it is active, in order
    (to show which operations a path makes, e.g. that it copies or sorts nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def observe(
        self, func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> None:
        self.names.append(getattr(func, "__name__", repr(func)))
