"""A griffe extension: the docstrings' reST habits, read as the API reference shows them.

The docstrings are Google style, written for readers of the source, with two habits of
reST that Markdown would show as they are:

- Sphinx roles (:class:`~anylogits.Pipeline`, :func:`for_vllm`, ...): each becomes the
  object's name in code, linked where the reference documents it (an optional
  cross-reference: autorefs leaves it unlinked, without a warning, when the object has
  no page);
- ``Example:`` headings, which griffe reads as an admonition (only ``Examples:`` is its
  examples section, where ``>>>`` lines become code), and ``Example::`` followed by an
  indented literal block: both become an examples section, the literal block fenced.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Alias, Extension, GriffeLoader, Module, Object

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)\.?([\w.]+)`")
EXAMPLE = re.compile(r"^( *)Example:$", re.M)
LITERAL_EXAMPLE = re.compile(r"^( *)Example::\n\n((?:\1    .*\n|[ ]*\n)*(?:\1    .*))", re.M)


class DocstringRoles(Extension):
    def on_package(self, *, pkg: Module, loader: GriffeLoader, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                text = linked(obj.docstring.value, obj, loader)
                obj.docstring.value = EXAMPLE.sub(r"\1Examples:", fenced(text))


def fenced(text: str) -> str:
    """``Example::`` and its indented literal block as an examples section of Python code."""

    def fence(match: re.Match[str]) -> str:
        indent, block = match[1], match[2]
        return f"{indent}Examples:\n{indent}    ```python\n{block}\n{indent}    ```"

    return LITERAL_EXAMPLE.sub(fence, text)


def linked(text: str, scope: Object, loader: GriffeLoader) -> str:
    return ROLE.sub(lambda match: _link(match, scope, loader), text)


def _objects(obj: Object) -> list[Object]:
    found = [obj]
    for member in obj.members.values():
        if not isinstance(member, Alias):
            found.extend(_objects(member))
    return found


def _link(match: re.Match[str], scope: Object, loader: GriffeLoader) -> str:
    short, target = match[1], match[2]
    title = target.rsplit(".", 1)[-1] if short else target
    path = _canonical(_in_scope(target, scope), loader)
    return f'<autoref identifier="{path}" optional><code>{title}</code></autoref>'


def _in_scope(target: str, scope: Object) -> str:
    """The full path a name means where it is written (its module's imports and members)."""
    if target.startswith("anylogits."):
        return target
    first, _, rest = target.partition(".")
    try:
        resolved = scope.resolve(first)
    except Exception:  # griffe's NameResolutionError, or a name it cannot see
        return target
    return f"{resolved}.{rest}" if rest else resolved


def _canonical(path: str, loader: GriffeLoader) -> str:
    """Where the object is defined (``anylogits.Pipeline`` -> ``anylogits.core.pipeline
    .Pipeline``): the reference documents objects under their defining module."""
    try:
        found = loader.modules_collection[path]
        return found.final_target.path if isinstance(found, Alias) else found.path
    except Exception:  # not loaded, or an alias griffe cannot follow: link the name as given
        return path
