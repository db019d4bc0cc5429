"""The demo's table: one block per case (transformers' own tokens, the reference), one
row per engine (its tokens through anylogits against the reference, and its cost)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence

from anylogits.cli.demo.cases import Case
from anylogits.cli.demo.measure import DIFFERS, NOISY_SPREAD, Cell, Reference
from anylogits.cli.demo.selection import SERVE_COMMANDS, install_command, install_note

ERROR = "ERROR"
AGREE = "all engines agree with transformers"
# When transformers ran alone there was no other engine to agree.
ONE_ENGINE = "anylogits agrees with transformers' own processors; no other engine ran to compare"

NAME = 15  # the engine column: transformers_cb
_SHOWN_IDS = 6
_SHOWN_CHARACTERS = 60

LEGEND = """\
tokens: "same" = the engine's tokens through anylogits are transformers' own, the
  reference (shown from the first token the job changes; it must change one, or agreeing
  would prove nothing: "NO EFFECT").
  The sampled cases are compared on transformers only: each engine draws from its own
  random numbers, so across engines only their cost is shown. StopStrings is compared up
  to the token that completes the stop (transformers stops there, anylogits forces the
  end of text next). JSONSchema and Regex have no transformers parameter: their
  reference is transformers through anylogits, and every engine's output must also
  parse (match); the watermark must be detected, and the text without it not.
