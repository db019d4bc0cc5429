"""Cost limits: how much work one processor configuration may ask for.

On a shared inference server every spec field comes from a client, and one request must not be able
to stall or kill an engine that serves everyone. So every processor checks, when it is
built (and therefore wherever a spec is parsed: in the server frontend's request
validation, which turns the ``ValueError`` into an HTTP 400), that what it was given stays within
these limits. The same checks run on every backend, so a configuration that works in a
notebook works on the server.

The defaults are far above any use we know of (each one's reason is in :data:`REASONS`).
An operator changes them in one place, the ``ANYLOGITS_LIMITS`` environment variable, a
JSON object (``ANYLOGITS_LIMITS='{"items": 4096}'``), which every process of a server
inherits: the API server, the engine core and each tensor-parallel worker. In Python,
:func:`set_limits` does the same and exports the variable, so engine processes started
afterwards agree.

Example:
    >>> from anylogits import SuppressTokens
    >>> from anylogits.core.limits import override
    >>> with override(token_ids=2):
    ...     SuppressTokens([1, 2, 3])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: token_ids has 3 items, more than the limit of 2 (anylogits limit 'token_ids'; ...)
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ENVIRONMENT_VARIABLE = "ANYLOGITS_LIMITS"


@dataclass(frozen=True)
class Limits:
    """Upper bounds on what one processor configuration (one request) may ask for."""

    spec_bytes: int = 131_072
    spec_depth: int = 64
    processors: int = 16
    items: int = 1024
    token_ids: int = 32_768
    text_chars: int = 1024
    sequence_tokens: int = 256
    sequence_breakers: int = 16
    ngram_size: int = 32
    window: int = 1_048_576
    grammar_chars: int = 32_768
    grammar_lexer_fuel: int = 1_000_000
    grammar_step_fuel: int = 200_000
    grammar_step_items: int = 50_000
    grammar_size: int = 500_000
    schema_items: int = 10_000
    string_length: int = 1_048_576
    repeat_count: int = 10_000
    alternatives: int = 4096
    grammar_rules: int = 1024
    multiple_of: int = 1_000_000
    grammar_check_mb: int = 512
    grammar_check_ms: int = 500


REASONS: dict[str, str] = {
    "spec_bytes": "JSON text of one request's specs (a server's; processors built in "
    "Python have no size limit). Parsing and compiling grow with it: ~0.2 ms per KB of "
    "JSON schema (Kubernetes corpus), and vLLM compiles in its engine step, where every "
    "request waits. 31 of 888 real-world schemas (docs/limits.md) are larger: raise it to "
    "serve them.",
    "spec_depth": "nesting of spec values (JSON schemas included). Real schemas nest "
    "about 10 deep; Python's parsers recurse, so 5,000 levels would crash them.",
    "processors": "processors in one request; each adds a pass over the logits per step "
    "(~0.25 ms for a truncation at 128k tokens). Real pipelines use 2-6.",
    "items": "entries of a list or dict field: bad words, sequence biases, stop strings, "
    "choices, multiple-choice options. Each is matched every step (or compiled).",
    "token_ids": "token ids in one id-list field: suppressed tokens, logit biases, "
    "protected or EOS ids. One vectorized op per step, so the bound is generous.",
    "text_chars": "characters of one string entry (a stop string, a bad word, a phrase, "
    "a choice, a breaker). Tokenized once, scanned per token (stop strings).",
    "sequence_tokens": "tokens in one token sequence (a bad word, a biased sequence, a "
    "forced phrase). Every sequence is compared with the history's tail per step.",
    "sequence_breakers": "DRY sequence breakers: each one's multi-token forms are matched "
    "against the history every step (one tensor pass per form). llama.cpp uses 4.",
    "ngram_size": "NoRepeatNGram's n and Watermark's context_width: the history is "
    "compared (or hashed) in windows of that many tokens, per candidate token.",
    "window": "history windows in tokens (DRY penalty_last_n, RepetitionPenalty "
    "context_size); longer than any model's context.",
    "grammar_chars": "text of one regex, grammar or JSON schema of a request (and all "
    "choices together); built in Python there is no such limit, what it costs is bounded "
    "instead. A server compiles it in its request path: ~1.5 ms per KB of Lark "
    "alternatives (32 KB: ~40 ms; 1.3 MB held an engine ~65 s before the CPU-time budget).",
    "grammar_lexer_fuel": "llguidance's initial_lexer_fuel: work to build a grammar's "
    "lexer (~50k per ms). llguidance's default.",
    "grammar_step_fuel": "llguidance's step_lexer_fuel: lexer work per generated token "
    "(~14k per ms). llguidance's default.",
    "grammar_step_items": "llguidance's step_max_items: Earley items per generated token "
    "(~20k per ms). llguidance's default.",
    "grammar_size": "llguidance's max_grammar_size: symbols in a grammar's productions. "
    "llguidance's default.",
    "schema_items": "a JSON schema's minItems, maxItems, minContains, maxContains, "
    "minProperties and maxProperties, and the widths of its enum, anyOf, oneOf, allOf, "
    "properties, ... llguidance 1.7 (vLLM's pin) allocates per item when it compiles: "
    "maxItems 1e9 aborted a vLLM API server, 1e7 held it 11 s and 1.3 GB, 1e5 costs 0.2 s "
    "and 110 MB, 1e4 ~20 ms. Real schemas use maxItems <= 500 and enums of up to 1,772.",
    "string_length": "a JSON schema's minLength and maxLength. Compiled lazily (1e9 costs "
    "no memory), bounded all the same; real schemas use up to 131,072.",
    "repeat_count": "the product of nested counted repetitions (regex {n,m}, Lark ~n / "
    "{n,m}, GBNF {n,m}, through rule references): ((a{100}){100}){100} makes llguidance "
    "tokenize a million-byte forced literal (~0.7 s). One level up to 10,000 is ~20 ms.",
    "alternatives": "branches of one alternation (regex a|b|..., a grammar rule's | "
    "alternatives, anyOf / oneOf / allOf / enum are bounded by 'schema_items'). The largest "
    "grammar within 'grammar_chars' has ~2,700.",
    "grammar_rules": "rules and terminals of one Lark or GBNF grammar; llama.cpp's own "
    "JSON grammar has 10.",
    "multiple_of": "a JSON schema's multipleOf: divisibility by n is an n-state automaton "
    "for the lexer. 1e6 compiles in ~1 ms; 1e9+7 inside an anyOf held llguidance 1.9's "
    "compile for the vocabulary over 20 s (fuzzer). Real schemas use up to 37.",
    "grammar_check_mb": "address space (MB) of the child process in which a grammar is "
    "first validated: a grammar whose compilation needs more is refused, instead of "
    "aborting the process that validates it (llguidance's allocation failures abort).",
    "grammar_check_ms": "CPU time (ms) for that validation, not wall clock: a loaded "
    "machine gives the same verdict. Real-world schemas take under 0.1 s (1.5 ms at the "
    "median); validating runs in a server's request path, where every client waits.",
}

_current: Limits | None = None


def _parse(text: str) -> dict[str, int]:
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE} is not a JSON object ({error}); e.g. "
            f"{ENVIRONMENT_VARIABLE}='{{\"items\": 4096}}'"
        ) from None
    if not isinstance(values, dict):
        raise ValueError(f"{ENVIRONMENT_VARIABLE} must be a JSON object, got {text!r}")
    return values


def _checked(changes: dict[str, Any]) -> dict[str, int]:
    known = {field.name for field in dataclasses.fields(Limits)}
    for name, value in changes.items():
        if name not in known:
            raise ValueError(f"{name!r} is not an anylogits limit; the limits are {sorted(known)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"limit {name!r} must be an integer >= 1, got {value!r}")
    return changes


def limits() -> Limits:
    """The limits in force: defaults, changed by ``ANYLOGITS_LIMITS`` and :func:`set_limits`."""
    global _current
    if _current is None:
        text = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
        _current = Limits(**_checked(_parse(text))) if text else Limits()
    return _current


def set_limits(**changes: int) -> Limits:
    """Change limits for this process and the processes it starts from now on.

    Exports ``ANYLOGITS_LIMITS`` so that engine processes (an engine core, its
    workers) started afterwards use the same limits. Returns the limits in force before.
    """
    previous = limits()
    _install(dataclasses.replace(previous, **_checked(changes)))
    return previous


def _install(new: Limits) -> None:
    global _current
    _current = new
    changed = {
        field.name: getattr(new, field.name)
        for field in dataclasses.fields(Limits)
        if getattr(new, field.name) != field.default
    }
    if changed:
        os.environ[ENVIRONMENT_VARIABLE] = json.dumps(changed)
    else:
        os.environ.pop(ENVIRONMENT_VARIABLE, None)


@contextlib.contextmanager
def override(**changes: int) -> Iterator[Limits]:
    """Limits changed inside a ``with`` block only (tests, one-off jobs)."""
    previous = set_limits(**changes)
    try:
        yield limits()
    finally:
        _install(previous)


def exceeded(field: str, size: float, limit: str, unit: str | None = "items") -> ValueError:
    """The error for ``field`` holding ``size`` units (or, with ``unit=None``, being the
    number ``size``) where ``limit`` allows less."""
    bound = getattr(limits(), limit)
    what = f"is {size}" if unit is None else f"has {size} {unit}"
    return ValueError(
        f"{field} {what}, more than the limit of {bound} (anylogits limit "
        f"{limit!r}; raise it with {ENVIRONMENT_VARIABLE}='{{\"{limit}\": N}}')"
    )


def check_size(field: str, size: int, limit: str, unit: str | None = "items") -> None:
    """Raise ``ValueError`` naming ``field``, its size and the limit when over it."""
    if size > getattr(limits(), limit):
        raise exceeded(field, size, limit, unit)


def check_items(field: str, values: Any, limit: str = "items") -> None:
    """Bound the length of a list, tuple or dict field (other values are left to the
    field's own type check)."""
    if isinstance(values, (list, tuple, dict)):
        check_size(field, len(values), limit)


def check_text(field: str, text: Any, limit: str = "text_chars") -> None:
    """Bound the length of a string field (other values are left to the type check)."""
    if isinstance(text, str):
        check_size(field, len(text), limit, "characters")


_FROM_REQUEST: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "anylogits_from_request", default=False
)
_CLIENT_SIDE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "anylogits_client_side", default=False
)


