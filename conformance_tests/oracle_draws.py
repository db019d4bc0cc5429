"""Drawing an oracle case's parameters: the same case builders run under hypothesis
(shrinking) and under a seeded ``random.Random`` (fixed-width cases, "changes the
logits" counts); logits drawn with the special values truncations meet."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from conformance_tests.comparisons import NEG_INF

# Widths around TopP's chunk sizes (64, then 256, 1024) exercise its chunk growth.
SPECIAL_VOCABS = (2, 3, 5, 17, 63, 64, 65, 100, 255, 256, 257, 300)


class Draw:
    def int(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, values: Sequence[Any]) -> Any:
        raise NotImplementedError

    def float(self, lo: float, hi: float, specials: Sequence[float] = ()) -> float:
        raise NotImplementedError


class HypothesisDraw(Draw):
    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def choice(self, values: Sequence[Any]) -> Any:
        return self.data.draw(st.sampled_from(list(values)))

    def float(self, lo: float, hi: float, specials: Sequence[float] = ()) -> float:
        # width=32: every value drawn from the range is exactly a float32, which the
        # LogitBias oracle needs (give it float32 specials too).
        floats = st.floats(*_float32_inside(lo, hi), width=32)
        if specials:
            floats = st.one_of(st.sampled_from(list(specials)), floats)
        return float(self.data.draw(floats))


def _float32_inside(lo: float, hi: float) -> tuple[float, float]:
    """The float32 interval closest to [lo, hi] that lies inside it."""
    lo32 = torch.tensor(lo, dtype=torch.float32)
    hi32 = torch.tensor(hi, dtype=torch.float32)
    if lo32.item() < lo:
        lo32 = torch.nextafter(lo32, torch.tensor(torch.inf))
    if hi32.item() > hi:
        hi32 = torch.nextafter(hi32, torch.tensor(-torch.inf))
    return lo32.item(), hi32.item()


class RandomDraw(Draw):
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, values: Sequence[Any]) -> Any:
        return self.rng.choice(list(values))

    def float(self, lo: float, hi: float, specials: Sequence[float] = ()) -> float:
        if specials and self.rng.random() < 0.5:
            return float(self.rng.choice(list(specials)))
        lo, hi = _float32_inside(lo, hi)
        value = torch.tensor(self.rng.uniform(lo, hi), dtype=torch.float32).item()
        return min(max(value, lo), hi)


class LogitSource:
    """Successive ``(B, V)`` logits from one drawn seed and shape of distribution."""

    KINDS = ("normal", "ties", "neg_inf", "ties_neg_inf")

    def __init__(self, draw: Draw, batch: int, vocab: int, dtype: torch.dtype) -> None:
        self.generator = torch.Generator().manual_seed(draw.int(0, 2**32 - 1))
        self.kind = draw.choice(self.KINDS)
        self.scale = draw.choice((0.5, 2.0, 8.0))
        self.batch, self.vocab, self.dtype = batch, vocab, dtype

    def next(self) -> torch.Tensor:
        g = self.generator
        x = torch.randn(self.batch, self.vocab, generator=g, dtype=torch.float64) * self.scale
        if "ties" in self.kind:
            x = (x * 2).round() / 2  # 0.5 steps: exact in every dtype, many exact ties
        if "neg_inf" in self.kind:
            # As after a previous top-k: each row keeps its top `keep` logits (>= 1).
            keep = torch.randint(1, self.vocab + 1, (self.batch, 1), generator=g)
            ranks = x.argsort(dim=-1, descending=True, stable=True).argsort(-1)
            x = x.masked_fill(ranks >= keep, NEG_INF)
        return x.to(self.dtype)

    def ids(self, length: int, high: int | None = None) -> torch.Tensor:
        high = self.vocab if high is None else high
        return torch.randint(0, high, (self.batch, length), generator=self.generator)


def draw_shape(draw: Draw, vocab: int | None) -> tuple[int, int]:
    batch = draw.int(1, 6)
    if vocab is None:
        vocab = draw.choice((*SPECIAL_VOCABS, None)) or draw.int(2, 300)
    return batch, vocab


def draw_min_tokens(draw: Draw, vocab: int) -> int:
    # 70 > TopP's first chunk (64); vocab + 3 > the whole row.
    return draw.choice((1, 1, 1, 2, 3, 5, 70, vocab + 3))
