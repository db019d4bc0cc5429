"""``anylogits list``: every processor type a spec can name, its parameters, and which
backends pass which conformance level (from the support matrix the package ships).

Without plugins, the catalogue's part comes from ``catalogue.json``, which the package
ships beside the support matrix: the command then answers without importing torch. The
file records a digest of the sources it was written from and is used only while they
match (``python -m anylogits.cli.listing --write`` writes it again).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import re
import sys
import textwrap
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anylogits.core import registry
from anylogits.support import LEVEL_MEANINGS, cell_text, packaged_support_matrix

if TYPE_CHECKING:
    from anylogits.core.processor import LogitsProcessor

NOT_IN_MATRIX = "not in the matrix"


def docstring_summary(cls: type[LogitsProcessor]) -> str:
    """The first paragraph of the class's docstring, on one line."""
    paragraph = (inspect.getdoc(cls) or "").split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def _parameter(name: str, parameter: inspect.Parameter) -> dict[str, Any]:
    """A constructor parameter: its type as written in the signature, and its default as
    JSON (what a spec would send), or as ``default_repr`` when the default has no JSON
    form (a plugin's, say)."""
    described: dict[str, Any] = {"name": name}
    if parameter.annotation is not parameter.empty:
        annotation = parameter.annotation
        described["type"] = (
            annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
        )
    if parameter.default is parameter.empty:
        return {**described, "required": True}
    try:
        json.dumps(parameter.default)
    except (TypeError, ValueError):
        return {**described, "required": False, "default_repr": repr(parameter.default)}
    default = json.loads(json.dumps(parameter.default))
    return {**described, "required": False, "default": default}


def _origin(spec_name: str, cls: type[LogitsProcessor]) -> str:
    declared = registry.available_entry_points().get(spec_name)
    if declared:
        return registry.entry_point_origin(declared[0])
    return cls.__module__


PACKAGED_CATALOGUE = "catalogue.json"
# What a type's listing is made of, inside the package: the classes, how their parameters
# are read, and this module.
CATALOGUE_SOURCES = (
    "processors",
    "adapters/from_transformers.py",
    "core/specs.py",
    "cli/listing.py",
)


def catalogue_digest() -> str:
    """A digest of the sources the catalogue's listing is made of."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for source in CATALOGUE_SOURCES:
        path = package / source
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(package).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


def _described(spec_name: str, cls: type[LogitsProcessor]) -> dict[str, Any]:
    from anylogits.core.specs import constructor_parameters

    return {
        "spec_name": spec_name,
        "class": cls.__name__,
        "origin": _origin(spec_name, cls),
        "summary": docstring_summary(cls),
        "parameters": [
            _parameter(name, parameter) for name, parameter in constructor_parameters(cls).items()
        ],
    }


def registered_types() -> list[dict[str, Any]]:
    """Every registered type a spec may name (plugins loaded), described."""
    return [
        _described(spec_name, cls)
        for spec_name, cls in sorted(registry.registered_processors().items())
        if registry.offered(spec_name)  # else its specs name an object of one process
    ]


def packaged_types() -> list[dict[str, Any]] | None:
    """The catalogue's types as ``catalogue.json`` describes them, or ``None`` where that
    is not the whole answer: a plugin may add types, or the sources changed since."""
    if (
        registry.listed_modules()
        or registry.available_entry_points()
        or registry.defined_elsewhere()
    ):
        return None
    try:
        text = resources.files("anylogits").joinpath(PACKAGED_CATALOGUE).read_text("utf-8")
    except FileNotFoundError:
        return None
    packaged = json.loads(text)
    if packaged["digest"] != catalogue_digest():
        return None
    types: list[dict[str, Any]] = packaged["types"]
    return types


def write_packaged_catalogue(path: Path) -> None:
    """Write ``catalogue.json`` from the registered catalogue (no plugins)."""
    elsewhere = registry.defined_elsewhere()
    types = [entry for entry in registered_types() if entry["spec_name"] not in elsewhere]
    catalogue = {"digest": catalogue_digest(), "types": types}
    path.write_text(json.dumps(catalogue, indent=1, ensure_ascii=False) + "\n", "utf-8")


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
    types = packaged_types()
    entries = []
    for described in types if types is not None else registered_types():
        row = matrix["processors"].get(described["spec_name"])
        support = (
            {
                name: {**row["support"][name], "text": cell_text(row["support"][name])}
                for name in wanted
            }
            if row is not None
            else None
        )
        entries.append({**described, "support": support})
    return entries


# Mappings keyed by token id: JSON keys are strings, so a spec writes the ids as strings.
_TOKEN_KEYS = ("dict[int", "Mapping[int")
# The spec types that need llguidance (anylogits[structured]).
_NEEDS_LLGUIDANCE = "anylogits.processors.structured"


def _parameter_text(parameter: dict[str, Any]) -> str:
    text = parameter["name"]
    kind = parameter.get("type")
    if kind:
        text += f": {kind}"
    if parameter["required"]:
        text += " (required"
        text += "; token ids as strings in JSON)" if kind and kind.startswith(_TOKEN_KEYS) else ")"
        return text
    if "default" in parameter:
        return f"{text} = {json.dumps(parameter['default'])}"
    return f"{text} = {parameter['default_repr']}"


def plain(text: str) -> str:
    """A docstring's reST as plain text: ````code```` and ``:role:`~a.b.Name``` lose their
    markup (the terminal shows no markup)."""
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?([\w]+)`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def format_entries(entries: list[dict[str, Any]], levels: list[str]) -> str:
    """The human-readable listing of :func:`catalogue_entries`."""
    blocks = []
    for entry in entries:
        lines = [f"{entry['spec_name']}  ({entry['class']}, {entry['origin']})"]
        if entry["summary"]:
            lines += textwrap.wrap(
                plain(entry["summary"]), 88, initial_indent="  ", subsequent_indent="  "
            )
        if entry["origin"].startswith(_NEEDS_LLGUIDANCE):
            lines.append('  needs llguidance: pip install "anylogits[structured]"')
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m anylogits.cli.listing",
        description=f"Write {PACKAGED_CATALOGUE}, the catalogue anylogits list reads.",
    )
    parser.add_argument("--write", action="store_true", required=True)
    parser.parse_args(argv)
    path = Path(__file__).resolve().parent.parent / PACKAGED_CATALOGUE
    write_packaged_catalogue(path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
