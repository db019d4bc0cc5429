"""One case on one engine: its tokens through anylogits, and the cost per token against
the engine's own parameters for the same job."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from anylogits.demo.cases import SEED, UNPROCESSED, Case, demo_cases
from anylogits.testing.engines import GenerationEngine, TransformersEngine
from anylogits.testing.native import NoNative

ROUNDS = 3  # timed runs of each side, after the run that gives the tokens

SAME = "same"
DIFFERS = "DIFFERS"
NOT_COMPARED = "not compared"  # sampled on another engine: its own random numbers


@dataclass(frozen=True)
class Reference:
    """transformers' own result for one case: the tokens every engine must give."""

    tokens: list[int]
    no_effect: bool  # the same as without the job: agreeing would prove nothing


@dataclass(frozen=True)
class Cell:
    """One case on one engine."""

    tokens: list[int]
    verdict: str
    ours: float | None  # seconds per new token through anylogits (None: not timed)
    native: float | None  # ... through the engine's own parameters
    no_native: str | None  # the argument the engine has no parameter for


def references(
    transformers: TransformersEngine, prompt: list[int], n: int
) -> list[tuple[Case, Reference]]:
    """Every case, with transformers' own result for it."""
    plain = transformers.native(prompt, {}, n)
    eos = transformers.tokenizer.eos_token_id
    results = [(UNPROCESSED, Reference(plain, no_effect=False))]
    for case in demo_cases(plain, eos):
        tokens = transformers.native(prompt, case.job, n, SEED)
        without = transformers.sampled(prompt, [], n, SEED) if case.sample else plain
        results.append((case, Reference(tokens, no_effect=tokens == without)))
    return results


def measure(
    engine: GenerationEngine,
    case: Case,
    reference: Reference,
    prompt: list[int],
    n: int,
    rounds: int = ROUNDS,
) -> Cell:
    """``case`` on ``engine``: its tokens, compared with ``reference``, and timed."""

    def ours() -> list[int]:
        if case.sample:
            return engine.sampled(prompt, case.processors(), n, SEED)
        return engine.greedy(prompt, case.processors(), n)

    def native() -> list[int]:
        return engine.native(prompt, case.job, n, SEED)

    sides: dict[str, Callable[[], list[int]]] = {"native": native}
    if not case.unprocessed:  # without processors, ours is the native run
        sides["ours"] = ours
    tokens = sides.get("ours", native)()
    no_native = None
    try:
        native()  # a warm-up, and whether the engine has the parameters at all
    except NoNative as missing:
        no_native = missing.argument
        del sides["native"]
    times = _seconds_per_token(sides, rounds)
    if case.sample and engine.name != "transformers":
        verdict = NOT_COMPARED
    else:
        verdict = SAME if tokens == reference.tokens else DIFFERS
    return Cell(tokens, verdict, times.get("ours"), times.get("native"), no_native)


def _seconds_per_token(sides: dict[str, Callable[[], list[int]]], rounds: int) -> dict[str, float]:
    """Best seconds per new token of each side, runs interleaved so that machine noise
    hits both alike."""
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(rounds):
        for side, run in sides.items():
            start = time.perf_counter()
            tokens = run()
            best[side] = min(best[side], (time.perf_counter() - start) / max(len(tokens), 1))
    return best
