"""Specs: the plain-dict wire format of processors (per-request engine arguments, JSON
files)."""

from __future__ import annotations

import contextlib
import inspect
import json
import math
from collections.abc import Sequence
from typing import Any

from anylogits.core.cache import BoundedCache
from anylogits.core.limits import (
    building_checked_spec,
    building_from_request,
    check_size,
    client_side,
    limits,
)
from anylogits.core.processor import LogitsProcessor, build_specs_with
from anylogits.core.registry import processor_type


def constructor_parameters(cls: type[LogitsProcessor]) -> dict[str, inspect.Parameter]:
    """The keyword parameters a spec may set for ``cls`` (kept: not to be changed)."""
    found = _PARAMETERS.get(cls)
    if found is None:
        signature = inspect.signature(cls.__init__)
        found = _PARAMETERS[cls] = {
            name: parameter
            for name, parameter in signature.parameters.items()
            if name != "self"
            and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        }
    return found


# Every spec's build looks its class's parameters up (inspect.signature costs ~10 us).
_PARAMETERS: dict[type, dict[str, inspect.Parameter]] = {}


#: Where a value sits inside a spec, built only when an error names it: ``None`` for the
#: top, else ``(the parent's link, a dict key or a list index)``.
PathLink = tuple[Any, Any] | None


def format_path(where: str, link: PathLink) -> str:
    """``where`` followed by the keys and indexes of ``link``: ``schema['a'][0]``."""
    steps = []
    while link is not None:
        link, step = link
        steps.append(f"[{step}]" if isinstance(step, int) else f"[{step!r}]")
    return where + "".join(reversed(steps))


_SCALARS = (str, int, bool, type(None))


