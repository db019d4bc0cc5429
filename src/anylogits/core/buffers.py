"""Output tensors for hooks that must not edit their input, reused when nobody holds them.

transformers keeps the logits it passes to a processor when ``output_logits=True``, so
its hook writes the result to another tensor. A fresh ``(B, V)`` tensor per token costs
more than the write itself on a CPU: at B=32, V=128k each 16 MB allocation comes back
from the operating system as untouched pages and faults them in again, which costs about
twice a streaming pass over the logits (measured on the benchmarks page). So the hook
writes into one of a few buffers it keeps, and takes a buffer only when the tensor it
last returned from it (and every view of it) is gone: transformers keeps the result
(``output_scores=True``) or still holds it in a local variable while it asks for the
next token, and then gets a fresh tensor. Whether anything else holds a buffer's memory
is its storage's reference count (views and tensors autograd saved count too), the
test PyTorch's own CUDA-graph trees use before reusing an output's memory. Without that
counter every call gets a fresh tensor. The kept buffers (two ``(B, V)`` tensors) live
until the hook is reset or dropped; then small ones wait for the next hook's first call
(the next request's), a few at most.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable

import torch

_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)
# Without the counter no buffer is ever kept (ReusedOutputs.like), so this is never called.
_use_count_at: Callable[[int], int] = _storage_use_count or (lambda storage: -1)


class _Buffer:
    """A kept buffer, with what :meth:`ReusedOutputs.like` compares read once: this is
    per-token work (reading a storage's count through ``untyped_storage()`` builds a
    Python object each time; its address is stable while we hold the buffer)."""

    __slots__ = ("alone", "device", "dtype", "inference", "shape", "storage", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.shape = tensor.shape
        self.dtype = tensor.dtype
        self.device = tensor.device
        self.inference = tensor.is_inference()
        self.storage = tensor.untyped_storage()._cdata
        # The storage's reference count when only we hold it.
        self.alone = _use_count_at(self.storage)

    def fits(self, tensor: torch.Tensor) -> bool:
        # An inference tensor (made under torch.inference_mode, as transformers'
        # pipelines run) may not be written outside inference mode.
        return (
            self.shape == tensor.shape
            and self.dtype is tensor.dtype
            and self.device == tensor.device
            and (not self.inference or torch.is_inference_mode_enabled())
        )


class ReusedOutputs:
    """Hands out output tensors shaped like the input, reusing ones nobody holds any more.

    Args:
        keep: buffers kept between calls. Two cover a caller that still holds the
            previous result while it asks for the next one (transformers' sampling loop).
    """

    def __init__(self, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep!r}")
        self.keep = keep
        # Changed in place only: the finalizer below hands this list's buffers on.
        self._buffers: list[_Buffer] = []
        weakref.finalize(self, _release, self._buffers)

    def like(self, tensor: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor with the shape, dtype and device of ``tensor``; it does
        not overlap ``tensor`` nor any tensor returned earlier that is still held."""
        for buffer in self._buffers:
            # Whether the caller still holds it first: the cheaper test, and the one
            # that fails when the caller alternates between two buffers.
            if _use_count_at(buffer.storage) == buffer.alone and buffer.fits(tensor):
                # A new tensor on the buffer's memory: while the caller holds it
                # (or a view of it), the storage's count says so.
                return buffer.tensor.detach()
        if _storage_use_count is None:
            return _fresh(tensor)
        self._buffers[:] = [buffer for buffer in self._buffers if buffer.fits(tensor)]
        if self._buffers:  # all held: this one is not kept
            return _fresh(tensor)
        # A new layout: all its buffers are made now, with the first. The caller holds
        # each result while it asks for the next (transformers' loop), so the next call
        # would make one anyway, and its allocation would fall in the first decoding
        # step instead of the prompt's call, which allocates anyway. Made together, they
        # fit or are dropped together. Those of a dropped hook come first.
        spares = _take_spares(tensor, self.keep)
        made = [_Buffer(_fresh(tensor)) for _ in range(self.keep - len(spares))]
        self._buffers[:] = [*spares, *made]
        return self._buffers[0].tensor.detach()

    def clear(self) -> None:
        """Drop the kept buffers (their memory is freed once callers drop theirs, or taken
        by the next new layout of this or another :class:`ReusedOutputs`)."""
        _release(self._buffers)
        self._buffers[:] = []


def _fresh(tensor: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor with ``tensor``'s shape, dtype and device."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)


# The buffers of dropped or cleared ReusedOutputs, for the next new layout of another (the
# next request's hook): a fresh (1, V) buffer costs its allocation and its pages' first
# writes in the prompt's call, 13 us of a ~74 us call at V = 128k. Small ones only, and
# few, so that what generation left behind stays small: at most SPARE_BUFFERS of at most
# SPARE_BYTES each, the oldest dropped first.
SPARE_BUFFERS = 4
SPARE_BYTES = 4 << 20
_spares: collections.deque[_Buffer] = collections.deque(maxlen=SPARE_BUFFERS)
_spares_lock = threading.Lock()


def _release(buffers: list[_Buffer]) -> None:
    # No lock: a finalizer may run inside _take_spares' own allocations. Appending to a
    # deque is atomic.
    for buffer in buffers:
        if buffer.tensor.nbytes <= SPARE_BYTES:
            _spares.append(buffer)


def _take_spares(tensor: torch.Tensor, count: int) -> list[_Buffer]:
    """Up to ``count`` released buffers that fit ``tensor`` and that nobody holds."""
    taken: list[_Buffer] = []
    with _spares_lock:
        # Popped one by one (each atomic), not iterated: a finalizer may append meanwhile.
        others: list[_Buffer] = []
        while _spares:
            buffer = _spares.popleft()
            fits = _use_count_at(buffer.storage) == buffer.alone and buffer.fits(tensor)
            (taken if fits and len(taken) < count else others).append(buffer)
        _spares.extend(others)
    return taken
