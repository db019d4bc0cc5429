"""anylogits' own log lines on a server: ``anylogits serve`` sets
``ANYLOGITS_LOG_LEVEL`` (``INFO``), and every process it starts that runs anylogits (the
API server, vLLM's engine core) writes the ``anylogits`` loggers' lines to stderr, beside
the engine's own: compiled grammars and their cache, requests ended by a failing
processor. Elsewhere (a notebook, a library) nothing is configured: the application's
logging decides."""

from __future__ import annotations

import logging
import os

ENVIRONMENT_VARIABLE = "ANYLOGITS_LOG_LEVEL"
_FORMAT = "%(asctime)s anylogits %(levelname)s [%(name)s] %(message)s"


def configure_logging() -> None:
    """Send the ``anylogits`` loggers to stderr at ``$ANYLOGITS_LOG_LEVEL`` (once per
    process; nothing when the variable is unset)."""
    level = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().upper()
    if not level:
        return
    logger = logging.getLogger("anylogits")
    if any(getattr(handler, "anylogits", False) for handler in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.anylogits = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    numeric = logging.getLevelName(level)  # the level's number, for a known name
    logger.setLevel(numeric if isinstance(numeric, int) else logging.INFO)
    # Its own handler: the application's root handlers would print each line twice.
    logger.propagate = False
