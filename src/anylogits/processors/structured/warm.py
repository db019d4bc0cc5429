"""What a server builds at start so that its first structured request does not wait."""

from __future__ import annotations

import importlib.util
import logging
import threading

from anylogits.core.vocab import Vocabulary

logger = logging.getLogger("anylogits")


def llguidance_installed() -> bool:
    """Whether structured generation's engine, llguidance (the ``structured`` extra), is
    installed."""
    return importlib.util.find_spec("llguidance") is not None


def prepare_structured(vocab: Vocabulary) -> None:
    """Build now what a process's first structured request would otherwise wait for:
    llguidance's tokenizer for ``vocab`` (about 1 s at 128k tokens) and the grammar
    checking process. Nothing where llguidance is not installed."""
    if not llguidance_installed():
        return
    from anylogits.processors.structured.engine import ENGINE
    from anylogits.processors.structured.guard import GUARD

    ENGINE.tokenizer(vocab)
    GUARD.warm()


def prepare_structured_in_background(vocab: Vocabulary) -> threading.Thread:
    """:func:`prepare_structured` in a daemon thread; a failure is logged, and the first
    structured request builds what it needs itself."""

    def prepare() -> None:
        try:
            prepare_structured(vocab)
        except Exception as error:  # the request that needs it gets the error itself
            logger.warning("anylogits: preparing structured generation failed: %s", error)

    thread = threading.Thread(target=prepare, name="anylogits-structured", daemon=True)
    thread.start()
    return thread
