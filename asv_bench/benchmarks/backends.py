"""The backend parameter: every benchmark that drives a backend takes one of these names.

A backend that is not installed raises ``NotImplementedError`` in ``setup``, which asv
reports as skipped. Adding a backend: add its class to ``anylogits.engines.backends``.
"""

from __future__ import annotations

from typing import Any

from anylogits.engines.backends import BACKENDS, installed

BACKEND_NAMES = list(BACKENDS)


def require_backend(name: str) -> Any:
    """The harness of backend ``name``; ``NotImplementedError`` (asv: skip) if missing."""
    if not installed(name):
        raise NotImplementedError(f"{name} is not installed")
    return BACKENDS[name]
