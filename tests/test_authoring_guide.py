"""docs/authoring.md runs: its Python blocks, top to bottom, on each installed backend.

Blocks marked ``# needs: <module>`` run only where that module is installed (each
backend's nox session); the unmarked ones run everywhere. Each backend runs in a fresh
process, as a user would run the guide.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

GUIDE = Path(__file__).parents[1] / "docs" / "authoring.md"
BACKEND_MODULES = ("transformers", "llama_cpp", "mlx_lm", "vllm")
# Run by conformance_tests/test_vllm_server.py against the suite's server.
SERVER = "openai_server"


def server_blocks() -> list[str]:
    """The guide's blocks that talk to a running server (``base_url``, ``served_model``)."""
    return [block for block in blocks("python") if needs(block) == SERVER]


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", GUIDE.read_text(), re.M | re.S)


def needs(block: str) -> str | None:
    match = re.match(r"# needs: (\w+)", block)
    return match.group(1) if match else None


def script(backend: str | None) -> str:
    chosen = [b for b in blocks("python") if needs(b) in (None, backend)]
    return "\n\n".join(chosen)


def test_every_block_is_run_somewhere() -> None:
    marked = {needs(block) for block in blocks("python")}
    assert marked == {None, SERVER, *BACKEND_MODULES}, marked


def test_the_processors_run_on_torch_alone() -> None:
    namespace: dict[str, object] = {"__name__": "guide"}
    exec(compile(script(None), str(GUIDE), "exec"), namespace)
    for name in ("LogitSoftcap", "NoImmediateRepeat"):
        processor = namespace[name]()  # type: ignore[operator]
        assert type(processor).from_spec(processor.to_spec()).config() == processor.config()


def test_the_packaging_block_declares_the_entry_point_group() -> None:
    (toml,) = blocks("toml")
    entry_points = tomllib.loads(toml)["project"]["entry-points"]["anylogits.processors"]
    assert entry_points == {"guide.no_immediate_repeat": "my_package.processors:NoImmediateRepeat"}


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKEND_MODULES)
def test_the_guide_runs_on(backend: str, tmp_path: Path) -> None:
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    pytest.importorskip("transformers")  # builds the tiny model
    from anylogits.engines.generation import vllm_environment
    from anylogits.testing.tiny_model import build_tiny_gguf, build_tiny_model

    model_dir = build_tiny_model()
    prelude = textwrap.dedent(
        f"""
        from pathlib import Path
        model_dir = Path({str(model_dir)!r})
        gguf_path = Path({str(build_tiny_gguf()) if backend == "llama_cpp" else ""!r})
        """
    )
    source = tmp_path / "guide.py"
    source.write_text(prelude + script(backend))
    environment = {**os.environ, **vllm_environment(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
