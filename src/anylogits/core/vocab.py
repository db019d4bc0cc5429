"""The model's vocabulary as processors see it: token id -> bytes, special ids, width."""

from __future__ import annotations

import copy
import json
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """Token id -> bytes plus the ids that matter to processors.

    Args:
        tokens: the bytes of each token id ``0 .. len(tokens) - 1`` (special tokens hold
            their text encoded as UTF-8).
        eos_token_ids: ids that end a sequence.
        special_token_ids: control / added special tokens (never produced by text).
        bos_token_id: the beginning-of-sequence id, if the model has one.
        encode: the model's tokenizer (text -> ids, no special tokens added), when known;
            grammar engines use it to tokenize literal text canonically.
        tokenizer_json: a function returning the model's tokenizer serialized in Hugging
            Face ``tokenizers`` JSON, when the vocabulary comes from a fast tokenizer:
            grammar engines then tokenize in their own native code rather than call
            ``encode`` back from it (a function: 128k tokens serialize to ~10 MB).

    The model's logits are often wider than the tokenizer (vocabularies padded to a
    multiple of 64 or 128): ids ``>= len(tokens)`` have no text. Use
    :meth:`check_logits_width` to reject a vocabulary wider than the logits.

    Example:
        >>> vocab = Vocabulary(tokens=(b"a", b"b", b"</s>"), eos_token_ids=frozenset({2}))
        >>> vocab.size, vocab.token_bytes(1)
        (3, b'b')
    """

    tokens: tuple[bytes, ...]
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    special_token_ids: frozenset[int] = field(default_factory=frozenset)
    bos_token_id: int | None = None
    encode: Callable[[str], list[int]] | None = field(default=None, repr=False)
    tokenizer_json: Callable[[], str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("eos_token_ids", "special_token_ids"):
            for token_id in getattr(self, name):
                if not 0 <= token_id < len(self.tokens):
                    raise ValueError(
                        f"{name} holds {token_id}, outside the vocabulary of "
                        f"{len(self.tokens)} tokens"
                    )

    @property
    def size(self) -> int:
        """Number of token ids that have text (the tokenizer's length)."""
        return len(self.tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of ``token_id``."""
        return self.tokens[token_id]

    def check_logits_width(self, width: int) -> None:
        """Raise ``ValueError`` when logits of ``width`` cannot cover this vocabulary."""
        if width < self.size:
            raise ValueError(
                f"logits width {width} is smaller than the vocabulary size {self.size}: "
                "the vocabulary does not belong to this model (pass the model's own "
                "tokenizer)"
            )

    @classmethod
    def from_hf_tokenizer(
        cls, tokenizer: Any, *, eos_token_ids: Iterable[int] | None = None
    ) -> Vocabulary:
        """Build from a Hugging Face tokenizer (fast tokenizers: byte-level BPE and
        SentencePiece-style byte-fallback vocabularies are decoded exactly).

        Args:
            tokenizer: a ``transformers`` tokenizer.
            eos_token_ids: overrides the tokenizer's EOS (e.g. a generation config's list).
        """
        id_to_token: dict[int, str] = {i: t for t, i in tokenizer.get_vocab().items()}
        added = {int(i): token.content for i, token in tokenizer.added_tokens_decoder.items()}
        special_ids = {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
        special_ids.update(
            int(i) for i, token in tokenizer.added_tokens_decoder.items() if token.special
        )
        decode_piece = _piece_decoder(tokenizer)
        size = max(id_to_token) + 1 if id_to_token else 0
        tokens: list[bytes] = []
        for token_id in range(size):
            piece = id_to_token.get(token_id)
            if piece is None:
                tokens.append(b"")
            elif token_id in added:
                tokens.append(added[token_id].encode("utf-8"))
            else:
                tokens.append(decode_piece(piece))
        if eos_token_ids is None:
            eos = tokenizer.eos_token_id
            eos_token_ids = [] if eos is None else [eos]
        bos = getattr(tokenizer, "bos_token_id", None)
        # A weak reference: vocabularies are cached per tokenizer, and must not keep it alive.
        tokenizer_ref = weakref.ref(tokenizer)

        def live_tokenizer() -> Any:
            live = tokenizer_ref()
            if live is None:
                raise RuntimeError("the tokenizer this vocabulary came from no longer exists")
            return live

        def encode(text: str) -> list[int]:
            return list(live_tokenizer().encode(text, add_special_tokens=False))

        def tokenizer_json() -> str:
            # What llguidance.hf.from_tokenizer serializes: the Rust tokenizer, added
            # tokens included, without the padding and truncation a caller may have set
            # (removed from a copy, which costs more than serializing: only when set).
            backend = live_tokenizer().backend_tokenizer
            if backend.padding is not None or backend.truncation is not None:
                backend = copy.copy(backend)
                backend.no_padding()
                backend.no_truncation()
            return str(backend.to_str())

        return cls(
            tokens=tuple(tokens),
            eos_token_ids=frozenset(int(i) for i in eos_token_ids),
            special_token_ids=frozenset(special_ids),
            bos_token_id=bos,
            encode=encode,
            tokenizer_json=tokenizer_json if hasattr(tokenizer, "backend_tokenizer") else None,
        )


# Reading a 128k vocabulary takes ~0.7 s and a hook is often built per generate() call;
# the tokenizer's length is part of the key, so adding tokens invalidates the entry.
_HF_VOCABULARIES: weakref.WeakKeyDictionary[Any, tuple[Any, Vocabulary]] = (
    weakref.WeakKeyDictionary()
)


def hf_vocabulary(tokenizer: Any, *, eos_token_ids: Iterable[int] | None = None) -> Vocabulary:
    """``Vocabulary.from_hf_tokenizer``, cached per tokenizer object."""
    eos = None if eos_token_ids is None else tuple(sorted(eos_token_ids))
    key = (len(tokenizer), eos)
    cached = _HF_VOCABULARIES.get(tokenizer)
    if cached is not None and cached[0] == key:
        return cached[1]
    vocab = Vocabulary.from_hf_tokenizer(tokenizer, eos_token_ids=eos)
    _HF_VOCABULARIES[tokenizer] = (key, vocab)
    return vocab


def _piece_decoder(tokenizer: Any) -> Any:
    """A function mapping one vocabulary piece to its bytes, chosen by the decoder type."""
    decoder_types = _decoder_types(tokenizer)
    if "ByteLevel" in decoder_types:
        table = _ByteLevelTable(
            {ord(character): chr(byte) for character, byte in _unicode_to_byte().items()}
        )

        def byte_level(piece: str) -> bytes:
            # Each character to the byte it stands for, as one latin-1 character: a
            # character outside the table cannot be encoded, and the piece is UTF-8 text.
            try:
                return piece.translate(table).encode("latin-1")
            except UnicodeEncodeError:
                return piece.encode("utf-8")

        return byte_level
    if decoder_types & {"ByteFallback", "Metaspace", "Replace"}:

        def sentencepiece(piece: str) -> bytes:
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return bytes([int(piece[3:5], 16)])
            return piece.replace("\u2581", " ").encode("utf-8")

        return sentencepiece

    def plain(piece: str) -> bytes:
        return tokenizer.convert_tokens_to_string([piece]).encode("utf-8")

    return plain


class _ByteLevelTable(dict):
    """``str.translate``'s table of byte-level characters: any other character becomes
    one that latin-1 cannot encode."""

    def __missing__(self, key: int) -> str:
        return "\uffff"


def _decoder_types(tokenizer: Any) -> set[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.decoder is None:
        return set()
    try:
        # The decoder alone: the whole tokenizer's JSON is megabytes at 128k tokens.
        decoder = json.loads(backend.decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        decoder = json.loads(backend.to_str()).get("decoder") or {}
    found: set[str] = set()
    stack = [decoder]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "type" in node:
                found.add(node["type"])
            stack.extend(node.get("decoders") or [])
    return found


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` table used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    shift = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + shift)
            shift += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}
