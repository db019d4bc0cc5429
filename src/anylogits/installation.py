"""How to add an extra (an engine, llguidance) to this environment, said in the form that
works where this anylogits came from: a checkout (installed editable, or run from its
``src``), a wheel or sdist file, or the package index. anylogits is not on the index
yet, so ``pip install "anylogits[mlx]"`` fails for a user of a checkout."""

from __future__ import annotations

import functools
import json
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

DISTRIBUTION = "anylogits"
# How llama-cpp-python is built wherever anylogits has it installed (the hints, the docs,
# nox's sessions): portable, since a build for the local CPU (its default, GGML_NATIVE)
# crashes on some CPUs (AMX's ldtilecfg, on the first Q4 matrix product), and without the
# multimodal library, which anylogits does not use. noxfile.py reads this line.
LLAMA_CPP_CMAKE_ARGS = "-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF"
LLAMA_CPP_BUILD_TIME = "llama.cpp is compiled from source: about 10 min on 2 cores"


@functools.lru_cache(maxsize=1)
def _installed_from() -> tuple[str, bool]:
    """``(what pip installs anylogits from again, whether editable)``: a folder or an
    archive path, or the project's name on the index."""
    try:
        recorded = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        recorded = None
        checkout = Path(__file__).resolve().parents[2]  # src/anylogits/installation.py
        if (checkout / "pyproject.toml").is_file():
            return str(checkout), True  # run from a checkout's src without installing
    if recorded:
        origin = json.loads(recorded)
        url = str(origin.get("url", ""))
        if url.startswith("file://"):
            editable = bool(origin.get("dir_info", {}).get("editable"))
            return unquote(urlparse(url).path), editable
    return DISTRIBUTION, False


def pip_install(extra: str) -> str:
    """The command that adds ``extra`` to this environment, e.g. ``pip install -e
    "/home/me/anylogits[mlx]"`` for an editable checkout."""
    source, editable = _installed_from()
    # A checkout's pins (torch's CPU wheel): without them pip may fetch a CUDA build.
    constraints = Path(source) / "constraints.txt"
    pins = f"-c {constraints} " if source != DISTRIBUTION and constraints.is_file() else ""
    target = f'{"-e " if editable else ""}"{source}[{extra}]"'
    if extra not in ("llama-cpp", "all"):
        return f"pip install {pins}{target}"
    # pip's wheel cache ignores CMAKE_ARGS: a native wheel built before would come back.
    return _portable(f"pip install --no-cache-dir {pins}{target}")


def llama_cpp_rebuild() -> str:
    """The command that replaces an installed llama-cpp-python with the portable build of
    the same version (installing the extra again would keep the one there)."""
    try:
        version = f"=={metadata.version('llama-cpp-python')}"
    except metadata.PackageNotFoundError:
        version = ""
    return _portable(
        f'pip install --no-cache-dir --force-reinstall --no-deps "llama-cpp-python{version}"'
    )


def _portable(command: str) -> str:
    """``command`` with llama.cpp's build flags set, in the platform's shell."""
    if sys.platform == "win32":
        return f"$env:CMAKE_ARGS='{LLAMA_CPP_CMAKE_ARGS}'; {command}"
    return f'CMAKE_ARGS="{LLAMA_CPP_CMAKE_ARGS}" {command}'
