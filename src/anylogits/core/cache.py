"""A small least-recently-used cache: what a server builds per distinct request (pipelines,
breaker tables) must not accumulate without bound."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Key = TypeVar("Key")
Value = TypeVar("Value")


class LeastRecentlyUsed(Generic[Key, Value]):
    """At most ``size`` entries, and, with ``max_weight``, entries whose weights (given to
    :meth:`put`) add up to at most that: storing one more drops the least recently used.
    An entry heavier than ``max_weight`` alone is returned and not kept.

    Example:
        >>> cache = LeastRecentlyUsed(2)
        >>> cache.put("a", 1), cache.put("b", 2), cache.get("a")
        (1, 2, 1)
        >>> cache.put("c", 3), cache.get("b"), len(cache)
        (3, None, 2)
        >>> light = LeastRecentlyUsed(10, max_weight=5)
        >>> light.put("a", 1, weight=3), light.put("b", 2, weight=3), light.get("a")
        (1, 2, None)
    """

    def __init__(self, size: int, max_weight: int | None = None) -> None:
        self.size = size
        self.max_weight = max_weight
        self.weight = 0
        self.evictions = 0  # entries dropped to make room
        self._entries: dict[Key, tuple[Value, int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Value | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._entries[key] = entry  # most recently used last
        return entry[0]

    def put(self, key: Key, value: Value, weight: int = 0) -> Value:
        replaced = self._entries.pop(key, None)
        if replaced is not None:
            self.weight -= replaced[1]
        limit = self.max_weight
        if limit is not None and weight > limit:
            return value
        while self._entries and (
            len(self._entries) >= self.size or (limit is not None and self.weight + weight > limit)
        ):
            self.weight -= self._entries.pop(next(iter(self._entries)))[1]
            self.evictions += 1
        self._entries[key] = (value, weight)
        self.weight += weight
        return value

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self.weight = 0


@dataclass(frozen=True)
class CacheStats:
    """What a :class:`BoundedCache` holds (its entries' weights: characters of the texts
    they were made from) and how often it was asked."""

    entries: int
    weight: int
    hits: int
    misses: int
    evictions: int

    def __str__(self) -> str:
        return (
            f"{self.entries} entries, {self.weight / 1e6:.1f} MB of text, "
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
