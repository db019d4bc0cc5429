"""The public testing API: what a processor author's own tests are built from.

* :func:`check_processor` (:mod:`~anylogits.testing.check`): a user's processor through
  the hook-level conformance of every installed backend.
* :mod:`~anylogits.testing.pytest_plugin`: ``--backends`` and a ``backend`` fixture for
  any test suite that runs on every engine.
* :mod:`~anylogits.testing.tiny_model`: a deterministic tiny random-weight Llama with a real
  vocabulary, cached as a Hugging Face folder and a GGUF file.
* :mod:`~anylogits.testing.pins`: versions of outside packages the tooling pins.

Unstable (like xgrammar's ``testing``): it may change between minor versions. The engines
these helpers drive are :mod:`anylogits.engines`; anylogits' own test fixtures live in the
repository's ``test_support`` package and do not ship. Backend libraries are imported only
where a helper needs them.
"""

from anylogits.testing.check import check_processor

__all__ = ["check_processor"]
