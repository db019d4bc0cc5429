"""The tokenizer fields of a llama.cpp vocab file, read once per file into plain Python
values."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anylogits.testing.tiny_model.spec import DEFAULT_VOCAB
from anylogits.testing.tiny_model.vocab_files import file_sha256, vocab_gguf_path

# llama.cpp token types (enum llama_token_type in llama.h).
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer fields of a llama.cpp vocab file, as plain Python values.

    ``merges`` is empty for SentencePiece vocabularies and ``scores`` empty for BPE ones;
    the ``*_token_id`` fields are ``None`` where the file does not set them.
    """

    name: str
    model: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    pre: str  # tokenizer.ggml.pre: llama.cpp's pre-tokenizer name
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    scores: tuple[float, ...]
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool
    add_eos_token: bool
    sha256: str

    def __len__(self) -> int:
        return len(self.tokens)


@functools.lru_cache(maxsize=4)
def read_gguf_vocab_cached(path: str, sha256: str) -> GGUFVocab:
    from gguf import GGUFReader

    # GGUFReader parses every array element into its own numpy view: about 10 s for the
    # 128k-token Llama-3 vocab. Hence the cache here and the built folders on disk.
    fields = GGUFReader(path).fields

    def get(key: str, default: Any = None) -> Any:
        field = fields.get(key)
        return default if field is None else field.contents()

    model = get("tokenizer.ggml.model")
    pre = get("tokenizer.ggml.pre", "default")
    # llama.cpp's defaults when the file does not say (llama_vocab::impl::load).
    add_bos_default = model == "llama" or pre in ("llama-bpe", "llama3", "llama-v3")
    return GGUFVocab(
        name=Path(path).name.removeprefix("ggml-vocab-").removesuffix(".gguf"),
        model=model,
        pre=pre,
        tokens=tuple(get("tokenizer.ggml.tokens")),
        token_types=tuple(int(t) for t in get("tokenizer.ggml.token_type")),
        merges=tuple(get("tokenizer.ggml.merges", ())),
        scores=tuple(float(s) for s in get("tokenizer.ggml.scores", ())),
        bos_token_id=get("tokenizer.ggml.bos_token_id"),
        eos_token_id=get("tokenizer.ggml.eos_token_id"),
        unk_token_id=get("tokenizer.ggml.unknown_token_id"),
        pad_token_id=get("tokenizer.ggml.padding_token_id"),
        add_bos_token=bool(get("tokenizer.ggml.add_bos_token", add_bos_default)),
        add_eos_token=bool(get("tokenizer.ggml.add_eos_token", False)),
        sha256=sha256,
    )


def read_gguf_vocab(vocab: str = DEFAULT_VOCAB) -> GGUFVocab:
    """Read the tokenizer fields of ``ggml-vocab-<vocab>.gguf`` (memoized per file hash)."""
    path = vocab_gguf_path(vocab)
    return read_gguf_vocab_cached(str(path), file_sha256(path))
