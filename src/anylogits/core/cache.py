"""A small least-recently-used cache: what a server builds per distinct request (pipelines,
breaker tables) must not accumulate without bound."""

from __future__ import annotations

from typing import Generic, TypeVar

Key = TypeVar("Key")
Value = TypeVar("Value")


class LeastRecentlyUsed(Generic[Key, Value]):
    """At most ``size`` entries; storing one more drops the least recently used.

    Example:
        >>> cache = LeastRecentlyUsed(2)
        >>> cache.put("a", 1), cache.put("b", 2), cache.get("a")
        (1, 2, 1)
        >>> cache.put("c", 3), cache.get("b"), len(cache)
        (3, None, 2)
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: dict[Key, Value] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Value | None:
        value = self._entries.pop(key, None)
        if value is not None:
            self._entries[key] = value  # most recently used last
        return value

    def put(self, key: Key, value: Value) -> Value:
        self._entries.pop(key, None)
        if len(self._entries) >= self.size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = value
        return value
