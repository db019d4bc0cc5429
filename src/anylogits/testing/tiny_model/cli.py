"""Command line: ``python -m anylogits.testing.tiny_model`` and ``anylogits tiny-model``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from anylogits.testing.tiny_model.gguf_model import GGUF_FILENAME, build_tiny_gguf
from anylogits.testing.tiny_model.hf_folder import build_tiny_model
from anylogits.testing.tiny_model.spec import DEFAULT_VOCAB, SUPPORTED_VOCABS, TinyModelSpec


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Command line: build the tiny model (or find it in the cache) and print its folder
    (and, with ``--gguf``, the path of its GGUF file)."""
    parser = argparse.ArgumentParser(
        prog=prog or "python -m anylogits.testing.tiny_model",
        description="Build a deterministic tiny random-weight Llama with a real vocabulary "
        "as a Hugging Face folder (and optionally a GGUF file in it), cached, and print "
        "the folder's path.",
    )
    parser.add_argument(
        "--vocab", default=DEFAULT_VOCAB, choices=SUPPORTED_VOCABS, help="llama.cpp vocab"
    )
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument(
        "--pad-vocab-to",
        type=int,
        default=None,
        metavar="N",
        help="make the logits N wide (N >= number of tokens); extra rows are zero",
    )
    parser.add_argument("--cache-dir", default=None, help="folder holding built models")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument(
        "--gguf",
        action="store_true",
        help=f"also write the llama.cpp form ({GGUF_FILENAME}) into the folder and print "
        "its path on a second line",
    )
    args = parser.parse_args(argv)
    spec = TinyModelSpec(vocab=args.vocab, seed=args.seed, pad_vocab_to=args.pad_vocab_to)
    try:
        path = build_tiny_model(spec, cache_dir=args.cache_dir, force=args.force)
        gguf_path = build_tiny_gguf(spec, cache_dir=args.cache_dir) if args.gguf else None
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(path)
    if gguf_path is not None:
        print(gguf_path)
    return 0