def check_json_value(value: Any, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` unless ``value`` is plain, finite JSON nested
    at most ``limits().spec_depth`` deep.

    An engine may hang on a non-JSON value in a request's arguments, so specs are checked
    before they can reach one. The walk is iterative: a value nested thousands deep gets this
    error, not a ``RecursionError``. Only containers are queued and a path is formatted
    only for an error (a 900 KB schema is walked in ~10 ms).
    """
    depth_limit = limits().spec_depth
    pending: list[tuple[Any, PathLink, int]] = [(value, None, 0)]
    while pending:
        item, link, depth = pending.pop()
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    raise key_type_error(where, link, key)
            children: Any = item.items()
        elif isinstance(item, (list, tuple)):
            children = enumerate(item)
        else:
            check_json_scalar(item, where, link)
            continue
        if depth >= depth_limit:
            raise depth_error(where, link, depth_limit)
        for key, child in children:
            kind = type(child)
            if kind is str or kind is int or kind is bool or child is None:
                continue
            if kind is float and math.isfinite(child):
                continue
            pending.append((child, (link, key), depth + 1))


def key_type_error(where: str, link: PathLink, key: Any) -> ValueError:
    """The error of a dict key that is not a string (JSON's keys are)."""
    return ValueError(
        f"{format_path(where, link)} has the key {key!r} of type "
        f"{type(key).__name__}; spec dict keys must be strings"
    )


def depth_error(where: str, link: PathLink, limit: int) -> ValueError:
    """The error of a value nested deeper than ``limits().spec_depth``."""
    return ValueError(
        f"{format_path(where, link)} nests lists or dicts more than {limit} "
        "deep (anylogits limit 'spec_depth')"
    )


def check_json_scalar(item: Any, where: str, link: PathLink) -> None:
    """Raise ``ValueError`` unless ``item`` (at ``link`` in ``where``) is a JSON scalar."""
    if isinstance(item, _SCALARS):
        return
    if isinstance(item, float):
        if not math.isfinite(item):
            raise ValueError(
                f"{format_path(where, link)} is {item!r}; spec values must be finite numbers"
            )
        return
    raise ValueError(
        f"{format_path(where, link)} is a {type(item).__name__} ({item!r}); spec values "
        "must be JSON (None, bool, int, float, str, list, dict)"
    )


def load_json(text: str, where: str) -> Any:
    """``json.loads(text)``, bounded: ``ValueError`` naming ``where`` when the text is
    longer than ``limits().spec_bytes`` or is not JSON (nesting too deep for the parser
    included)."""
    check_size(where, len(text.encode("utf-8", errors="replace")), "spec_bytes", "bytes")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is a string but not valid JSON: {error}") from None
    except RecursionError:
        raise ValueError(
            f"{where} nests lists or dicts too deep to parse (anylogits limit 'spec_depth' "
            f"is {limits().spec_depth})"
        ) from None


def from_spec(spec: dict[str, Any] | str) -> LogitsProcessor:
    """Build a processor from its spec: a dict ``{"type": name, **arguments}`` or its JSON.

    Raises ``ValueError`` naming the bad field when the type is unknown, a field is not an
    argument of that processor, or a value is not plain JSON.
    """
    if isinstance(spec, str):
        spec = load_json(spec, "spec")
    if not isinstance(spec, dict):
        raise ValueError(f"a spec must be a dict with a 'type' field, got {type(spec).__name__}")
    check_json_value(spec, "spec")
    return _build(spec)


def _build(spec: dict[str, Any], checked_as: tuple[str, int] | None = None) -> LogitsProcessor:
    """The processor of ``spec``, a dict of plain JSON; ``checked_as``: a key that
    determines it, where it was checked as part of a request (see :func:`build_specs`)."""
    fields = dict(spec)
    kind = fields.pop("type", None)
    cls = processor_type(kind)
    parameters = constructor_parameters(cls)
    unknown = sorted(set(fields) - set(parameters))
    if unknown:
        raise ValueError(
            f"spec for {kind!r} has unknown field(s) {unknown}; its fields are {sorted(parameters)}"
        )
    missing = sorted(
        name
        for name, parameter in parameters.items()
        if parameter.default is parameter.empty and name not in fields
    )
    if missing:
        raise ValueError(f"spec for {kind!r} is missing required field(s) {missing}")
    checked = (
        contextlib.nullcontext() if checked_as is None else building_checked_spec(cls, checked_as)
    )
    try:
        with building_from_request(), checked:
            return cls(**fields)
    except ValueError:
        raise
    except Exception as error:
        # A spec is untrusted input: whatever a constructor trips over is a bad spec.
        raise ValueError(
            f"spec for {kind!r} is not usable: {type(error).__name__}: {error}"
        ) from None


def _build_checked(spec: Any, text: str, index: int) -> LogitsProcessor:
    """The processor of ``spec``, the ``index``-th of the specs :func:`parse_specs`
    checked as ``text``: not walked again."""
    if not isinstance(spec, dict):
        return from_spec(spec)  # a spec's JSON text inside the list, or not a spec
    return _build(spec, (text, index))


def to_specs(processors: list[LogitsProcessor]) -> list[dict[str, Any]]:
    """The specs of several processors, each checked to be plain JSON."""
    specs = [processor.to_spec() for processor in processors]
    for index, spec in enumerate(specs):
        check_json_value(spec, f"specs[{index}]")
    return specs


class CheckedSpecs(list[dict[str, Any]]):
    """The specs :func:`parse_specs` checked, and ``text``, what they were checked as (the
    request's text, or their JSON), which determines them: :func:`build_specs` builds
    them as checked, so they are not to be changed.

    :func:`around_checked` puts a server's own specs around them; ``checked`` is then
    the slice of the list that was checked as ``checked_text``."""

    def __init__(
        self,
        specs: list[dict[str, Any]],
        text: str,
        checked: slice | None = None,
        checked_text: str | None = None,
    ) -> None:
        super().__init__(specs)
        self.text = text
        self.checked = checked if checked is not None else slice(0, len(specs))
        self.checked_text = checked_text if checked_text is not None else text


def around_checked(
    before: Sequence[dict[str, Any]], specs: CheckedSpecs, after: Sequence[dict[str, Any]]
) -> CheckedSpecs:
    """``specs`` with a server's own specs before and after them (a request's generation
    config as processors): ``specs`` are still built as checked, and the whole is keyed
    by all three."""
    if not before and not after:
        return specs
    # Two JSON values: no client's text (one value) is this key, and the first newline
    # ends the server's part (compact JSON has none).
    around = json.dumps([before, after], sort_keys=True, separators=(",", ":"))
    checked = slice(len(before) + specs.checked.start, len(before) + specs.checked.stop)
    return CheckedSpecs(
        [*before, *specs, *after], f"{around}\n{specs.text}", checked, specs.checked_text
    )


def parse_specs(value: Any, where: str) -> CheckedSpecs:
    """The checked specs of one request, from what a client sent: a list of spec dicts,
    one spec dict, or their JSON text (servers that carry only flat values send text).

    Bounded before anything is built (processors per request, JSON depth and size), and
    every spec must build: raises ``ValueError`` naming the bad field, e.g.
    ``{where}[1]: spec field 'type' is ...``. Specs that built before, as the same text
    under the same limits, are not built again (:data:`BUILT_SPECS`).
    """
    text = value if isinstance(value, str) else None
    specs = load_json(value, where) if text is not None else value
    if isinstance(specs, dict):
        specs = [specs]
    if text is not None and _built_before(text):
        return CheckedSpecs(specs, text)
    if not isinstance(specs, list):
        raise ValueError(
            f"{where} must be a list of processor specs (dicts with a 'type' field), got "
            f"{type(specs).__name__}; build it with anylogits.to_specs(...)"
        )
    check_size(where, len(specs), "processors", "processors")
    check_json_value(specs, where)
    dumped = json.dumps(specs)
    check_size(where, len(dumped), "spec_bytes", "bytes of JSON")
    if text is None:
        text = dumped
        if _built_before(text):
            return CheckedSpecs(specs, text)
    for index, spec in enumerate(specs):
        try:
            _build_checked(spec, text, index)
        except Exception as error:  # untrusted input: any failure is a bad request
            raise ValueError(f"{where}[{index}]: {error}") from None
    BUILT_SPECS.put(_built_key(text), True, weight=len(text))
    return CheckedSpecs(specs, text)


def build_specs(specs: Sequence[dict[str, Any]]) -> list[LogitsProcessor]:
    """The processors of ``specs``, each :func:`from_spec`'s; those of :func:`parse_specs`
    (its :class:`CheckedSpecs`) are built as checked there: not walked again, and a
    structured processor takes the grammar its spec's check made."""
    if isinstance(specs, CheckedSpecs):
        first = specs.checked.start
        return [
            _build_checked(spec, specs.checked_text, index - first)
            if first <= index < specs.checked.stop
            else from_spec(spec)
            for index, spec in enumerate(specs)
        ]
    return [from_spec(spec) for spec in specs]


# The specs that built, by their text (as sent, or their JSON) and what they were checked
# under: a server sees a client's specs again and again (vLLM checks each request's in
# its frontend and again in its engine), and building them can cost milliseconds (a JSON
# schema checked and turned into a grammar). Only successes are kept: a refusal can be
# the machine's (a grammar's check out of memory) and costs little to find again.
BUILT_SPECS = BoundedCache(max_entries=1024, max_weight=64 << 20)


def _built_key(text: str) -> tuple[str, Any, bool]:
    # A client's check may lack an engine the server has (llguidance): it vouches for
    # client-side checks only.
    return (text, limits(), client_side())


def _built_before(text: str) -> bool:
    return BUILT_SPECS.get(_built_key(text)) is not None


# ``SomeProcessor.from_spec(spec)`` builds through this module's from_spec.
build_specs_with(from_spec)
