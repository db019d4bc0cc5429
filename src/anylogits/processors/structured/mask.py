"""Packed token bitmasks, the layout llguidance and xgrammar fill: a ``(B, ceil(V/32))``
int32 tensor whose bit ``j`` of word ``w`` allows token ``32 w + j``.

:func:`apply_bitmask` sets every disallowed logit to ``-inf`` for the whole batch at
once, on the logits' own device. The fast path is one fused kernel compiled by
Inductor (bits unpacked and logits masked in one pass, no temporary): on the host,
traced once per shape class and called without Dynamo's per-call frame hook
(:class:`_Capture`), elsewhere through ``torch.compile``. Two rows or more compile it
when first needed; a single row on the host takes it once :func:`prepare_bitmask_kernels`
has captured it (a server's start), and single rows on an accelerator never do. The
eager path (a half-word lookup table) serves single rows until then, everything with
``ANYLOGITS_COMPILE_BITMASK=0``, and takes over (with one warning) wherever compiling
fails. Measurements: docs/design-notes.md.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from anylogits.core.transfer import to_device

logger = logging.getLogger(__name__)

COMPILE = os.environ.get("ANYLOGITS_COMPILE_BITMASK", "1") != "0"

_compile_lock = threading.Lock()
# The fused kernels by name, compiled on first use: in place and into ``out``.
_compiled_kernels: dict[str, Callable[..., None]] = {}
_compile_failed = False


def pack_bits(allowed: torch.Tensor) -> torch.Tensor:
    """The packed int32 bitmask of a bool ``(..., 32 k)`` tensor: bit ``j`` of word ``w``
    is element ``32 w + j``."""
    words = allowed.reshape(*allowed.shape[:-1], -1, 32).long() << torch.arange(32)
    packed = words.sum(-1)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def pack_ids(token_ids: Iterable[int], words: int) -> torch.Tensor:
    """The packed ``(words,)`` int32 row allowing exactly ``token_ids`` (those below
    ``32 * words``): :func:`pack_bits` for a few ids, set bit by bit (packing a whole
    49k-token bool row costs 0.2 ms)."""
    packed: dict[int, int] = {}
    for token_id in token_ids:
        if token_id < 32 * words:
            packed[token_id >> 5] = packed.get(token_id >> 5, 0) | 1 << (token_id & 31)
    row = torch.zeros(words, dtype=torch.int32)
    for word, bits in packed.items():
        row[word] = bits - (1 << 32) if bits >= 1 << 31 else bits
    return row


class ReusedBitmask:
    """A packed bitmask that is filled again at every call, with the int32 index the
    eager apply reads from it kept too: its unsigned 16-bit halves are converted into a
    kept buffer through views made once (making the views and a fresh index per call
    cost ~5 us per token, a tenth of a one-row step at 49k tokens).

    Args:
        rows: the bitmask's rows.
        words: int32 words per row.
    """

    def __init__(self, rows: int, words: int) -> None:
        # Ordinary tensors even when made under torch.inference_mode: they are written at
        # every call, and a thread's one-row bitmask serves calls outside it too.
        with torch.inference_mode(False):
            self.tensor = torch.empty(rows, words, dtype=torch.int32)
            self._halves = self.tensor.view(torch.uint16).view(-1)
            self._index = torch.empty(self._halves.shape, dtype=torch.int32)

    def index(self) -> torch.Tensor:
        """The halves of :attr:`tensor` as it is now, as int32 ids of a 16-bit table."""
        return self._index.copy_(self._halves)


def apply_bitmask(
    logits: torch.Tensor,
    bitmask: torch.Tensor | ReusedBitmask,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Set ``logits`` to ``-inf`` wherever the packed bitmask has a 0 bit and return them.
    Ids beyond the bitmask (a row wider than the vocabulary) are masked too.

    In place, or, with ``out`` (shaped like ``logits``, not overlapping them), written to
    ``out``, ``logits`` left untouched (one row: in the same single pass).
    """
    reused = bitmask if isinstance(bitmask, ReusedBitmask) else None
    packed = bitmask.tensor if isinstance(bitmask, ReusedBitmask) else bitmask
    one_row = logits.shape[0] == 1
    # One row: through Dynamo the eager lookup is faster in a generation loop (V=128k on
    # CPU: 160 against 200 us per token; its guards run on cold caches); captured on the
    # host, the fused kernel is not (V=128k, a random mask: 20 against 38 us a call).
    fused = COMPILE and (not one_row or logits.is_cpu)
    # The fused kernels read the bitmask where the logits are (filled on the host: one
    # copy that does not block it); the eager path reads it on the host.
    placed = to_device(packed, logits.device) if fused else packed
    result = logits if out is None else out
    source, target = logits, result
    covered = 32 * packed.shape[1]
    if logits.shape[1] > covered:
        result[:, covered:] = float("-inf")
        source, target = logits[:, :covered], result[:, :covered]
    if fused:
        # Into `out`: one pass reading `logits` and writing `out` (B=32, V=49k on CPU:
        # 0.59 ms, against 0.82 ms for a copy and then the in-place kernel, and 1.0 ms
        # eager); in place, 0.32 ms.
        kernel, arguments = (
            (_mask_by_bits, (source, placed))
            if out is None
            else (_mask_by_bits_into, (source, placed, target))
        )
        if (
            _apply_captured_row(kernel, arguments)
            if one_row
            else _apply_compiled(kernel, *arguments)
        ):
            return result
    _apply_eager(source, packed, target, reused)
    return result


