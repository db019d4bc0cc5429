"""The tests session collects where no optional extra is installed (a fresh venv with
torch alone): a module that needs one skips, none fails to import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("llguidance", "transformers", "vllm", "mlx", "mlx_lm", "llama_cpp")


def test_the_tests_collect_without_any_optional_extra(tmp_path: Path) -> None:
    # Each optional package is shadowed by one that is not there.
    for name in OPTIONAL:
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text(
            f"raise ModuleNotFoundError('No module named ' + {name!r}, name={name!r})\n"
        )
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "--collect-only", "-q"),
            *("-p", "no:cacheprovider", "-p", "no:xdist", str(ROOT / "tests")),
        ],
        cwd=ROOT,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " error" not in result.stdout.splitlines()[-1], result.stdout[-3000:]
