"""``anylogits.testing.pytest_plugin`` in a user's own test suite: ``--backends`` chooses,
``backend`` is parametrized by backend name, ``only_backend`` skips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from anylogits.engines.backends import installed

SUITE = {
    "conftest.py": 'pytest_plugins = ["anylogits.testing.pytest_plugin"]\n',
    "test_user.py": (
        "import pytest\n\n"
        "def test_every_backend(backend):\n"
        "    assert backend.name in ('transformers', 'mlx')\n\n"
        "@pytest.mark.only_backend('vllm')\n"
        "def test_vllm_only():\n"
        "    pass\n"
    ),
}


def run(folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    for name, text in SUITE.items():
        (folder / name).write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *options],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_a_users_suite_runs_on_the_backends_it_chooses(tmp_path: Path) -> None:
    result = run(tmp_path, "--backends", "transformers,mlx", "--collect-only")
    assert result.returncode == 0, result.stdout + result.stderr
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert collected == [
        "test_user.py::test_every_backend[transformers]",
        "test_user.py::test_every_backend[mlx]",
        "test_user.py::test_vllm_only",
    ]


def test_backends_not_installed_or_not_selected_are_skipped_with_why(tmp_path: Path) -> None:
    result = run(tmp_path, "--backends", "transformers,mlx")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vllm is not selected" in result.stdout
    for name in ("transformers", "mlx"):
        assert (f"{name} is not installed" in result.stdout) is not installed(name)


def test_an_unknown_backend_is_a_usage_error(tmp_path: Path) -> None:
    result = run(tmp_path, "--backends", "transformers,tensorrt")
    assert result.returncode != 0
    assert "unknown backend(s) ['tensorrt']" in result.stdout + result.stderr