@contextlib.contextmanager
def _set_within(flag: contextvars.ContextVar[bool]) -> Iterator[None]:
    token = flag.set(True)
    try:
        yield
    finally:
        flag.reset(token)


def building_from_request() -> contextlib.AbstractContextManager[None]:
    """Processors built inside this block come from a request (a spec, on a server):
    the limits of a request's size apply to them as well as the costs' (see
    :func:`check_request_size`). :func:`~anylogits.core.specs.from_spec` builds there."""
    return _set_within(_FROM_REQUEST)


def from_request() -> bool:
    """Whether the processor being built comes from a request (see
    :func:`building_from_request`)."""
    return _FROM_REQUEST.get()


def checking_client_side() -> contextlib.AbstractContextManager[None]:
    """Specs built inside this block are checked for a client (``vllm_xargs``,
    ``anylogits check-spec``), not admitted by a server: what needs an engine this
    process lacks (llguidance, for a structured processor) is left to the server, which
    checks it again."""
    return _set_within(_CLIENT_SIDE)


# The request spec being built whose text is known: the class it names, and a key that
# determines it (see building_checked_spec).
_CHECKED_SPEC: contextvars.ContextVar[tuple[type, tuple[str, int]] | None] = contextvars.ContextVar(
    "anylogits_checked_spec", default=None
)