ms/token: a whole generation over its new tokens, the best of --rounds runs (3 by
  default; "-" with --rounds 0), anylogits processors against the engine's own
  parameters for the same job: transformers generate() arguments; transformers_cb
  (continuous batching) its per-request temperature, top_k and top_p (the rest of a
  generation config it would apply to every request alike); llama.cpp Llama.generate
  (repeat_penalty over the last 64 tokens it generated, not the prompt; temp, top_k,
  top_p, min_p); mlx-lm make_logits_processors (repetition
  penalty over the last 20 tokens, logit_bias) and make_sampler; vLLM SamplingParams.
  SuppressTokens there is a logit_bias of -100. "no native": the engine has no parameter
  for that argument, or none the demo translates to (vLLM's stop and structured
  outputs, llama.cpp's grammars: not yet). ratio: ours over native, "noisy" where it lies
  within how much the runs of either side differed (or from one run a side): no
  difference can be told there."""


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


def _shown_from(case: Case, reference: Reference) -> int:
    """Where the reference's tokens are shown from: the first token the job changes,
    where agreeing starts to mean something; or, when the job only ends the text sooner
    (a stop string), its last tokens, which say where it ended."""
    if case.unprocessed:
        return 0
    tokens, without = reference.tokens, reference.without
    if len(tokens) < len(without) and without[: len(tokens)] == tokens:
        return max(0, len(tokens) - _SHOWN_IDS)
    return _first_difference(tokens, without)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _call(case: Case) -> str:
    if case.call is not None:
        return case.call
    if case.job is None:
        return f"no native {case.no_native}; the reference is transformers through anylogits"
    arguments = {"do_sample": True, **case.job} if case.sample else case.job
    return "generate(" + ", ".join(f"{name}={value}" for name, value in arguments.items()) + ")"


NOISY = "noisy"


def _ratio(cell: Cell, *, long: bool = False) -> str:
    """Our cost over the engine's own, where both were timed and the runs' spread lets
    the ratio say something: within the spread of 1.00x (or from one run a side, which
    has none) it is noise, and said so."""
    if cell.ours is None or not cell.native:
        return "-"
    ratio = cell.ours / cell.native
    if cell.spread is None or abs(ratio - 1) <= cell.spread:
        if not long:
            return NOISY
        return f"{ratio:.2f}x, too noisy to tell ({_runs(cell.spread)})"
    return f"{ratio:.2f}x"


def _runs(spread: float | None) -> str:
    """How much one case's timed runs differed: this case's alone (the footer's warning
    speaks of the median case), and the best run of each side is what counts."""
    if spread is None:
        return "one run a side"
    return f"this case's runs differed by {spread:.0%}; the best of each side counts"


def _one_side_noisy(cell: Cell) -> bool:
    """Whether a cell timed on one side only (an unprocessed baseline, a job with no
    native) had runs too far apart for its cost to be read alone."""
    return cell.spread is not None and cell.spread > NOISY_SPREAD


def progress_text(cell: Cell) -> str:
    """A case's cell on one engine as the demo's progress line says it."""
    if cell.ours is not None and cell.no_native is None:
        ratio = _ratio(cell, long=True)
        return f"{cell.verdict}, {_ms(cell.ours)} vs {_ms(cell.native)} ms/token native, {ratio}"
    if cell.no_native is not None:
        cost = f"{_ms(cell.ours)} ms/token, no native"
    elif cell.native is None:
        return f"{cell.verdict}, not timed"
    else:
        cost = f"{_ms(cell.native)} ms/token"
    if _one_side_noisy(cell):
        cost += f", too noisy to tell ({_runs(cell.spread)})"
    return f"{cell.verdict}, {cost}"


def _row(engine: str, cell: Cell, reference: Reference, decode: Callable[[list[int]], str]) -> str:
    verdict = cell.verdict
    shown = ""
    if verdict == DIFFERS:
        first = _first_difference(cell.tokens, reference.tokens)
        verdict = f"{DIFFERS} at {first}"
        shown = "  " + _tokens(cell.tokens, first, decode)
    if cell.outcome is not None and not cell.outcome.ok:
        shown += f"  {cell.outcome.label}: {cell.outcome.text}"
    # A side timed alone carries the noise mark too, where its runs differed too much.
    noisy = f"  {NOISY}" if _one_side_noisy(cell) else ""
    if cell.no_native is not None:
        cost = f"{_ms(cell.ours):>9}  no native ({cell.no_native}){noisy}"
    elif cell.ours is None:
        cost = f"{'-':>9} {_ms(cell.native):>9}{noisy}"
    else:
        cost = f"{_ms(cell.ours):>9} {_ms(cell.native):>9} {_ratio(cell):>6}"
    return f"  {engine:<{NAME}} {verdict:<13} {cost}{shown}"


def render(
    results: list[tuple[Case, Reference, dict[str, Cell]]],
    engines: list[str],
    errors: dict[str, str],
    missing: list[str],
    decode: Callable[[list[int]], str],
    chat: bool = True,
    warning: str | None = None,
) -> tuple[list[str], int]:
    """The table's lines, and how many of its cells fail (a disagreement, a reference
    without effect, an outcome that does not hold, such as JSON that does not parse, an
    engine that could not run); ``chat``: the prompts are chat messages; ``warning``:
    what the timings are worth, when the machine was busy."""
    lines = [
        f"  {'':<{NAME}} {'':<13} {'ms per new token':^26}",
        f"  {'engine':<{NAME}} {'tokens':<13} {'anylogits':>9} {'native':>9} {'ratio':>6}",
    ]
    failures = 0
    for case, reference, cells in results:
        lines.append(f"{case.label}  (transformers: {_call(case)})")
        if case.prompt is not None:
            asked = "chat message" if chat else "prompt"
            lines.append(
                f"  {asked} {case.prompt!r} = {len(reference.prompt)} tokens, "
                f"up to {reference.n} new tokens"
            )
        start = _shown_from(case, reference)
        effect = "  NO EFFECT: the same as without it" if reference.no_effect else ""
        failures += reference.no_effect
        lines.append(f"  {'reference':<{NAME}} {_tokens(reference.tokens, start, decode)}{effect}")
        if reference.outcome is not None:
            lines.append(f"  {reference.outcome.label:<{NAME}} {reference.outcome.text}")
            failures += not reference.outcome.ok
        for engine in engines:
            if engine in errors:
                lines.append(f"  {engine:<{NAME}} {ERROR}")
                failures += 1
                continue
            cell = cells[engine]
            lines.append(_row(engine, cell, reference, decode))
            failures += cell.verdict == DIFFERS or (
                cell.outcome is not None and not cell.outcome.ok
            )
    lines += ["", *LEGEND.splitlines()]
    for engine, error in errors.items():
        lines.append(f"{engine} could not run: {error}")
    if missing:
        lines += ["", "not installed here, each added by one command:"]
        for engine in missing:
            lines.append(f"  {engine:<{NAME}} {install_command(engine)}")
            note = install_note(engine)
            if note is not None:
                lines.append(f"  {'':<{NAME}} ({note})")
            if engine in SERVE_COMMANDS:
                lines.append(f"  {'':<{NAME}} then its own server: {SERVE_COMMANDS[engine]}")
    if warning is not None:
        lines += ["", *textwrap.wrap(warning, 88)]
    lines.append("")
    lines.append(_verdict(engines, failures))
    return lines, failures


def _verdict(engines: list[str], failures: int) -> str:
    """The table's last line."""
    if failures:
        return f"{failures} cell(s) fail: see above"
    return AGREE if any(engine != "transformers" for engine in engines) else ONE_ENGINE
