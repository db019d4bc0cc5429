"""Argument checks shared by the catalogue, each error naming the bad value: constructor
arguments, and text or token ids resolved to token ids of the bound vocabulary."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from anylogits.core.limits import check_items, check_size, check_text
from anylogits.core.vocab import Vocabulary

# No vocabulary comes near 2**31 tokens; larger ids would overflow int32 token tensors.
MAX_TOKEN_ID = 2**31 - 1
# Integers go into int64 tensors.
MAX_INT64 = 2**63 - 1


def positive_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def probability(name: str, value: Any, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    low_ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= 1):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must lie in {interval}, got {value!r}")
    return float(value)


def int_at_least(
    name: str, value: Any, minimum: int, *, maximum: int = MAX_INT64, limit: str | None = None
) -> int:
    """An integer in ``[minimum, maximum]`` (by default: fits int64 tensors) that, with
    ``limit``, also stays within that anylogits limit."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if value > maximum:
        bound = "< 2**63" if maximum == MAX_INT64 else f"<= {maximum}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    if limit is not None:
        check_size(name, value, limit, unit=None)
    return value


def token_id_list(name: str, values: Any, limit: str = "token_ids") -> tuple[int, ...]:
    """Token ids (ints in ``[0, 2**31)``), at most as many as the ``limit`` allows."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list of token ids, got {values!r}")
    check_items(name, values, limit)
    ids = tuple(values)
    for token_id in ids:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise ValueError(f"{name} must hold token ids (ints >= 0), got {token_id!r}")
        if token_id > MAX_TOKEN_ID:
            raise ValueError(f"{name} holds {token_id}, which is no token id (>= 2**31)")
    return ids


def ids_within(name: str, ids: Iterable[int], width: int, what: str) -> None:
    """Raise unless every id is below ``width`` (the vocabulary size or logits width)."""
    for token_id in ids:
        if token_id >= width:
            raise ValueError(
                f"{name} holds token id {token_id}, but the {what} has only {width} ids"
            )


def finite_float(name: str, value: Any, *, minimum: float | None = None) -> float:
    """A finite number (of either sign unless ``minimum`` is given), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return float(value)


def boolean(name: str, value: Any) -> bool:
    """``True`` or ``False`` itself: specs from JSON must not turn ``0`` or ``"no"`` into flags."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def nonempty_strings(name: str, values: Any, limit: str = "items") -> tuple[str, ...]:
    """A list of non-empty strings (a bare string is rejected, not split into characters),
    at most as many as the ``limit`` allows, each at most ``text_chars`` long."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list of strings, got {values!r}")
    check_items(name, values, limit)
    strings = tuple(values)
    for index, value in enumerate(strings):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must hold non-empty strings, got {value!r} in {values!r}")
        check_text(f"{name}[{index}]", value)
    return strings


def token_sequence(name: str, value: Any) -> tuple[int, ...]:
    """Constructor check: a non-empty list of token ids."""
    ids = token_id_list(name, value, "sequence_tokens")
    if not ids:
        raise ValueError(f"{name} must hold at least one token id, got {value!r}")
    return ids


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
