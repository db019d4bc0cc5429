"""`import anylogits` must not import any backend library."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

BACKENDS = (
    "transformers",
    "vllm",
    "mlx",
    "mlx_lm",
    "llama_cpp",
    "tokenizers",
    "gguf",
    "llguidance",
    "fastapi",
    "openai",
)


def test_import_anylogits_imports_no_backend() -> None:
    code = (
        "import json, sys, anylogits, anylogits.core, anylogits.processors, anylogits.serving; "
        f"print(json.dumps([m for m in {list(BACKENDS)!r} if m in sys.modules]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []


def test_catalogue_names_are_importable_from_the_top_level() -> None:
    import anylogits
    import anylogits.processors

    names = set(anylogits.processors.__all__)
    assert {"TopK", "RepetitionPenalty", "JSONSchema", "Watermark", "StopStrings"} <= names
    for name in names:
        assert getattr(anylogits, name) is getattr(anylogits.processors, name), name
        assert name in anylogits.__all__, name
    assert callable(anylogits.detect_watermark)


def test_factories_are_listed_but_loaded_lazily() -> None:
    import anylogits

    assert "for_transformers" in dir(anylogits)
    assert "for_transformers" in anylogits.__all__


def test_a_structured_processor_is_built_without_torch_compile() -> None:
    # llguidance.torch decorates with torch.compile, which imports Dynamo: ~2 s of a
    # process's first JSONSchema(...). The bitmask is filled and applied without it.
    pytest.importorskip("llguidance")
    code = (
        "import json, sys; from anylogits import JSONSchema, Regex; "
        "JSONSchema({'type': 'object', 'properties': {'a': {'type': 'string'}}}); "
        "Regex('[0-9]+'); "
        "print(json.dumps([m for m in ('torch._dynamo', 'llguidance.torch') if m in sys.modules]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []
