"""The limits page's table, written from ``anylogits.core.limits`` each time the site
builds: every limit, its default and why, as the code has them."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

PAGE = "limits.md"
MARKER = "<!-- limits table -->"


def limits_table() -> str:
    from anylogits.core.limits import REASONS, Limits

    rows = ["| limit | default | what it bounds, and why this default |", "|---|---|---|"]
    for field in dataclasses.fields(Limits):
        rows.append(f"| `{field.name}` | {field.default:,} | {REASONS[field.name]} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"docs/{PAGE} lost its {MARKER} line, where the table goes")
    return markdown.replace(MARKER, limits_table())
