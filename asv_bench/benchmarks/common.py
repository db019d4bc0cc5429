"""Timing and input helpers shared by the benchmarks.

Every reported number is a ratio of two timings taken in the same process, one after
the other, with torch pinned to one thread (a busy 2-core machine is much steadier so).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

torch.set_num_threads(1)

VOCAB_SIZES = [32_000, 128_256, 151_936]
PEAKED_STD = 5.0  # N(0, 5^2) logits: top-1 probability ~0.2-0.4, top-p 0.9 keeps ~10-100


def peaked_logits(batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Logits about as peaked as a language model's next-token distribution."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=generator) * PEAKED_STD


def history(batch: int, length: int, vocab: int, seed: int = 1) -> torch.Tensor:
    """``(batch, length)`` token ids drawn from a small range, so tokens repeat."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 2_000), (batch, length), generator=generator)


def best_times(
    *calls: tuple[Callable[[Any], object], Callable[[], Any]],
    repeat: int = 5,
    min_sample_seconds: float = 0.02,
    max_number: int = 100,
) -> list[float]:
    """Best per-call seconds of each ``(call, make_argument)`` pair.

    Samples of the pairs are interleaved, so machine noise hits both sides of a ratio
    alike. Arguments are made before a sample starts: copies a processor edits in place
    are not timed.
    """
    numbers = []
    for call, make_argument in calls:
        call(make_argument())  # warm-up: caches, lazily built tensors
        start = time.perf_counter()
        call(make_argument())
        once = max(time.perf_counter() - start, 1e-7)
        numbers.append(max(1, min(max_number, int(min_sample_seconds / once))))
    best = [float("inf")] * len(calls)
    for _ in range(repeat):
        for index, ((call, make_argument), number) in enumerate(zip(calls, numbers, strict=True)):
            arguments = [make_argument() for _ in range(number)]
            start = time.perf_counter()
            for argument in arguments:
                call(argument)
            best[index] = min(best[index], (time.perf_counter() - start) / number)
    return best
