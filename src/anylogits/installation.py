"""How to add an extra (an engine, llguidance) to this environment, said in the form that
works where this anylogits came from: a checkout (installed editable, or run from its
``src``), a wheel or sdist file, or the package index. anylogits is not on the index
yet, so ``pip install "anylogits[mlx]"`` fails for a user of a checkout."""

from __future__ import annotations

import functools
import json
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

DISTRIBUTION = "anylogits"


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
    return f'pip install {pins}{"-e " if editable else ""}"{source}[{extra}]"'
