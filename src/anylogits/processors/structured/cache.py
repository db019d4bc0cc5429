"""A bounded least-recently-used cache with counters: compiled grammars and validation
verdicts, which a server sees again and again (every request of a client that sends the
same schema), kept within a number of entries and a total weight (bytes of grammar)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from anylogits.core.cache import LeastRecentlyUsed


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


@dataclass(frozen=True)
class CacheStats:
    entries: int
    weight: int
    hits: int
    misses: int
    evictions: int

    def __str__(self) -> str:
        return (
            f"{self.entries} entries, {self.weight / 1e6:.1f} MB of grammar, "
            f"{self.hits} hits, {self.misses} misses, {self.evictions} evictions"
        )


class BoundedCache:
    """At most ``max_entries`` values whose weights sum to at most ``max_weight``; the
    least recently used go first (:class:`~anylogits.core.cache.LeastRecentlyUsed`), a
    value heavier than ``max_weight`` alone is not kept. Thread-safe, with counters."""

    def __init__(self, max_entries: int, max_weight: int) -> None:
        self._lock = threading.Lock()
        self._values: LeastRecentlyUsed[Hashable, Any] = LeastRecentlyUsed(
            max_entries, max_weight=max_weight
        )
        self._hits = self._misses = 0

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            found = self._values.get(key)
            if found is None:
                self._misses += 1
            else:
                self._hits += 1
            return found

    def put(self, key: Hashable, value: Any, weight: int = 1) -> None:
        with self._lock:
            self._values.put(key, value, weight)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

    def stats(self) -> CacheStats:
        with self._lock:
            values = self._values
            return CacheStats(
                len(values), values.weight, self._hits, self._misses, values.evictions
            )
