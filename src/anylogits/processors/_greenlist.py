"""The watermark's key: how a seed is derived from the previous token(s) and which
green list it draws, shared by :class:`~anylogits.processors.watermark.Watermark` and
:func:`~anylogits.processors.watermark_detection.detect_watermark`."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any

import torch

from anylogits.processors._checks import finite_float, int_at_least

SEEDING_SCHEMES = ("lefthash", "selfhash")
# transformers' constants: seeds are reduced modulo 2**64 - 1, and selfhash hashes ids
# through a fixed permutation of this many entries.
SEED_MODULUS = 2**64 - 1
HASH_TABLE_SIZE = 1_000_003


def greenlist_size(vocab_size: int, greenlist_ratio: float) -> int:
    """Green tokens in a vocabulary of ``vocab_size`` (transformers rounds down)."""
    return int(vocab_size * greenlist_ratio)


def lefthash_seed(previous_token: int, hashing_key: int) -> int:
    """The generator seed after ``previous_token`` (Python ints: no overflow)."""
    return hashing_key * previous_token % SEED_MODULUS


def selfhash_seeds(windows: torch.Tensor, hashing_key: int) -> list[int]:
    """Generator seeds of ``(..., context_width)`` windows whose last id is the scored one.

    ``min_i(key * (t[w_i] + 1) * (t[w_last] + 1))`` over a fixed permutation ``t`` of
    ``HASH_TABLE_SIZE`` ids, in int64 arithmetic that wraps exactly as transformers'
    does, then reduced as a Python int. Flattened in row-major order.
    """
    table = hash_table(hashing_key)
    hashed = table[windows % HASH_TABLE_SIZE] + 1
    products = hashing_key * hashed * hashed[..., -1:]
    return [seed % SEED_MODULUS for seed in products.amin(dim=-1).flatten().tolist()]


@functools.lru_cache(maxsize=4)
def hash_table(hashing_key: int) -> torch.Tensor:
    """transformers' ``fixed_table``: a permutation of ``HASH_TABLE_SIZE`` ids seeded by
    ``hashing_key`` (8 MB; a handful of keys are cached)."""
    generator = torch.Generator().manual_seed(hashing_key)
    return torch.randperm(HASH_TABLE_SIZE, generator=generator)


class GreenlistCache:
    """Greenlists by seed, least recently used dropped first, and membership answers.

    Bounded by the ids held (``max_ids`` int64 ids: 32 MB), not by entries, so large
    vocabularies keep fewer lists. Shared by every watermark and detector in the
    process (the key holds the vocabulary and greenlist sizes); a lock makes it safe
    across threads.
    """

    max_ids = 2**22
    max_answers = 2**16

    def __init__(self) -> None:
        self._lists: OrderedDict[tuple[int, int, int], torch.Tensor] = OrderedDict()
        self._answers: OrderedDict[tuple[int, int, int, int], bool] = OrderedDict()
        self._held = 0
        self._generator = torch.Generator()
        self._lock = threading.Lock()

    def get(self, seed: int, vocab_size: int, size: int) -> torch.Tensor:
        """The ``(size,)`` int64 green ids, the first ``size`` of ``randperm(vocab_size)``,
        in increasing order (scattering into ascending columns is faster)."""
        key = (seed, vocab_size, size)
        with self._lock:
            greenlist = self._lists.get(key)
            if greenlist is not None:
                self._lists.move_to_end(key)
                return greenlist
            self._generator.manual_seed(seed)
            permutation = torch.randperm(vocab_size, generator=self._generator)
            greenlist = permutation[:size].sort().values  # a copy: frees the permutation
            self._lists[key] = greenlist
            self._held += size
            while self._held > self.max_ids and len(self._lists) > 1:
                self._held -= self._lists.popitem(last=False)[1].numel()
            return greenlist

    def contains(self, seed: int, token: int, vocab_size: int, size: int) -> bool:
        """Whether ``token`` is in the greenlist of ``seed``."""
        key = (seed, token, vocab_size, size)
        with self._lock:
            answer = self._answers.get(key)
            if answer is not None:
                self._answers.move_to_end(key)
                return answer
        answer = bool((self.get(seed, vocab_size, size) == token).any())
        with self._lock:
            self._answers[key] = answer
            if len(self._answers) > self.max_answers:
                self._answers.popitem(last=False)
        return answer


GREENLISTS = GreenlistCache()


def check_watermark_parameters(
    greenlist_ratio: float, hashing_key: int, seeding_scheme: str, context_width: int
) -> tuple[float, int, str, int]:
    """The detector's copy of :class:`Watermark`'s checks (same messages)."""
    return (
        check_greenlist_ratio(greenlist_ratio),
        check_hashing_key(hashing_key),
        check_seeding_scheme(seeding_scheme),
        int_at_least("context_width", context_width, 1, limit="ngram_size"),
    )


def check_greenlist_ratio(value: Any) -> float:
    ratio = finite_float("greenlist_ratio", value)
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"greenlist_ratio must lie in (0, 1), got {value!r}")
    return ratio


def check_hashing_key(value: Any) -> int:
    # selfhash multiplies it with int64 tensors, as transformers does.
    return int_at_least("hashing_key", value, 0)


def check_seeding_scheme(value: Any) -> str:
    if value not in SEEDING_SCHEMES:
        raise ValueError(f"seeding_scheme must be 'lefthash' or 'selfhash', got {value!r}")
    return value
