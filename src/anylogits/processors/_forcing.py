"""Helpers of the phrase processors: text or ids to token ids, and forcing tokens.

Forcing follows logits-processor-zoo's ``enforce_tokens`` when ``strict`` is ``False``:
the chosen tokens are raised by ``max(row) - min(chosen)`` (so the lowest of them ties
the old maximum and their differences are kept) and every other token drops to the row's
minimum. Logits stay finite, which is the zoo's choice, but sampling can still pick
another token when the row's range is small. With ``strict`` (our default) the chosen
tokens keep their logits and every other token becomes ``-inf``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from anylogits.core.limits import check_size, check_text
from anylogits.core.vocab import Vocabulary
from anylogits.processors._checks import ids_within, token_id_list

TextOrIds = str | Sequence[int]


def text_or_ids(name: str, value: Any) -> str | tuple[int, ...]:
    """Constructor check: non-empty text, or a non-empty list of token ids."""
    if isinstance(value, str):
        if not value:
            raise ValueError(f"{name} must not be empty")
        check_text(name, value)
        return value
    ids = token_id_list(name, value, "sequence_tokens")
    if not ids:
        raise ValueError(f"{name} must hold at least one token id, got {value!r}")
    return ids


def token_or_text(name: str, value: Any) -> int | str:
    """Constructor check: one token id, or non-empty text that should be one token."""
    if isinstance(value, int) and not isinstance(value, bool):
        return token_id_list(name, [value])[0]
    if isinstance(value, str) and value:
        check_text(name, value)
        return value
    raise ValueError(f"{name} must be a token id or a non-empty string, got {value!r}")


def as_config(value: str | tuple[int, ...]) -> str | list[int]:
    return value if isinstance(value, str) else list(value)


def encode(
    owner: str, name: str, value: str | tuple[int, ...], vocab: Vocabulary | None
) -> tuple[int, ...]:
    """Token ids of ``value``: ids as given, text through the vocabulary's tokenizer
    (no special tokens added, as the zoo's ``tokenizer.encode(..., add_special_tokens=False)``).
    """
    if not isinstance(value, str):
        if vocab is not None:
            ids_within(name, value, vocab.size, "vocabulary")
        return value
    if vocab is None or vocab.encode is None:
        raise ValueError(
            f"{owner}: {name} {value!r} is text, so it needs the model's tokenizer: give the "
            "adapter the tokenizer (or Pipeline(..., vocab=...)), or pass token ids"
        )
    ids = tuple(vocab.encode(value))
    if not ids:
        raise ValueError(f"{owner}: {name} {value!r} encodes to no tokens")
    check_size(f"{owner}: {name} (tokenized)", len(ids), "sequence_tokens", "tokens")
    return ids


def single_token(owner: str, name: str, value: int | str, vocab: Vocabulary | None) -> int:
    """The one token ``value`` names.

    Text must encode to one token. Like the zoo's ``text_to_token``, a leading BOS or
    whitespace-only token (a SentencePiece prefix space) is tolerated; unlike it, two
    real tokens are an error rather than "take the last one".
    """
    if isinstance(value, int):
        return encode(owner, name, (value,), vocab)[0]
    ids = list(encode(owner, name, value, vocab))
    assert vocab is not None  # encode raised otherwise
    while len(ids) > 1 and (ids[0] == vocab.bos_token_id or _blank(vocab, ids[0])):
        ids.pop(0)
    if len(ids) != 1:
        raise ValueError(
            f"{owner}: {name} {value!r} must be one token, but the tokenizer makes "
            f"{len(ids)} of it {ids}; pass a token id instead"
        )
    return ids[0]


def _blank(vocab: Vocabulary, token_id: int) -> bool:
    return token_id < vocab.size and not vocab.token_bytes(token_id).strip()


def force(
    logits: torch.Tensor, columns: torch.Tensor, strict: bool, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Leave only ``columns`` (``(R, K)``, one line per forced row) possible, in place.

    Args:
        logits: ``(B, V)``.
        columns: the allowed token ids of each forced row.
        strict: ``-inf`` for every other token; else the zoo's ``enforce_tokens``.
        rows: ``(R,)`` the forced rows; ``None`` means every row (``R == B``).
    """
    part = logits if rows is None else logits.index_select(0, rows)
    chosen = part.gather(1, columns)
    if strict:
        part.fill_(float("-inf"))
    else:
        # The zoo's operations, in its order and dtype, so results are bit-identical.
        gap = part.amax(1) - chosen.amin(1)
        chosen += gap[:, None]
        part.copy_(part.amin(1, keepdim=True).expand_as(part))
    part.scatter_(1, columns, chosen)
    if rows is not None:
        logits.index_copy_(0, rows, part)
    return logits
