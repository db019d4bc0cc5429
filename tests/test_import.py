"""`import anylogits` must not import any backend library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

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
    "triton",
)


def printed_json(code: str) -> Any:
    """What a fresh interpreter running ``code`` prints, as JSON."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def test_import_anylogits_imports_no_backend() -> None:
    code = (
        "import json, sys, anylogits, anylogits.core, anylogits.processors, anylogits.serving; "
        f"print(json.dumps([m for m in {list(BACKENDS)!r} if m in sys.modules]))"
    )
    assert printed_json(code) == []


def test_the_testing_package_imports_no_engine_until_a_name_is_used() -> None:
    # The engines use the tiny model: importing it must not import them (nor torch).
    code = (
        "import json, sys, anylogits.testing, anylogits.testing.tiny_model; "
        "before = [m for m in ('torch', 'anylogits.engines') if m in sys.modules]; "
        "anylogits.testing.check_processor; "
        "print(json.dumps([before, 'anylogits.engines.backends' in sys.modules]))"
    )
    assert printed_json(code) == [[], True]


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
    assert printed_json(code) == []


@pytest.mark.parametrize(
    "arguments",
    [
        ["--help"],
        ["serve", "--help"],
        ["check-spec", "--help"],
        ["list", "--help"],
        ["demo", "--help"],
        ["cache", "--help"],
        ["list"],
    ],
    ids=" ".join,
)
def test_the_command_answers_without_torch(arguments: list[str]) -> None:
    # torch takes 1.5-3.5 s to import: --help and the catalogue's listing need none of it.
    code = (
        "import atexit, sys; "
        "atexit.register(lambda: print(sorted(m for m in ('torch',) + "
        f"{BACKENDS!r} if m in sys.modules), file=sys.stderr)); "
        f"from anylogits.cli import main; sys.exit(main({arguments!r}))"
    )
    env = {key: value for key, value in os.environ.items() if key != "ANYLOGITS_PLUGINS"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    # An installed plugin (a backend's session installs the example's) is a type only
    # its import can describe: list imports it, and torch with it.
    from anylogits.core.registry import available_entry_points

    plugins = arguments == ["list"] and bool(available_entry_points())
    assert result.stderr.strip().splitlines()[-1] == ("['torch']" if plugins else "[]")


def test_import_anylogits_imports_nothing_until_a_name_is_used() -> None:
    code = (
        "import json, sys, anylogits; before = 'torch' in sys.modules; "
        "anylogits.TopK; print(json.dumps([before, 'torch' in sys.modules]))"
    )
    assert printed_json(code) == [False, True]
