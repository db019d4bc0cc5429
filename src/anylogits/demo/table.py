"""The demo's table: one block per case (transformers' own tokens, the reference), one
row per engine (its tokens through anylogits against the reference, and its cost)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from anylogits.demo.cases import Case
from anylogits.demo.measure import DIFFERS, Cell, Reference
from anylogits.demo.selection import install_command

ERROR = "ERROR"
AGREE = "all engines agree with transformers"

_SHOWN_IDS = 6
_SHOWN_CHARACTERS = 60

LEGEND = """\
tokens: "same" = the engine's tokens through anylogits are transformers' own, the
  reference (shown from the first token the job changes; it must change one, or agreeing
  would prove nothing: "NO EFFECT").
  The sampled case is compared on transformers only: each engine draws from its own
  random numbers, so across engines only its cost is shown.
ms/token: a whole generation over its new tokens, the best of --rounds runs (3 by
  default), anylogits processors against the engine's own parameters for the same job:
  transformers generate() arguments;
  llama.cpp Llama.generate (repeat_penalty over the last 64 tokens, temp, top_k, top_p,
  min_p); mlx-lm make_logits_processors (repetition penalty over the last 20 tokens,
  logit_bias) and make_sampler; vLLM SamplingParams. SuppressTokens there is a logit_bias
  of -100. "no native": the engine has no parameter for that argument."""


def _tokens(tokens: Sequence[int], start: int, decode: Callable[[list[int]], str]) -> str:
    """``tokens`` from ``start`` on: the first ids, and their text."""
    shown = list(tokens[start : start + _SHOWN_IDS])
    more = ", …" if len(tokens) > start + _SHOWN_IDS else ""
    text = decode(list(tokens[start:]))
    cut = "…" if len(text) > _SHOWN_CHARACTERS else ""
    return f"ids[{start}:] = [{', '.join(map(str, shown))}{more}] {text[:_SHOWN_CHARACTERS]!r}{cut}"


def _first_difference(tokens: Sequence[int], other: Sequence[int]) -> int:
    pairs = zip(tokens, other, strict=False)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(tokens), len(other)))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _call(case: Case) -> str:
    arguments = {"do_sample": True, **case.job} if case.sample else case.job
    return "generate(" + ", ".join(f"{name}={value}" for name, value in arguments.items()) + ")"


def _row(engine: str, cell: Cell, reference: Reference, decode: Callable[[list[int]], str]) -> str:
    verdict = cell.verdict
    shown = ""
    if verdict == DIFFERS:
        first = _first_difference(cell.tokens, reference.tokens)
        verdict = f"{DIFFERS} at {first}"
        shown = "  " + _tokens(cell.tokens, first, decode)
    if cell.no_native is not None:
        cost = f"{_ms(cell.ours):>9}  no native ({cell.no_native})"
    elif cell.ours is None:
        cost = f"{'-':>9} {_ms(cell.native):>9}"
    else:
        ratio = f"{cell.ours / cell.native:.2f}x" if cell.native else "-"
        cost = f"{_ms(cell.ours):>9} {_ms(cell.native):>9} {ratio:>6}"
    return f"  {engine:<13} {verdict:<13} {cost}{shown}"


def render(
    results: list[tuple[Case, Reference, dict[str, Cell]]],
    engines: list[str],
    errors: dict[str, str],
    missing: list[str],
    decode: Callable[[list[int]], str],
) -> tuple[list[str], int]:
    """The table's lines, and how many of its cells fail (a disagreement, a reference
    without effect, an engine that could not run)."""
    lines = [
        f"  {'':<13} {'':<13} {'ms per new token':^26}",
        f"  {'engine':<13} {'tokens':<13} {'anylogits':>9} {'native':>9} {'ratio':>6}",
    ]
    failures = 0
    plain = results[0][1].tokens  # the unprocessed case comes first
    for case, reference, cells in results:
        lines.append(f"{case.label}  (transformers: {_call(case)})")
        # From the first token the job changes: where agreeing starts to mean something.
        start = 0 if case.unprocessed else _first_difference(reference.tokens, plain)
        effect = "  NO EFFECT: the same as without it" if reference.no_effect else ""
        failures += reference.no_effect
        lines.append(f"  {'reference':<13} {_tokens(reference.tokens, start, decode)}{effect}")
        for engine in engines:
            if engine in errors:
                lines.append(f"  {engine:<13} {ERROR}")
                failures += 1
                continue
            lines.append(_row(engine, cells[engine], reference, decode))
            failures += cells[engine].verdict == DIFFERS
    lines += ["", *LEGEND.splitlines()]
    for engine, error in errors.items():
        lines.append(f"{engine} could not run: {error}")
    if missing:
        lines += ["", "not installed here, each added by one command:"]
        lines += [f"  {engine:<13} {install_command(engine)}" for engine in missing]
    lines.append("")
    lines.append(AGREE if not failures else f"{failures} cell(s) fail: see above")
    return lines, failures