def _mask_by_bits(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """The kernel ``torch.compile`` fuses: ``logits`` is at most ``32 * words`` wide."""
    rows, width = logits.shape
    logits.masked_fill_(_unpacked(bitmask, rows)[:, :width] == 0, float("-inf"))


def _mask_by_bits_into(logits: torch.Tensor, bitmask: torch.Tensor, out: torch.Tensor) -> None:
    """:func:`_mask_by_bits` written to ``out``, ``logits`` left as they are."""
    rows, width = logits.shape
    out.copy_(logits.masked_fill(_unpacked(bitmask, rows)[:, :width] == 0, float("-inf")))


def _unpacked(bitmask: torch.Tensor, rows: int) -> torch.Tensor:
    """``(rows, 32 * words)`` 0/1 ints: bit ``j`` of word ``w`` at column ``32 w + j``, on
    the bitmask's device (the logits')."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).view(rows, -1)


def _apply_compiled(kernel: Callable[..., None], *arguments: torch.Tensor) -> bool:
    """Run ``kernel`` compiled (fused); ``False`` if it cannot be compiled here."""
    global _compile_failed
    if _compile_failed:
        return False
    # Dynamo's compilation is not thread-safe; the lock is uncontended once compiled.
    with _compile_lock:
        try:
            captured = _captured(kernel, arguments)
            if captured is not None:
                captured.call(*arguments)
                return True
            compiled = _compiled_kernels.get(kernel.__name__)
            if compiled is None:
                compiled = _compiled_kernels[kernel.__name__] = torch.compile(kernel, dynamic=True)
            compiled(*arguments)
        except Exception as error:  # any toolchain failure: the eager path is exact too
            _compile_failed = True
            warnings.warn(
                f"anylogits: torch.compile of the bitmask apply failed ({type(error).__name__}:"
                f" {str(error)[:200]}); using the eager apply, which is exact but about 2x "
                "slower at large batches. Set ANYLOGITS_COMPILE_BITMASK=0 to skip compiling.",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
    return True


class _Capture:
    """``kernel`` traced over symbolic sizes and compiled by Inductor, called without
    Dynamo: a Dynamo-compiled call runs its frame hook, guards and wrappers in Python
    before the kernel, ~15 us warm and ~50 us inside a decoding step (the caches cold
    after the logits' pass; B=32, V=49k on CPU: 8% of the step). The guards Dynamo
    would check are checked here instead, once per layout of the arguments
    (:func:`_captured`): the sizes' relations, strides and offsets the trace assumed.

    Args:
        kernel: the kernel, which returns nothing and writes its first or last argument.
        arguments: tensors of the call it is captured for (:func:`_examples`).
    """

    __slots__ = ("_guards", "call")

    def __init__(self, kernel: Callable[..., None], arguments: tuple[torch.Tensor, ...]) -> None:
        import torch._inductor
        from torch._guards import detect_fake_mode
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

        def traced(*tensors: torch.Tensor) -> tuple[()]:
            kernel(*tensors)
            return ()

        # The caller's torch function modes (a profiler, a counter of host reads) see
        # the kernel's calls, not the tracer's and compiler's own.
        with torch._C.DisableTorchFunction():
            graph = make_fx(traced, tracing_mode="symbolic")(*_examples(arguments))
            fakes = [node.meta["val"] for node in graph.graph.nodes if node.op == "placeholder"]
            fake_mode = detect_fake_mode(fakes)
            if fake_mode is None or fake_mode.shape_env is None:
                raise RuntimeError("the trace has no symbolic sizes")
            guards = fake_mode.shape_env.produce_guards_expression(fakes, ignore_static=False)
            with fake_mode:
                compiled = torch._inductor.compile(graph, fakes)
            self.call = _without_wrappers(compiled, _examples(arguments))
        # What ShapeEnv.evaluate_guards_expression evaluates, compiled once.
        self._guards = eval(f"lambda L: {guards or 'True'}", dict(SYMPY_INTERP))

    def fits(self, arguments: tuple[torch.Tensor, ...]) -> bool:
        """Whether the trace's assumptions hold for ``arguments``."""
        return bool(self._guards({f"t{index}": tensor for index, tensor in enumerate(arguments)}))


def _without_wrappers(
    compiled: Callable[..., Any], examples: list[torch.Tensor]
) -> Callable[..., Any]:
    """The compiled module's own ``call`` (the kernel, on arguments whose sizes it reads),
    without AOT autograd's runtime wrappers around it: ~3 us of a one-row call that takes
    7-10 us at 49k tokens. Only where it writes what the wrapped call writes on random
    arguments; otherwise ``compiled`` itself (another torch's internals)."""
    runner = getattr(compiled, "current_callable", None)
    if not callable(runner):
        return compiled
    generator = torch.Generator().manual_seed(0)
    direct = [_random_like(tensor, generator) for tensor in examples]
    wrapped = [tensor.clone() for tensor in direct]
    try:
        result = runner(list(direct))
        compiled(*wrapped)
    except Exception:  # its calling convention differs: keep the wrappers
        return compiled
    returned_nothing = result is None or (isinstance(result, tuple) and not result)
    if not returned_nothing or not all(map(torch.equal, direct, wrapped)):
        return compiled

    def call(*tensors: torch.Tensor) -> None:
        runner(list(tensors))  # the list is the module's to clear

    return call


def _random_like(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if tensor.is_floating_point():
        return torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
    return torch.randint(-(2**31), 2**31 - 1, tensor.shape, generator=generator).to(tensor.dtype)


def _examples(arguments: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Tensors to trace a kernel with: the dtypes of ``arguments`` (logits, bitmask,
    output), rows as wide as their words' bits or narrower, as the logits are, and sizes
    that assume nothing else (equal sizes in a real call, rows == words, would be traced
    as a guard)."""
    logits, bitmask = arguments[0], arguments[1]
    words = 5
    width = 32 * words if logits.shape[1] == 32 * bitmask.shape[1] else 32 * words - 10
    # One row is a shape class of its own: a traced size 1 is specialized.
    rows = 1 if logits.shape[0] == 1 else 3
    return [
        torch.empty(
            (rows, width) if tensor.is_floating_point() else (rows, words), dtype=tensor.dtype
        )
        for tensor in arguments
    ]


# The captures of each kernel and dtype (at most _CAPTURES_PER_KERNEL: a row as wide as
# its words' bits, or narrower), and the one each layout of arguments takes (None: the
# Dynamo-compiled kernel), cleared when _LAYOUTS are known (a server's batch sizes).
_captures: dict[tuple[str, torch.dtype], list[_Capture]] = {}
_capture_of_layout: dict[tuple[Any, ...], _Capture | None] = {}
_uncapturable: set[tuple[str, torch.dtype]] = set()
_CAPTURES_PER_KERNEL = 4
_LAYOUTS = 512


def _layout(kernel: Callable[..., None], arguments: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    """What decides whether a capture fits ``arguments``."""
    return (
        kernel,
        *[
            (tensor.shape, tensor.stride(), tensor.storage_offset(), tensor.dtype)
            for tensor in arguments
        ],
        arguments[0].device,
        arguments[0].requires_grad,
    )


def _captured(kernel: Callable[..., None], arguments: tuple[torch.Tensor, ...]) -> _Capture | None:
    """The capture of ``kernel`` that fits ``arguments``, made on first need; ``None``
    where none does (the caller then runs the Dynamo-compiled kernel)."""
    layout = _layout(kernel, arguments)
    try:
        return _capture_of_layout[layout]
    except KeyError:
        pass
    capture = _capture_fitting(kernel, arguments)
    _keep_capture(layout, capture)
    return capture


def _keep_capture(layout: tuple[Any, ...], capture: _Capture | None) -> None:
    if len(_capture_of_layout) >= _LAYOUTS:
        _capture_of_layout.clear()
    _capture_of_layout[layout] = capture


def _apply_captured_row(kernel: Callable[..., None], arguments: tuple[torch.Tensor, ...]) -> bool:
    """Run ``kernel`` on one host row through a capture :func:`prepare_bitmask_kernels`
    made; ``False`` where there is none that fits (the eager apply serves the call). A
    one-row call never compiles: a generation of one sequence would wait for it (seconds
    on 2 cores), and in a thread the compile slowed a real model's first tokens 3-4x."""
    if _compile_failed or arguments[0].requires_grad:  # autograd is Dynamo's business
        return False
    if not _captures.get((kernel.__name__, arguments[0].dtype)):
        return False
    layout = _layout(kernel, arguments)
    capture = _capture_of_layout.get(layout)
    if capture is None:
        capture = _capture_fitting(kernel, arguments, make=False)
        if capture is None:
            return False  # not kept: one prepared later may fit
        _keep_capture(layout, capture)
    capture.call(*arguments)
    return True


def prepare_bitmask_kernels() -> None:
    """Capture the fused apply for one row and for several, in place and into an output,
    float32 logits on the host, rows as wide as their words' bits and narrower: what a
    server's first requests would otherwise compile (several rows) or go without (one row).
    Nothing with ``ANYLOGITS_COMPILE_BITMASK=0`` or ``TORCH_COMPILE_DISABLE``. On 2 cores
    ~4 s with Inductor's on-disk cache, ~12 s without, and ~150 MB more resident."""
    if not COMPILE or _compile_failed or _compile_disabled():
        return
    for rows in (1, 3):
        for width in (160, 150):
            logits, bitmask = torch.empty(rows, width), torch.empty(rows, 5, dtype=torch.int32)
            cases = (
                (_mask_by_bits, (logits, bitmask)),
                (_mask_by_bits_into, (logits, bitmask, torch.empty(rows, width))),
            )
            for kernel, arguments in cases:
                with _compile_lock:  # Dynamo's and Inductor's compilation are not thread-safe
                    _capture_fitting(kernel, arguments)


def _compile_disabled() -> bool:
    import torch._dynamo

    return bool(getattr(torch._dynamo.config, "disable", False))


def _capture_fitting(
    kernel: Callable[..., None], arguments: tuple[torch.Tensor, ...], make: bool = True
) -> _Capture | None:
    """A capture of ``kernel`` that fits ``arguments``: a kept one, else (``make``) a new
    one where the kernel has room for it."""
    # Host tensors only: on an accelerator Dynamo's path is the one tested
    # (tools/gpu_check.py). Autograd is Dynamo's business too.
    if arguments[0].requires_grad or not all(tensor.is_cpu for tensor in arguments):
        return None
    if _compile_disabled():  # TORCH_COMPILE_DISABLE: torch.compile runs the kernel eagerly
        return None
    key = (kernel.__name__, arguments[0].dtype)
    if key in _uncapturable:
        return None
    kept = _captures.setdefault(key, [])
    try:
        for capture in list(kept):  # another thread may be preparing one
            if capture.fits(arguments):
                return capture
        if not make or len(kept) >= _CAPTURES_PER_KERNEL:
            return None
        capture = _Capture(kernel, arguments)
        if not capture.fits(arguments):
            return None
    except Exception:  # another torch's internals: Dynamo's path, as before
        logger.debug("anylogits: the bitmask kernel cannot be captured", exc_info=True)
        _uncapturable.add(key)
        return None
    kept.append(capture)
    return capture


# Half-word value -> the additive bias of its 16 tokens (0 allowed, -inf masked), per
# device and dtype: a (65536, 16) table, 4 MB in float32. Looking the bitmask's 16-bit
# halves up with ``index_select`` and adding the result is exact (x + 0 == x,
# x + -inf == -inf) and the fastest eager apply found on CPU (V=128k, B=1: 45 us; bytes
# through a (256, 8) table: 74 us; bits unpacked with shifts and ``torch.where``: 620 us,
# since boolean masks take a slow path).
_HALFWORD_BIASES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _halfword_biases(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    table = _HALFWORD_BIASES.get((device, dtype))
    if table is None:
        bits = (torch.arange(1 << 16, dtype=torch.int32)[:, None] >> torch.arange(16)) & 1
        table = torch.zeros(1 << 16, 16, dtype=dtype).masked_fill_(bits == 0, float("-inf"))
        table = _HALFWORD_BIASES[(device, dtype)] = to_device(table, device)
    return table


def _apply_eager(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    target: torch.Tensor,
    reused: ReusedBitmask | None = None,
) -> None:
    """Bit ``j`` of int32 word ``w`` is token ``32 w + j``; read as little-endian 16-bit
    halves, half ``k`` of the row holds tokens ``16 k .. 16 k + 15``. ``reused``: the
    kept buffers of ``bitmask``, if it is one."""
    rows, width = logits.shape
    if reused is not None:
        index = reused.index()
    else:
        # Filled on the CPU; unsigned 16-bit views convert there on any build.
        if not bitmask.is_cpu or not bitmask.is_contiguous():
            bitmask = bitmask.cpu().contiguous()
        index = bitmask.view(torch.uint16).view(-1).int()
    device = logits.device
    if not logits.is_cpu:
        index = to_device(index, device)
    table = _halfword_biases(device, logits.dtype)
    if (
        width * rows == 16 * index.shape[0]
        and target.is_contiguous()
        and target.data_ptr() != logits.data_ptr()
    ):
        # A separate output as wide as the bitmask: the biases go straight into it and
        # the logits are added there (10 us less per token at B=1, V=128k, in a
        # generation loop: no bias tensor written and read back).
        torch.index_select(table, 0, index, out=target.view(-1, 16))
        target.add_(logits)
        return
    halfwords, bias_rows = _bias_buffer(table, index.shape[0], rows, width)
    torch.index_select(table, 0, index, out=halfwords)
    torch.add(logits, bias_rows, out=target)


# One bias buffer per thread, device and dtype, grown as needed, with its views of the
# last shapes asked for: a fresh buffer per call costs ~3 us more per token at V=128k
# (measured in a generation loop, one row), and a view or slice ~1 us each.
_bias_buffers = threading.local()


class _BiasBuffer:
    __slots__ = ("buffer", "views")

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        # (halfwords, rows, width) -> the buffer's first halfwords, and them as the
        # (rows, width) biases of the logits.
        self.views: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _bias_buffer(
    table: torch.Tensor, halfwords: int, rows: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(halfwords, 16)`` bias buffer to look the half-words up into, and the same
    memory as ``(rows, width)`` biases."""
    buffers: dict[tuple[torch.device, torch.dtype], _BiasBuffer] | None = getattr(
        _bias_buffers, "by_key", None
    )
    if buffers is None:
        buffers = _bias_buffers.by_key = {}
    key = (table.device, table.dtype)
    kept = buffers.get(key)
    if kept is None or kept.buffer.shape[0] < halfwords:
        with torch.inference_mode(False):  # written in and out of inference mode alike
            buffer = torch.empty(halfwords, 16, dtype=table.dtype, device=table.device)
        kept = buffers[key] = _BiasBuffer(buffer)
    shape = (halfwords, rows, width)
    views = kept.views.get(shape)
    if views is None:
        if len(kept.views) >= 8:
            kept.views.clear()
        flat = kept.buffer[:halfwords]
        views = kept.views[shape] = (flat, flat.view(rows, -1)[:, :width])
    return views
