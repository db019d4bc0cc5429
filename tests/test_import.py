"""`import anylogits` must not import any backend library."""

from __future__ import annotations

import json
import subprocess
import sys

BACKENDS = (
    "transformers",
    "vllm",
    "mlx",
    "mlx_lm",
    "llama_cpp",
    "tokenizers",
    "gguf",
    "llguidance",
)


def test_import_anylogits_imports_no_backend() -> None:
    code = (
        "import json, sys, anylogits, anylogits.core, anylogits.processors; "
        f"print(json.dumps([m for m in {list(BACKENDS)!r} if m in sys.modules]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []


def test_catalogue_names_are_importable_from_the_top_level() -> None:
    import anylogits

    for name in (
        "Temperature",
        "TopK",
        "TopP",
        "MinP",
        "RepetitionPenalty",
        "NoRepeatNGram",
        "MinNewTokens",
        "LogitBias",
        "SuppressTokens",
    ):
        assert isinstance(getattr(anylogits, name), type), name


def test_factories_are_listed_but_loaded_lazily() -> None:
    import anylogits

    assert "for_transformers" in dir(anylogits)
    assert "for_transformers" in anylogits.__all__
