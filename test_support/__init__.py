"""What anylogits' own tests, conformance suite and benchmarks are built from; not shipped.

* :mod:`~test_support.catalogue`: a spec of every catalogue processor, and
  :mod:`~test_support.hostile`: oversized and malformed specs a server must refuse.
* :mod:`~test_support.probes`: processors that make tracking and truncation mistakes
  visible (``GeneratedHashBias``, ``ReverseRanks``, ...); child processes load them as
  ``ANYLOGITS_PLUGINS=test_support.probes`` with the repository root on ``PYTHONPATH``.
* :mod:`~test_support.broken`: processors :func:`anylogits.testing.check_processor` must fail.
* :mod:`~test_support.native_samplers`: the backends' own sampling code, callable on plain
  arrays, to compare the catalogue with.
* :mod:`~test_support.host_reads`: ``HostReads``, a counter of operations that read
  tensor values on the host (each stalls a GPU stream), for the host-sync tests.
* :mod:`~test_support.emulated_device`: an accelerator emulated on the CPU that counts
  every host->device copy and device read, and :mod:`~test_support.device_budget`: the
  device reads a decode step may make (the accelerator level).
* :mod:`~test_support.engine_rows`: the catalogue's cases and the rows they run on;
  :mod:`~test_support.generation_cases` and :mod:`~test_support.native_jobs`: the
  generation jobs; :mod:`~test_support.gpu_tiny_model`: the tiny model for a GPU machine
  without network.

pytest finds this package through ``pythonpath = ["."]`` (pyproject.toml); the benchmarks
through ``asv_bench/benchmarks/__init__.py``. The public testing API is
:mod:`anylogits.testing`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent


def asv_benchmark(name: str) -> Any:
    """``asv_bench/benchmarks/<name>.py``, imported as asv imports it (the ``benchmarks``
    package, ``asv_bench`` on the path)."""
    import importlib
    import sys

    folder = str(REPOSITORY_ROOT / "asv_bench")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(f"benchmarks.{name}")


def child_environment(**settings: str) -> dict[str, str]:
    """This process's environment plus ``settings``, with the repository root first on
    ``PYTHONPATH``: a child process (a server, an engine, the command line) then imports
    ``test_support`` as pytest's ``pythonpath`` lets this process."""
    inherited = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    search_path = os.pathsep.join([str(REPOSITORY_ROOT), *inherited])
    return {**os.environ, "PYTHONPATH": search_path, **settings}
