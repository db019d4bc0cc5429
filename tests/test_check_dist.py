"""tools/check_dist.py, which `nox -s build` runs on the built wheel and sdist."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from tools.check_dist import PACKAGE, REQUIRED_PACKAGE_FILES, main, problems

ENTRY_POINTS = "[console_scripts]\nanylogits = anylogits.cli:main\n"
PACKAGE_FILES = [f"{PACKAGE}/{name}" for name in REQUIRED_PACKAGE_FILES]
# Paths that must never ship, and (for the test) a file that may: the testing helpers.
BAD_MEMBERS = [
    "tests/test_specs.py",
    "conformance_tests/test_vllm.py",
    "anylogits/cli/__pycache__/__init__.cpython-311.pyc",
    "anylogits/core/specs.pyc",
    ".hypothesis/examples/x",
    "asv_bench/.asv/results/machine.json",
    ".coverage",
]


def wheel(path: Path, names: list[str], entry_points: str = ENTRY_POINTS) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, "")
        archive.writestr("anylogits-1.0.dist-info/entry_points.txt", entry_points)
    return path


def sdist(path: Path, names: list[str]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name in [*names, "PKG-INFO", "pyproject.toml"]:
            member = tarfile.TarInfo(f"anylogits-1.0/{name}")
            archive.addfile(member, io.BytesIO(b""))
    return path


def test_a_whole_package_passes(tmp_path: Path) -> None:
    good_wheel = wheel(tmp_path / "anylogits-1.0-py3-none-any.whl", PACKAGE_FILES)
    good_sdist = sdist(tmp_path / "anylogits-1.0.tar.gz", [f"src/{n}" for n in PACKAGE_FILES])
    assert problems(good_wheel) == []
    assert problems(good_sdist) == []
    assert main([str(good_wheel), str(good_sdist)]) == 0


@pytest.mark.parametrize("bad", BAD_MEMBERS)
def test_a_test_suite_cache_or_bytecode_fails_naming_the_file(bad: str, tmp_path: Path) -> None:
    bad_wheel = wheel(tmp_path / "anylogits-1.0-py3-none-any.whl", [*PACKAGE_FILES, bad])
    bad_sdist = sdist(
        tmp_path / "anylogits-1.0.tar.gz", [f"src/{n}" for n in PACKAGE_FILES] + [bad]
    )
    for path in (bad_wheel, bad_sdist):
        found = problems(path)
        assert len(found) == 1 and found[0].startswith(f"{bad}: "), found
    assert main([str(bad_wheel)]) == 1


def test_a_missing_package_file_or_console_script_fails(tmp_path: Path) -> None:
    partial = wheel(tmp_path / "a-1.0-py3-none-any.whl", PACKAGE_FILES[1:], entry_points="")
    assert problems(partial) == [
        f"{PACKAGE_FILES[0]}: missing",
        "entry_points.txt: no console script anylogits = anylogits.cli:main",
    ]
