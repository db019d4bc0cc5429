"""The keys of the structured processors' caches (compiled grammars, validation verdicts,
requests' grammars: :class:`~anylogits.core.cache.BoundedCache` each)."""

from __future__ import annotations

import hashlib


def grammar_key(grammar: str) -> bytes:
    """A short key for a grammar's text (keys, not texts, stay in memory). Every sequence
    a processor starts asks for its grammar's key: the last few are remembered by the
    text's identity (hashing a 1 MB grammar costs ~1 ms)."""
    remembered = _RECENT_KEYS.get(id(grammar))
    if remembered is not None and remembered[0] is grammar:
        return remembered[1]
    key = hashlib.blake2b(grammar.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    if len(_RECENT_KEYS) >= 16:
        _RECENT_KEYS.pop(next(iter(_RECENT_KEYS)))
    # The text is held with its key, so its id cannot be reused while it is here.
    _RECENT_KEYS[id(grammar)] = (grammar, key)
    return key


_RECENT_KEYS: dict[int, tuple[str, bytes]] = {}
