"""The Catalogue page and the processors' API reference, written from the spec registry
and the package's exports each time the site builds.

Every processor class anylogits registers under a ``spec_name`` gets an entry: its spec
name, its class (linked to the API reference), the constructor parameters a spec may set
with their defaults, and the first paragraph of its docstring. A processor added to the
registry appears here without anyone editing a page, and one the API reference does not
document fails the build (the class link cannot resolve). The reference page documents
what ``anylogits`` exports from ``anylogits.processors``, module by module.
"""

from __future__ import annotations

import inspect
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files

    from anylogits import LogitsProcessor

PAGE = "catalogue.md"
REFERENCE_PAGE = "reference/processors.md"
ROLE = re.compile(r":\w+:`~?\.?([\w.]+)`")

INTRODUCTION = """\
# Catalogue

Every processor that ships with anylogits, generated from the spec registry
(`anylogits.core.specs`) when this site was built. A processor's *spec* is
`{"type": <spec name>, <parameter>: <value>, ...}`, with the parameters below: it is what
`processor.to_spec()` returns, what `anylogits.from_spec()` builds, and what a vLLM
request carries. Parameters without a default are required. Which backend passes which
level of the conformance suite for each processor: [support matrix](support-matrix.md).
"""


def builtin_processors() -> dict[str, type[LogitsProcessor]]:
    """Every processor class anylogits itself registers, by spec name (plugins' classes,
    which the registry also holds once loaded, are left out)."""
    import anylogits  # noqa: F401  (registers the catalogue and the adapters' wire types)
    from anylogits.core.registry import registered_processors

    return {
        name: cls
        for name, cls in registered_processors().items()
        if cls.__module__.startswith(("anylogits.processors.", "anylogits.adapters."))
    }


def first_paragraph(cls: type[LogitsProcessor]) -> str:
    """The docstring's first paragraph on one line (as ``anylogits list`` shows it), reST
    roles as code."""
    from anylogits.cli.listing import docstring_summary

    return ROLE.sub(lambda match: f"`{match[1]}`", docstring_summary(cls))


def parameter_rows(cls: type[LogitsProcessor]) -> list[str]:
    from anylogits.core.specs import constructor_parameters

    rows = []
    for name, parameter in constructor_parameters(cls).items():
        annotation = parameter.annotation
        kind = "" if annotation is parameter.empty else f"`{_text(annotation)}`"
        default = (
            "required"
            if parameter.default is parameter.empty
            else f"`{_cell(repr(parameter.default))}`"
        )
        rows.append(f"| `{name}` | {kind} | {default} |")
    return rows


def _text(annotation: Any) -> str:
    # Annotations are strings here (the modules use `from __future__ import annotations`).
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return _cell(text)


def _cell(text: str) -> str:
    """``text`` inside a table cell: a pipe would end the cell, even in code."""
    return text.replace("|", "\\|")


def reference(cls: type) -> str:
    """The class's identifier in the API reference, where it is documented under its
    defining module."""
    return f"{cls.__module__}.{cls.__qualname__}"


def catalogue_markdown() -> str:
    processors = builtin_processors()
    groups: dict[str, list[str]] = {}
    for name, cls in processors.items():
        groups.setdefault(cls.__module__, []).append(name)
    # The catalogue's modules first, the adapters' wire types after them.
    modules = sorted(groups, key=lambda module: (module.startswith("anylogits.adapters."), module))
    summary = ["| spec name | class | what it does |", "|---|---|---|"]
    sections = []
    for module in modules:
        sections.append(f"## `{module.removeprefix('anylogits.')}`\n")
        for name in groups[module]:
            cls = processors[name]
            summary.append(f"| [`{name}`](#{name}) | `{cls.__name__}` | {first_paragraph(cls)} |")
            rows = parameter_rows(cls)
            table = (
                ["| parameter | type | default |", "|---|---|---|", *rows]
                if rows
                else ["No parameters."]
            )
            sections.append(
                "\n".join(
                    [
                        f"### `{name}` {{#{name}}}",
                        "",
                        f"[`{cls.__name__}`][{reference(cls)}]: {first_paragraph(cls)}",
                        "",
                        *table,
                        "",
                    ]
                )
            )
    return "\n".join([INTRODUCTION, *summary, "", *sections])


def exported_processors() -> dict[str, list[str]]:
    """What ``anylogits`` exports from ``anylogits.processors``: names by defining module."""
    import anylogits

    modules: dict[str, list[str]] = {}
    for name in anylogits.__all__:
        if anylogits._LAZY[name].startswith("anylogits.adapters."):
            continue  # a factory: getting it imports its backend
        module = getattr(getattr(anylogits, name), "__module__", "")
        if module.startswith("anylogits.processors."):
            modules.setdefault(module, []).append(name)
    return modules


def reference_markdown() -> str:
    parts = [
        "# Processors",
        "",
        "The catalogue, module by module ([by spec name](../catalogue.md)). Every class is "
        "importable from `anylogits` itself.",
    ]
    for module, names in sorted(exported_processors().items()):
        members = ", ".join(sorted(names))
        parts += [
            "",
            f"::: {module}",
            "    options:",
            "      heading_level: 2",
            f"      members: [{members}]",
        ]
    return "\n".join(parts) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=catalogue_markdown()))
    files.append(File.generated(config, REFERENCE_PAGE, content=reference_markdown()))
    return files
