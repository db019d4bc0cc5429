"""What a server builds at start so that its first structured request does not wait, and
why its collector skips what it built."""

from __future__ import annotations

import gc
import importlib.util
import logging
import threading

from anylogits.core.vocab import Vocabulary

logger = logging.getLogger("anylogits")


def llguidance_installed() -> bool:
    """Whether structured generation's engine, llguidance (the ``structured`` extra), is
    installed."""
    return importlib.util.find_spec("llguidance") is not None


def prepare_structured(vocab: Vocabulary, *, apply_kernels: bool = False) -> None:
    """Build now what a process's first structured request would otherwise wait for:
    llguidance's tokenizer for ``vocab`` (about 1 s at 128k tokens) and the grammar
    checking process. Nothing where llguidance is not installed.

    With ``apply_kernels``, the fused bitmask apply too (compiled by a batch's first call,
    used for one row only once prepared: ``mask.prepare_bitmask_kernels``, 4-12 s of a
    core, ~150 MB): for a server, before it takes requests. Not beside a request (its
    tokens were 3-4x slower meanwhile) or beside another compile (vLLM's of its model:
    two threads' compilations are not safe)."""
    if not llguidance_installed():
        return
    from anylogits.processors.structured.engine import ENGINE
    from anylogits.processors.structured.guard import GUARD

    ENGINE.tokenizer(vocab)
    GUARD.warm()
    if apply_kernels:
        _prepare_apply_kernels()


def _prepare_apply_kernels() -> None:
    from anylogits.processors.structured.mask import prepare_bitmask_kernels

    prepare_bitmask_kernels()


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive now out of the collector's generations
    (:func:`gc.freeze`), as vLLM does once its engine is up.

    A server's objects from its start (model wrappers, the vocabulary, the grammar
    engine) live as long as it does, yet each full collection walks them all: on the tiny
    model's llama.cpp server that held the GIL for ~80 ms in the middle of requests, a
    32-token request's whole latency beside it. Frozen, a full collection walks only what
    requests allocated since."""
    gc.collect()
    gc.freeze()


def prepare_structured_in_background(
    vocab: Vocabulary, *, apply_kernels: bool = False
) -> threading.Thread:
    """:func:`prepare_structured` in a daemon thread, then :func:`freeze_startup_heap`,
    whose one collection is paid at start, not in a request; a failure is logged, and the
    first structured request builds what it needs itself.

    ``apply_kernels`` are prepared first, in the calling thread: the server starts that
    much later (on 2 cores ~4 s with Inductor's on-disk cache, ~12 s without), where in
    the background its first requests ran beside the compile, 3x slower (the hostile-spec
    suite's latency bound failed on the llama.cpp server in CI)."""
    if apply_kernels and llguidance_installed():
        try:
            _prepare_apply_kernels()
        except Exception as error:  # the eager apply serves one row; a batch compiles
            logger.warning("anylogits: preparing the bitmask apply failed: %s", error)

    def prepare() -> None:
        try:
            prepare_structured(vocab)
        except Exception as error:  # the request that needs it gets the error itself
            logger.warning("anylogits: preparing structured generation failed: %s", error)
        freeze_startup_heap()

    thread = threading.Thread(target=prepare, name="anylogits-structured", daemon=True)
    thread.start()
    return thread
