"""``anylogits list``: every processor type a spec can name, its parameters, and which
backends pass which conformance level (from the support matrix the package ships)."""

from __future__ import annotations

import inspect
import json
import sys
import textwrap
from typing import Any

from anylogits.core import registry
from anylogits.core.processor import LogitsProcessor
from anylogits.core.registry import registered_processors
from anylogits.core.specs import constructor_parameters
from anylogits.support import LEVEL_MEANINGS, cell_text, packaged_support_matrix

NOT_IN_MATRIX = "not in the matrix"


def docstring_summary(cls: type[LogitsProcessor]) -> str:
    """The first paragraph of the class's docstring, on one line."""
    paragraph = (inspect.getdoc(cls) or "").split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def _parameter(name: str, parameter: inspect.Parameter) -> dict[str, Any]:
    """A constructor parameter: its default as JSON (what a spec would send), or as
    ``default_repr`` when the default has no JSON form (a plugin's, say)."""
    if parameter.default is parameter.empty:
        return {"name": name, "required": True}
    try:
        json.dumps(parameter.default)
    except (TypeError, ValueError):
        return {"name": name, "required": False, "default_repr": repr(parameter.default)}
    return {"name": name, "required": False, "default": parameter.default}


def _origin(spec_name: str, cls: type[LogitsProcessor]) -> str:
    declared = registry.available_entry_points().get(spec_name)
    if declared:
        return registry.entry_point_origin(declared[0])
    return cls.__module__


def catalogue_entries(backend: str | None = None) -> list[dict[str, Any]]:
    """One entry per registered processor type (plugins loaded), by spec name: its class,
    origin, summary, parameters, and its support matrix cells (``None`` for a type the
    matrix does not cover). ``backend`` keeps that backend's cells only; ``ValueError``
    naming the known backends when the matrix has no such column."""
    matrix = packaged_support_matrix()
    backends = matrix["backends"]
    if backend is not None and backend not in backends:
        raise ValueError(
            f"backend {backend!r} is not in the support matrix; its backends are {backends}"
        )
    wanted = backends if backend is None else [backend]
    entries = []
    for spec_name, cls in sorted(registered_processors().items()):
        if not registry.offered(spec_name):
            continue  # its specs name an object of one process: never written by hand
        row = matrix["processors"].get(spec_name)
        support = (
            {
                name: {**row["support"][name], "text": cell_text(row["support"][name])}
                for name in wanted
            }
            if row is not None
            else None
        )
        entries.append(
            {
                "spec_name": spec_name,
                "class": cls.__name__,
                "origin": _origin(spec_name, cls),
                "summary": docstring_summary(cls),
                "parameters": [
                    _parameter(name, parameter)
                    for name, parameter in constructor_parameters(cls).items()
                ],
                "support": support,
            }
        )
    return entries


def _parameter_text(parameter: dict[str, Any]) -> str:
    if parameter["required"]:
        return f"{parameter['name']} (required)"
    if "default" in parameter:
        return f"{parameter['name']}={json.dumps(parameter['default'])}"
    return f"{parameter['name']}={parameter['default_repr']}"


def format_entries(entries: list[dict[str, Any]], levels: list[str]) -> str:
    """The human-readable listing of :func:`catalogue_entries`."""
    blocks = []
    for entry in entries:
        lines = [f"{entry['spec_name']}  ({entry['class']}, {entry['origin']})"]
        if entry["summary"]:
            lines += textwrap.wrap(
                entry["summary"], 88, initial_indent="  ", subsequent_indent="  "
            )
        parameters = ", ".join(map(_parameter_text, entry["parameters"])) or "none"
        lines += textwrap.wrap(
            f"parameters: {parameters}", 88, initial_indent="  ", subsequent_indent="    "
        )
        if entry["support"] is None:
            lines.append(f"  support: {NOT_IN_MATRIX}")
        else:
            width = max(map(len, entry["support"]))
            lines += [
                f"  {backend:<{width}}  {cell['text']}"
                for backend, cell in entry["support"].items()
            ]
        blocks.append("\n".join(lines))
    legend = "Support levels: " + "; ".join(f"{level}: {LEVEL_MEANINGS[level]}" for level in levels)
    legend += f". Types beyond the catalogue (plugins) are {NOT_IN_MATRIX}."
    return "\n\n".join([*blocks, "\n".join(textwrap.wrap(legend, 88))]) + "\n"


def run_list(*, backend: str | None, as_json: bool) -> int:
    """``anylogits list``: print the catalogue; 1 with the error when a plugin fails to
    load or the backend is not in the matrix."""
    try:
        entries = catalogue_entries(backend)
    except ValueError as error:
        print(f"anylogits list: {error}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(entries, indent=1))
    else:
        print(format_entries(entries, packaged_support_matrix()["levels"]), end="")
    return 0
