"""``anylogits cache``: what anylogits keeps on disk (the demo's real model and its forms,
tiny models, vocabulary files, schemas, built wheels), where and how large, what each
model part gives ``anylogits serve ... --model``, and ``--remove`` to delete it (each part
is fetched or built again when next needed)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from anylogits.testing.tiny_model.vocab_files import cache_root

ALL = "all"


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(item.lstat().st_size for item in path.rglob("*") if item.is_file())


def cached(root: Path) -> dict[str, Path]:
    """Each removable part of the cache at ``root`` by its name: one per model folder
    (``models/NAME``), one per other top-level entry."""
    if not root.is_dir():
        return {}
    parts: dict[str, Path] = {}
    for entry in sorted(root.iterdir()):
        if entry.name == "models" and entry.is_dir():
            parts.update({f"models/{model.name}": model for model in sorted(entry.iterdir())})
        else:
            parts[entry.name] = entry
    return parts


def model_arguments(path: Path) -> list[tuple[Path, str]]:
    """What ``--model`` takes from the cached part at ``path``, and for which servers: its
    GGUF files (llama.cpp), and the folder itself when it holds a model's config.json
    (vLLM, mlx-lm, transformers)."""
    if not path.is_dir():
        return []
    arguments: list[tuple[Path, str]] = []
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        arguments.append((path, "vllm, mlx, transformers"))
    arguments += [(gguf, "llama-cpp") for gguf in sorted(path.glob("*.gguf"))]
    return arguments


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def run_cache(remove: Sequence[str] = ()) -> int:
    """List the cache (nothing to remove) or delete the parts named in ``remove``
    (``all``: everything); 2 when a name is not in the cache."""
    root = cache_root()
    parts = cached(root)
    if remove:
        names = list(parts) if ALL in remove else list(remove)
        unknown = [name for name in names if name not in parts]
        if unknown:
            print(
                f"anylogits cache: not in {root}: {', '.join(unknown)}; its parts are "
                f"{', '.join(parts) or 'none'} (or {ALL})",
                file=sys.stderr,
            )
            return 2
        for name in names:
            path = parts[name]
            freed = _size(path)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            print(f"removed {name} ({_human(freed)})")
        return 0
    print(f"anylogits cache: {root} (ANYLOGITS_CACHE_DIR sets another)")
    if not parts:
        print("  empty")
        return 0
    sizes = {name: _size(path) for name, path in parts.items()}
    width = max(map(len, parts))
    for name, path in parts.items():
        print(f"  {_human(sizes[name]):>8}  {name:<{width}}  {path}")
        for model, engines in model_arguments(path) if name.startswith("models/") else ():
            print(f"  {'':>8}  --model {model}  ({engines})")
    print(
        f"  {_human(sum(sizes.values())):>8}  in all. anylogits cache --remove NAME ... (or "
        f"{ALL}) deletes parts; each is fetched or built again when next needed."
    )
    return 0
