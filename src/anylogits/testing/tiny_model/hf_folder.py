"""The Hugging Face folder of a tiny model, built into the cache under a key that hashes
everything its bytes depend on."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from anylogits.testing.pins import LLAMA_CPP_PYTHON_VERSION
from anylogits.testing.tiny_model.gguf_vocab import GGUFVocab, read_gguf_vocab_cached
from anylogits.testing.tiny_model.spec import BUILDER_VERSION, TinyModelSpec
from anylogits.testing.tiny_model.tokenizer import build_tokenizer
from anylogits.testing.tiny_model.vocab_files import (
    cache_root,
    file_sha256,
    vocab_download,
    vocab_gguf_path,
)
from anylogits.testing.tiny_model.weights import make_config, make_generation_config, make_weights

_MARKER = "anylogits_tiny_model.json"


def _rewrite_json(path: Path, update: dict[str, Any]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(update)
    # The writer's version: builds by different transformers versions (the vLLM and MLX
    # sessions pin their own) must stay byte-identical.
    data.pop("transformers_version", None)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_model_folder(spec: TinyModelSpec, vocab: GGUFVocab, folder: Path) -> None:
    from safetensors.torch import save_file

    config = make_config(spec, vocab)
    config.save_pretrained(folder)
    # transformers 5 writes rope_theta only inside rope_parameters; readers written for
    # transformers 4 (mlx-lm among them) look for a top-level rope_theta and silently fall
    # back to 10000 without it. torch_dtype is the transformers 4 name of dtype.
    _rewrite_json(folder / "config.json", {"rope_theta": spec.rope_theta, "torch_dtype": "float32"})
    make_generation_config(vocab).save_pretrained(folder)
    _rewrite_json(folder / "generation_config.json", {})

    tokenizer = build_tokenizer(vocab, model_max_length=spec.max_position_embeddings)
    tokenizer.save_pretrained(folder)
    # transformers 5 names the class "TokenizersBackend", which transformers 4 (as pinned
    # by some vLLM / mlx-lm installs) does not know; "PreTrainedTokenizerFast" is the
    # name both understand (an alias in 5). transformers 5 drops add_bos_token /
    # add_eos_token on save (tokenizer.json's post-processor is its source of truth), but
    # other readers use them, e.g. gguf's SpecialVocab when converting to GGUF.
    _rewrite_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": vocab.add_bos_token,
            "add_eos_token": vocab.add_eos_token,
        },
    )

    weights = make_weights(spec, config, num_tokens=len(vocab))
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


def remove_stale_temporaries(root: Path, name: str, max_age_s: float = 3600.0) -> None:
    """Delete temporary folders (or files) of ``name`` that a killed build left behind.

    Only folders older than any build could take are removed, so a build running
    concurrently in another process keeps its own.
    """
    now = time.time()
    for path in root.glob(f".{name}.*"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > max_age_s:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink()


def _folder(
    spec: TinyModelSpec, cache_dir: str | os.PathLike[str] | None, vocab_sha256: str
) -> Path:
    """Where ``spec``'s folder is cached, under a key that hashes everything its bytes
    depend on (the spec, :data:`BUILDER_VERSION`, the vocab file's bytes)."""
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    return root / f"tiny-llama-{spec.vocab}-{spec.cache_key(vocab_sha256)[:16]}"


def tiny_model_cached(
    spec: TinyModelSpec | None = None, *, cache_dir: str | os.PathLike[str] | None = None
) -> bool:
    """Whether :func:`build_tiny_model` would find ``spec``'s folder in the cache (and
    download nothing)."""
    spec = spec or TinyModelSpec()
    if vocab_download(spec.vocab) is not None:
        return False
    vocab_sha256 = file_sha256(vocab_gguf_path(spec.vocab))
    return (_folder(spec, cache_dir, vocab_sha256) / _MARKER).is_file()


def build_tiny_model(
    spec: TinyModelSpec | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> Path:
    """Build (or find in the cache) the tiny model's Hugging Face folder and return it.

    The folder is ``<cache_dir>/tiny-llama-<vocab>-<key>``, where the key hashes the spec,
    :data:`BUILDER_VERSION` and the vocab file, so a second call returns at once. The
    folder is assembled under a temporary name in ``cache_dir`` and renamed into place,
    so an interrupted or concurrent build never leaves a partial folder behind.

    Args:
        spec: The model to build; defaults to ``TinyModelSpec()``.
        cache_dir: Folder holding built models; defaults to ``cache_root() / "models"``.
            (Vocab files are always cached under :func:`cache_root`.)
        force: Rebuild even if the folder exists, replacing it.
    """
    spec = spec or TinyModelSpec()
    gguf_path = vocab_gguf_path(spec.vocab)
    vocab_sha256 = file_sha256(gguf_path)  # ~10 ms; keys the cache on the vocab file's bytes
    final = _folder(spec, cache_dir, vocab_sha256)
    root = final.parent
    if not force and (final / _MARKER).is_file():
        return final

    vocab = read_gguf_vocab_cached(str(gguf_path), vocab_sha256)
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(root, final.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        _write_model_folder(spec, vocab, tmp)
        marker = {
            "builder_version": BUILDER_VERSION,
            "cache_key": spec.cache_key(vocab_sha256),
            "llama_cpp_python_version": LLAMA_CPP_PYTHON_VERSION,
            "num_tokens": len(vocab),
            "spec": dataclasses.asdict(spec),
            "vocab_sha256": vocab.sha256,
        }
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        # mkdtemp makes the folder private (0700) and safetensors writes 0600: open them up
        # like any other cache entry.
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        if final.exists() and (force or not (final / _MARKER).is_file()):
            # Replacing (or a folder not made here): move it aside first (atomic), then
            # delete it at leisure.
            old = root / f".{final.name}.old-{uuid.uuid4().hex}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:
            # A concurrent build renamed its (identical) folder into place first.
            if not (final / _MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
