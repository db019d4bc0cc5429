"""The README's main job: `anylogits demo` runs and every row agrees with transformers."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.only_backend("transformers")]


def test_demo_runs_and_agrees_with_transformers(tiny_model_dir) -> None:
    command = shutil.which("anylogits")
    argv = [command] if command else [sys.executable, "-m", "anylogits.cli"]
    result = subprocess.run(
        [*argv, "demo", "--max-new-tokens", "12"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all rows agree with transformers" in result.stdout
    assert "NO EFFECT" not in result.stdout and "DIFFERS" not in result.stdout
    assert "adapter overhead" in result.stdout


def test_tiny_model_command_prints_the_cached_folder(tiny_model_dir) -> None:
    command = shutil.which("anylogits")
    argv = [command] if command else [sys.executable, "-m", "anylogits.cli"]
    result = subprocess.run([*argv, "tiny-model"], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(tiny_model_dir)
