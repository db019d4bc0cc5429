"""`anylogits list` and `anylogits --version`, and the support matrix the package ships."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_registry import install_distribution

import anylogits
from anylogits.cli import listing
from anylogits.cli.listing import (
    NOT_IN_MATRIX,
    PACKAGED_CATALOGUE,
    catalogue_digest,
    catalogue_entries,
    packaged_types,
    registered_types,
)
from anylogits.core import registry
from anylogits.core.registry import registered_processors
from anylogits.core.specs import constructor_parameters
from anylogits.support import packaged_support_matrix, render_markdown
from test_support import child_environment
from test_support.catalogue import catalogue_classes

ROOT = Path(__file__).parents[1]
MATRIX_PAGE = ROOT / "docs" / "support-matrix.md"


def run_cli(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "anylogits", *arguments],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def page_cells() -> dict[str, dict[str, str]]:
    """Class name -> backend -> cell text, read from docs/support-matrix.md's table."""
    rows = [line for line in MATRIX_PAGE.read_text().splitlines() if line.startswith("|")]
    backends = [name.strip() for name in rows[0].strip("|").split("|")][1:]
    cells = {}
    for row in rows[2:]:
        name, *texts = (text.strip() for text in row.strip("|").split("|"))
        cells[name.strip("`")] = dict(zip(backends, texts, strict=True))
    return cells


def test_the_packaged_matrix_is_the_docs_page() -> None:
    """Both come from the same records (`nox -s matrix` writes both): a page edited or
    regenerated without the JSON fails here."""
    assert render_markdown(packaged_support_matrix()) == MATRIX_PAGE.read_text()


def test_list_json_names_every_registered_type_with_the_page_s_cells() -> None:
    result = run_cli("list", "--json")
    assert result.returncode == 0, result.stderr
    entries = {entry["spec_name"]: entry for entry in json.loads(result.stdout)}
    assert set(entries) >= set(catalogue_classes())
    cells = page_cells()
    assert {entry["class"] for entry in entries.values() if entry["support"]} == set(cells)
    for entry in entries.values():
        if entry["support"] is not None:
            texts = {backend: cell["text"] for backend, cell in entry["support"].items()}
            assert texts == cells[entry["class"]], entry["spec_name"]
            for cell in entry["support"].values():
                if cell["status"] == "pass":
                    # A passing cell may carry the known gaps of some of its tests.
                    gaps = "; known gap: " + "; ".join(cell["notes"]) if cell["notes"] else ""
                    assert cell["text"] == f"pass ({', '.join(cell['levels'])}){gaps}"


def test_entries_are_the_registry_with_constructor_defaults() -> None:
    entries = {entry["spec_name"]: entry for entry in catalogue_entries()}
    offered = {name: cls for name, cls in registered_processors().items() if registry.offered(name)}
    assert set(entries) == set(offered)
    for name, cls in offered.items():
        parameters = constructor_parameters(cls)
        assert [p["name"] for p in entries[name]["parameters"]] == list(parameters)
        for listed in entries[name]["parameters"]:
            default = parameters[listed["name"]].default
            assert listed["required"] == (default is parameters[listed["name"]].empty)
            if not listed["required"]:
                assert listed["default"] == json.loads(json.dumps(default))  # a spec's form


def test_list_text_shows_parameters_defaults_and_levels() -> None:
    result = run_cli("list", "--backend", "vllm")
    assert result.returncode == 0, result.stderr
    block = result.stdout.split("\n\n")
    top_k = next(text for text in block if text.startswith("top_k "))
    assert "(TopK, anylogits.processors.truncation)" in top_k
    assert "top_k: int (required), min_tokens_to_keep: int = 1" in top_k
    assert re.search(r"^  vllm +" + re.escape(page_cells()["TopK"]["vllm"]) + "$", top_k, re.M)
    assert "transformers " not in top_k


def test_list_refuses_a_backend_outside_the_matrix() -> None:
    result = run_cli("list", "--backend", "onnx")
    assert result.returncode == 1
    assert "backend 'onnx' is not in the support matrix" in result.stderr
    assert "'vllm'" in result.stderr


