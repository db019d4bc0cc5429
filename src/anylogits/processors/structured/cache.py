"""A bounded least-recently-used cache with counters: compiled grammars and validation
verdicts, which a server sees again and again (every request of a client that sends the
same schema), kept within a number of entries and a total weight (bytes of grammar)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any


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
    least recently used go first. Thread-safe."""

    def __init__(self, max_entries: int, max_weight: int) -> None:
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._lock = threading.Lock()
        self._values: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._weight = self._hits = self._misses = self._evictions = 0

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            found = self._values.get(key)
            if found is None:
                self._misses += 1
                return None
            self._values.move_to_end(key)
            self._hits += 1
            return found[0]

    def put(self, key: Hashable, value: Any, weight: int = 1) -> None:
        with self._lock:
            old = self._values.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            if weight > self.max_weight:
                return  # never kept: it would evict everything else
            self._values[key] = (value, weight)
            self._weight += weight
            while len(self._values) > self.max_entries or self._weight > self.max_weight:
                _, (_, dropped) = self._values.popitem(last=False)
                self._weight -= dropped
                self._evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._weight = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                len(self._values), self._weight, self._hits, self._misses, self._evictions
            )
