"""Tokens that are one byte of a UTF-8 character, forced by a logit bias: what made
llama-cpp-python's completion loop run past ``max_tokens`` (its multibyte fix skips the
count while the text ends in an unfinished character), until the context was full.

Byte-level BPE vocabularies (the tiny model's Llama 3, SmolLM2's) hold every byte as a
token of its own; a SentencePiece vocabulary holds them as byte-fallback tokens
(``<0xE3>``). Either way :class:`~anylogits.Vocabulary` reads the token as that one byte.
"""

from __future__ import annotations

from anylogits import Vocabulary

#: probe name -> the byte range of the forced token.
BYTE_PROBES: dict[str, tuple[int, int]] = {
    # Starts a 3-byte character that never ends: llama-cpp-python's loop never counted.
    "lead_byte": (0xE0, 0xEF),
    # Ends no character (nothing before it started one): llama-cpp-python counted it.
    "continuation_byte": (0x80, 0xBF),
    # Begins no UTF-8 character at all; llama-cpp-python's test reads it as a 4-byte lead.
    "invalid_byte": (0xF8, 0xFF),
}


def forced_byte(vocab: Vocabulary, probe: str) -> int:
    """The id of the first token of ``vocab`` that is one byte in ``probe``'s range."""
    low, high = BYTE_PROBES[probe]
    for token_id, piece in enumerate(vocab.tokens):
        if len(piece) == 1 and low <= piece[0] <= high:
            return token_id
    raise LookupError(f"no single-byte token in 0x{low:02X}-0x{high:02X} in the vocabulary")
