"""The public testing API: what a processor author's own tests are built from.

* :func:`check_processor`: a user's processor through the hook-level conformance of every
  installed backend (:mod:`~anylogits.testing.check` holds the check, which drives the
  backends it is handed).
* :mod:`~anylogits.testing.pytest_plugin`: ``--backends`` and a ``backend`` fixture for
  any test suite that runs on every engine.
* :mod:`~anylogits.testing.tiny_model`: a deterministic tiny random-weight Llama with a real
  vocabulary, cached as a Hugging Face folder and a GGUF file.
* :mod:`~anylogits.testing.pins`: versions of outside packages the tooling pins.

Unstable (like xgrammar's ``testing``): it may change between minor versions. The engines
these helpers drive are :mod:`anylogits.engines`; anylogits' own test fixtures live in the
repository's ``test_support`` package and do not ship. Backend libraries are imported only
where a helper needs them.

The engines use the tiny model, so this package's modules stand below them and import
none. The helpers that pick backends by name stand above the engines instead:
:func:`check_processor` is defined in :mod:`anylogits.engines.check_backends` and the
plugin is a package of its own; each name here is imported from its module on first use
(``import anylogits.testing.tiny_model`` imports neither torch nor an engine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anylogits._lazy import lazy_attributes

if TYPE_CHECKING:
    from anylogits.engines.check_backends import check_processor
    from anylogits.testing.check import check_processor_on

_LAZY = {
    "check_processor": "anylogits.engines.check_backends",
    "check_processor_on": "anylogits.testing.check",
}

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)

__all__ = ["check_processor", "check_processor_on"]