@pytest.mark.parametrize("how", ["module", "entry point"])
def test_plugin_types_are_listed_as_not_in_the_matrix(how: str, tmp_path: Path) -> None:
    env = child_environment()
    env.pop("ANYLOGITS_PLUGINS", None)
    if how == "module":
        env["ANYLOGITS_PLUGINS"] = "test_support.probes"
        name, origin = "testing.reverse_ranks", "test_support.probes"
    else:
        install_distribution(tmp_path, {"demo_bias": "anylogits_demo_plugin:DemoBias"})
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
        name, origin = "demo_bias", "(distribution anylogits-demo-plugin 0.1)"
    listed = run_cli("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    entry = next(entry for entry in json.loads(listed.stdout) if entry["spec_name"] == name)
    assert entry["support"] is None
    assert origin in entry["origin"]
    text = run_cli("list", env=env).stdout
    block = next(block for block in text.split("\n\n") if block.startswith(f"{name} "))
    assert f"support: {NOT_IN_MATRIX}" in block


def test_version_names_anylogits_and_torch() -> None:
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"anylogits {anylogits.__version__} (torch {torch.__version__})"


def test_the_packaged_catalogue_is_the_registry() -> None:
    # `anylogits list` reads it instead of importing torch; were it stale (a processor
    # changed), list would import the catalogue after all: this test names the fix.
    packaged = json.loads((ROOT / "src" / "anylogits" / PACKAGED_CATALOGUE).read_text())
    rewrite = "run: python -m anylogits.cli.listing --write"
    assert packaged["digest"] == catalogue_digest(), rewrite
    ours = [entry for entry in registered_types() if entry["origin"].startswith("anylogits.")]
    assert packaged["types"] == ours, rewrite


def test_list_answers_from_the_packaged_catalogue_without_torch() -> None:
    if registry.available_entry_points():
        pytest.skip(
            "an installed plugin (the example's, in a backend's session) is listed by importing it"
        )
    env = child_environment()
    env.pop("ANYLOGITS_PLUGINS", None)
    code = (
        "import sys; from anylogits.cli import main; code = main(['list', '--json']); "
        "print('torch' in sys.modules, file=sys.stderr); sys.exit(code)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "False"
    # What this process lists, less the test suite's own types.
    registered = [e for e in catalogue_entries() if e["origin"].startswith("anylogits.")]
    assert json.loads(result.stdout) == registered


def test_a_plugin_or_a_changed_source_lists_from_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # This process's own test types (and a session's installed plugin) stand for none
    # here, then for one.
    monkeypatch.setattr(registry, "defined_elsewhere", lambda: [])
    monkeypatch.setattr(registry, "available_entry_points", dict)
    monkeypatch.delenv("ANYLOGITS_PLUGINS", raising=False)
    assert packaged_types() is not None
    monkeypatch.setattr(registry, "available_entry_points", lambda: {"mine": []})
    assert packaged_types() is None
    monkeypatch.setattr(registry, "available_entry_points", dict)
    monkeypatch.setenv("ANYLOGITS_PLUGINS", "json")
    assert packaged_types() is None
    monkeypatch.delenv("ANYLOGITS_PLUGINS")
    monkeypatch.setattr(registry, "defined_elsewhere", lambda: ["mine"])
    assert packaged_types() is None
    monkeypatch.setattr(registry, "defined_elsewhere", lambda: [])
    monkeypatch.setattr(listing, "catalogue_digest", lambda: "another digest")
    assert packaged_types() is None


def test_list_text_is_plain_with_types_and_the_llguidance_mark() -> None:
    """No reST in a terminal; a parameter's type (a token-id mapping says its keys are
    strings in JSON); the types that need llguidance say so, as check-spec does."""
    result = run_cli("list")
    assert result.returncode == 0, result.stderr
    blocks = {text.split()[0]: text for text in result.stdout.split("\n\n")}
    assert "``" not in result.stdout and ":class:`" not in result.stdout
    assert "Generated text is exactly one of choices." in blocks["choice"]
    assert (
        "bias: dict[int | str, float] (required; token ids as strings in JSON)"
        in blocks["logit_bias"]
    )
    for name in ("json_schema", "regex", "choice", "grammar"):
        assert 'needs llguidance: pip install "anylogits[structured]"' in blocks[name], name
    assert "needs llguidance" not in blocks["top_k"]
