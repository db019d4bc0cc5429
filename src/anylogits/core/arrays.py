"""Native logits <-> torch, zero-copy where the library allows it.

numpy <-> torch share memory on the CPU (``torch.from_numpy`` accepts any positive
stride that is a multiple of the item size, which covers llama-cpp-python's strided
view). Anything else that speaks DLPack goes through ``torch.from_dlpack``. 1-D logits
become ``(1, V)`` and go back 1-D. A result that does not share the caller's memory is
written back when the backend expects an in-place edit.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

# dtype.char codes of float16 / float32 / float64 (dtype.name costs ~2 us per call).
_NUMPY_FLOAT_CHARS = ("e", "f", "d")


@dataclass
class Converted:
    """A native array seen as a 2-D torch tensor, and how to give results back.

    Attributes:
        tensor: ``(B, V)`` torch view of the native array (or a copy, see ``shares``).
        native: the caller's array.
        was_1d: the native array was ``(V,)``.
        shares: ``tensor`` shares memory with ``native``.
    """

    tensor: torch.Tensor
    native: Any
    was_1d: bool
    shares: bool


def _is_numpy(array: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(array, numpy.ndarray)


def to_torch(array: Any) -> Converted:
    """View ``array`` (torch, numpy or any DLPack producer) as ``(B, V)`` torch logits.

    Raises:
        ValueError: the array is not 1-D or 2-D, or its dtype is not floating.
    """
    if isinstance(array, torch.Tensor):
        tensor, shares = array, True
    elif _is_numpy(array):
        if array.dtype.char not in _NUMPY_FLOAT_CHARS:
            raise ValueError(
                f"numpy logits of dtype {array.dtype} are not supported; pass float16, "
                "float32 or float64"
            )
        tensor, shares = _from_numpy(array)
    elif hasattr(array, "__dlpack__"):
        tensor, shares = torch.from_dlpack(array), True
    else:
        raise ValueError(
            f"logits of type {type(array).__qualname__} are not supported: pass a torch "
            "tensor, a numpy array or an array that implements __dlpack__"
        )
    if tensor.ndim not in (1, 2):
        raise ValueError(f"logits must be (V,) or (B, V), got shape {tuple(tensor.shape)}")
    if not tensor.is_floating_point():
        raise ValueError(f"logits must be floating point, got {tensor.dtype}")
    was_1d = tensor.ndim == 1
    return Converted(tensor.unsqueeze(0) if was_1d else tensor, array, was_1d, shares)


def _from_numpy(array: Any) -> tuple[torch.Tensor, bool]:
    itemsize = array.itemsize
    strides_ok = all(stride >= 0 and stride % itemsize == 0 for stride in array.strides)
    if array.flags.writeable and strides_ok:
        return torch.from_numpy(array), True
    # Read-only or oddly strided memory: work on a copy; from_torch writes it back.
    return torch.from_numpy(array.copy()), False


def from_torch(result: torch.Tensor, converted: Converted, *, in_place: bool = False) -> Any:
    """Give ``result`` back in the caller's type and shape.

    Args:
        result: the processed ``(B, V)`` tensor.
        converted: what :func:`to_torch` returned for the caller's array.
        in_place: the backend reads the caller's array, not the return value; the result
            is copied into it unless it already lives there.
    """
    native = converted.native
    shaped = result[0] if converted.was_1d else result
    if isinstance(native, torch.Tensor):
        if in_place and not same_memory(shaped, native):
            native.copy_(shaped)
            return native
        return shaped
    if _is_numpy(native):
        if in_place:
            if not (converted.shares and same_memory(result, converted.tensor)):
                native[...] = shaped.detach().cpu().numpy()
            return native
        return shaped.detach().cpu().numpy()
    if in_place and not same_memory(result, converted.tensor):
        converted.tensor.copy_(result)
    return shaped


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` are the same elements of the same memory (same dtype too)."""
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
    )
