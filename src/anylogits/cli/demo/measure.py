"""One case on one engine: its tokens through anylogits, and the cost per token against
the engine's own parameters for the same job."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from anylogits.cli.demo.cases import SEED, UNPROCESSED, Case, Outcome, demo_cases
from anylogits.engines.generation import GenerationEngine, TransformersEngine
from anylogits.engines.native import NoNative

ROUNDS = 3  # timed runs of each side, after the run that gives the tokens

SAME = "same"
DIFFERS = "DIFFERS"
NOT_COMPARED = "not compared"  # sampled on another engine: its own random numbers


@dataclass(frozen=True)
class Reference:
    """transformers' own result for one case: the tokens every engine must give."""

    tokens: list[int]
    no_effect: bool  # the same as without the job: agreeing would prove nothing
    prompt: list[int]  # the case's prompt ids
    n: int  # its new tokens at most
    without: list[int]  # the same prompt's tokens without the job
    outcome: Outcome | None = None  # what the reference's text means


@dataclass(frozen=True)
class Cell:
    """One case on one engine."""

    tokens: list[int]
    verdict: str
    ours: float | None  # seconds per new token through anylogits (None: not timed)
    native: float | None  # ... through the engine's own parameters
    no_native: str | None  # the argument the engine has no parameter for
    outcome: Outcome | None = None  # what the engine's text means
    spread: float | None = None  # how much slower its slowest timed run was than its best
    # (None: untimed, or one run a side)


def references(
    transformers: TransformersEngine,
    prompt: list[int],
    n: int,
    encode: Callable[[str], list[int]],
    trained: bool = True,
) -> list[tuple[Case, Reference]]:
    """Every case, with transformers' own result for it (or transformers' through
    anylogits, for a job it has no parameters for); ``prompt`` is the ids of the cases
    without a prompt of their own, ``encode`` makes the others' (see :class:`Case`)."""
    plain = transformers.native(prompt, {}, n)
    eos = transformers.tokenizer.eos_token_id
    results = [(UNPROCESSED, Reference(plain, False, prompt, n, plain))]
    # Each own prompt's unprocessed tokens, once per budget: what its case must change.
    unprocessed: dict[tuple[str | None, int], list[int]] = {(None, n): plain}
    cases = demo_cases(
        plain,
        eos,
        tokenizer=transformers.tokenizer,
        vocab_size=transformers.model.config.vocab_size,
        trained=trained,
        device=transformers.model.device,
    )
    for case in cases:
        ids = prompt if case.prompt is None else encode(case.prompt)
        budget = max(n, case.new_tokens)
        if (case.prompt, budget) not in unprocessed:
            unprocessed[case.prompt, budget] = transformers.native(ids, {}, budget)
        if case.sample:
            without = transformers.sampled(ids, [], budget, SEED)
        else:
            without = unprocessed[case.prompt, budget]
        if case.job is None:
            tokens = transformers.greedy(ids, case.processors(), budget)
        else:
            tokens = transformers.native(ids, case.job, budget, SEED)
        outcome = case.outcome(tokens, without) if case.outcome else None
        reference = Reference(tokens, tokens == without, ids, budget, without, outcome)
        results.append((case, reference))
    return results


def measure(
    engine: GenerationEngine, case: Case, reference: Reference, rounds: int = ROUNDS
) -> Cell:
    """``case`` on ``engine``: its tokens, compared with ``reference``, and timed over
    ``rounds`` runs of each side (0: tokens only, neither side timed nor run natively)."""
    prompt, n = reference.prompt, reference.n

    def ours() -> list[int]:
        if case.sample:
            return engine.sampled(prompt, case.processors(), n, SEED)
        return engine.greedy(prompt, case.processors(), n)

    def native() -> list[int]:
        if case.job is None:
            raise NoNative(engine.name, case.no_native)
        return engine.native(prompt, case.job, n, SEED)

    sides: dict[str, Callable[[], list[int]]] = {"native": native}
    if not case.unprocessed:  # without processors, ours is the native run
        sides["ours"] = ours
    tokens = sides.get("ours", native)()
    if case.compared is not None:
        tokens = case.compared(tokens, engine.vocabulary.eos_token_ids)
    no_native = None
    times: dict[str, list[float]] = {}
    if rounds:
        try:
            native()  # a warm-up, and whether the engine has the parameters at all
        except NoNative as missing:
            no_native = missing.argument
            del sides["native"]
        times = _seconds_per_token(sides, rounds)
    best = {side: min(runs) for side, runs in times.items()}
    # One run has no spread to speak of (it is not 0%: nothing was compared).
    spread = max(
        (max(runs) / min(runs) - 1 for runs in times.values() if len(runs) > 1), default=None
    )
    if case.sample and engine.name != "transformers":
        verdict = NOT_COMPARED
    else:
        verdict = SAME if tokens == reference.tokens else DIFFERS
    outcome = case.outcome(tokens, reference.without) if case.outcome else None
    return Cell(tokens, verdict, best.get("ours"), best.get("native"), no_native, outcome, spread)


def _seconds_per_token(
    sides: dict[str, Callable[[], list[int]]], rounds: int
) -> dict[str, list[float]]:
    """Seconds per new token of each run of each side, runs interleaved so that machine
    noise hits both alike (the best of each side counts)."""
    runs: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, run in sides.items():
            start = time.perf_counter()
            tokens = run()
            runs[side].append((time.perf_counter() - start) / max(len(tokens), 1))
    return runs


# Above either, the ratios of a run of the demo say more about the machine than about
# the processors: the median case's slowest run this much slower than its best, or more
# runnable threads than cores.
NOISY_SPREAD = 0.2


def timing_warning(cells: list[Cell], load: float | None, cores: int) -> str | None:
    """What to tell the reader when the machine was too busy for the timings of
    ``cells`` to mean much (``load``: the highest load average seen while timing), or
    ``None``."""
    spreads = sorted(cell.spread for cell in cells if cell.spread is not None)
    if not spreads:
        return None
    median = spreads[len(spreads) // 2]
    busy = load is not None and load > cores
    if median <= NOISY_SPREAD and not busy:
        return None
    seen = f"the runs of the median case differed by {median:.0%}"
    if load is not None:
        seen += f"; load average up to {load:.1f} on {cores} cores"
    return (
        f"WARNING: the machine was busy while timing ({seen}): ratios within about "
        f"{max(median, NOISY_SPREAD):.0%} of 1.00x are noise here. Rerun on an idle "
        "machine to compare costs; the tokens are compared all the same."
    )
