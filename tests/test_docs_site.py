"""The documentation site's generated pages cover the whole catalogue, and the Python
examples of its pages run (those that need no backend; docs/authoring.md has its own
test). The site itself is built by ``nox -s docs``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from docs.hooks.catalogue import catalogue_markdown, reference_markdown

import anylogits
from anylogits.adapters.from_transformers import TransformersProcessor
from anylogits.core.registry import registered_type
from anylogits.core.specs import constructor_parameters
from test_support.catalogue import catalogue_classes

DOCS = Path(__file__).parents[1] / "docs"
# Blocks that load a model or talk to a server; the backends' sessions run
# docs/authoring.md, which does both for real.
NEEDS_A_BACKEND = re.compile(r"\b(transformers|vllm|llama_cpp|mlx_lm|openai)\b")


def sections(markdown: str) -> dict[str, str]:
    """The catalogue page's sections, by the spec name in their heading."""
    parts = re.split(r"^### `([\w.]+)` \{#[\w.]+\}$", markdown, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_catalogue_page_lists_every_processor_and_its_parameters() -> None:
    expected = {**catalogue_classes(), TransformersProcessor.spec_name: "TransformersProcessor"}
    page = sections(catalogue_markdown())
    assert set(page) == set(expected)
    for spec_name, class_name in expected.items():
        assert f"[`{class_name}`]" in page[spec_name]
        cls = registered_type(spec_name)
        assert cls is not None
        for name, parameter in constructor_parameters(cls).items():
            default = (
                "required" if parameter.default is parameter.empty else f"`{parameter.default!r}`"
            )
            row = rf"^\| `{name}` \|.*\| {re.escape(default)} \|$"
            assert re.search(row, page[spec_name], re.M), f"{spec_name}: {name}, {default}"


def test_the_processor_reference_documents_every_exported_processor() -> None:
    page = reference_markdown()
    documented = {
        name for members in re.findall(r"members: \[(.*)\]", page) for name in members.split(", ")
    }
    assert set(anylogits.processors.__all__) <= documented
    assert {"detect_watermark", "WatermarkDetection"} <= documented


def python_blocks() -> list[tuple[str, str]]:
    blocks = []
    for page in sorted(DOCS.glob("**/*.md")):
        if page.name == "authoring.md":
            continue
        for block in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S):
            if not NEEDS_A_BACKEND.search(block):
                blocks.append((str(page.relative_to(DOCS)), block))
    return blocks


BLOCKS = python_blocks()


@pytest.mark.parametrize(
    ("page", "block"), BLOCKS, ids=[f"{page}-{i}" for i, (page, _) in enumerate(BLOCKS)]
)
def test_the_pages_python_examples_run(page: str, block: str) -> None:
    exec(compile(block, page, "exec"), {"__name__": "docs_example"})


def test_links_to_pages_the_build_writes_say_so_where_the_markdown_is_read_alone() -> None:
    """A relative link to a Markdown page resolves to a file, or to a page the site build
    writes (the catalogue, the processor reference), and then the line says so: on
    GitHub, where those pages are not, the reader learns where the content is."""
    root = Path(__file__).parents[1]
    generated = {"catalogue.md", "reference/processors.md"}
    pages = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").rglob("*.md"))]
    for page in pages:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            for target in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)", line):
                resolved = (page.parent / target).resolve()
                if resolved.exists():
                    continue
                relative = resolved.relative_to((root / "docs").resolve()).as_posix()
                assert relative in generated, f"{page.name}:{number + 1} links to {target}"
                nearby = " ".join(lines[number : number + 2])
                assert "built" in nearby or "build" in nearby, (page.name, number + 1, line)
