"""The demo's cases: anylogits processors, and the transformers ``generate`` arguments
that do the same job (the reference, and what each engine's own parameters are
translated from, see :mod:`anylogits.testing.native`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from anylogits import (
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    NoRepeatNGram,
    RepetitionPenalty,
    SuppressTokens,
)
from anylogits.testing.native import CHAIN, Job, chain_processors_in_generate_order

SEED = 0  # of every sampled run


@dataclass(frozen=True)
class Case:
    """One processor (or chain) of the table."""

    label: str
    # Fresh instances for every run: processors hold per-run bound state.
    processors: Callable[[], list[LogitsProcessor]]
    job: Job = field(default_factory=dict)
    sample: bool = False

    @property
    def unprocessed(self) -> bool:
        return not self.job


UNPROCESSED = Case("unprocessed greedy", list)


def demo_cases(plain: list[int], eos: int) -> list[Case]:
    """The processed cases, from the unprocessed greedy tokens ``plain`` (which they must
    change) and the end-of-text id ``eos``."""
    banned = sorted(set(plain[:4]))
    # The last token it says, favoured: said earlier. Not the end of text, which a short
    # answer (a real model's) ends with, where a bias on it would change nothing.
    favoured = next((token for token in reversed(plain) if token != eos), plain[-1])
    # The values show on the reference's line, as transformers' generate arguments.
    chain = chain_processors_in_generate_order
    names = " ".join(type(processor).__name__ for processor in chain())
    return [
        Case(
            "RepetitionPenalty(1.3)", lambda: [RepetitionPenalty(1.3)], {"repetition_penalty": 1.3}
        ),
        Case("NoRepeatNGram(2)", lambda: [NoRepeatNGram(2)], {"no_repeat_ngram_size": 2}),
        Case(
            f"SuppressTokens({banned})",
            lambda: [SuppressTokens(banned)],
            {"suppress_tokens": banned},
        ),
        Case(
            f"LogitBias({{{favoured}: 4.0}})",
            lambda: [LogitBias({favoured: 4.0})],
            {"sequence_bias": {(favoured,): 4.0}},
        ),
        Case(
            "LogitBias({eos: 30.0}) MinNewTokens(5)",
            lambda: [LogitBias({eos: 30.0}), MinNewTokens(5, eos_token_id=eos)],
            {"sequence_bias": {(eos,): 30.0}, "min_new_tokens": 5},
        ),
        Case(f"sampled, seed {SEED}: {names}", chain, dict(CHAIN), sample=True),
    ]
