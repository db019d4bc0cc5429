"""What anylogits' own tests and conformance suite are built from (the engines they drive:
:mod:`anylogits.engines`).

* :func:`check_processor` (:mod:`~anylogits.testing.check`): a user's processor through
  the hook-level conformance of every installed backend; public, and
  :mod:`~anylogits.testing.broken` holds processors it must fail.
* :mod:`~anylogits.testing.catalogue`: a spec of every catalogue processor, and
  :mod:`~anylogits.testing.hostile`: oversized and malformed specs a server must refuse.
* :mod:`~anylogits.testing.probes`: processors that make tracking and truncation mistakes
  visible (``GeneratedHashBias``, ``ReverseRanks``, ...).
* :mod:`~anylogits.testing.native_samplers`: the backends' own sampling code, callable on plain
  arrays, to compare the catalogue with.
* :mod:`~anylogits.testing.pytest_plugin`: ``--backends`` and a ``backend`` fixture for
  any test suite that runs on every engine; public.
* :mod:`~anylogits.testing.tiny_model`: a deterministic tiny random-weight Llama with a real
  vocabulary, cached as a Hugging Face folder and a GGUF file.
* :mod:`~anylogits.testing.pins`: versions of outside packages the tooling pins.
* :mod:`~anylogits.testing.host_reads`: ``HostReads``, a counter of operations that read
  tensor values on the host (each stalls a GPU stream), for the host-sync tests.

Apart from :func:`check_processor`, this package is for testing anylogits; it is not part
of the public API and may change without notice. Backend libraries are imported only
where a helper needs them.
"""

from anylogits.testing.check import check_processor

__all__ = ["check_processor"]