@contextlib.contextmanager
def building_checked_spec(cls: type, key: tuple[str, int]) -> Iterator[None]:
    """Inside :func:`building_from_request`: the processor being built is a ``cls`` from
    a spec checked before as ``key`` (its request's text and its place there, which
    determine it), so that it may find what its first build made
    (:func:`claim_checked_spec`)."""
    token = _CHECKED_SPEC.set((cls, key))
    try:
        yield
    finally:
        _CHECKED_SPEC.reset(token)


def claim_checked_spec(cls: type) -> tuple[str, int] | None:
    """The key of the checked spec being built (:func:`building_checked_spec`) for the
    processor it names, ``cls``; once, so that a processor its constructor builds in
    turn gets none."""
    found = _CHECKED_SPEC.get()
    if found is None or found[0] is not cls:
        return None
    _CHECKED_SPEC.set(None)
    return found[1]


def client_side() -> bool:
    """Whether specs are being checked for a client (see :func:`checking_client_side`)."""
    return _CLIENT_SIDE.get()


def admitted_by_server() -> bool:
    """Whether the processor being built is a request's spec that a server is admitting
    (not a client checking it, see :func:`checking_client_side`, nor a user's own): only
    there must what its engine needs be at hand now."""
    return _FROM_REQUEST.get() and not _CLIENT_SIDE.get()


def check_request_size(field: str, size: int, limit: str, unit: str) -> None:
    """:func:`check_size` for a request's sizes only: a processor built in this process
    by its user (not from a spec) is bounded by what it costs, not by its size (a 900 KB
    Kubernetes schema compiles in a fraction of a second), while a server bounds what
    one client may make it parse and compile in its request path."""
    if _FROM_REQUEST.get():
        check_size(field, size, limit, unit)


def llguidance_limits() -> dict[str, int]:
    """The grammar limits as ``llguidance.LLParserLimits`` keyword arguments."""
    current = limits()
    return {
        "initial_lexer_fuel": current.grammar_lexer_fuel,
        "step_lexer_fuel": current.grammar_step_fuel,
        "step_max_items": current.grammar_step_items,
        "max_grammar_size": current.grammar_size,
    }
