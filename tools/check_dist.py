"""Check built distributions: nothing but the package ships, and the package is whole.

    python tools/check_dist.py dist/*.whl dist/*.tar.gz

Fails (exit 1), naming each offending member, when a wheel or sdist holds a test suite,
a cache or bytecode, or lacks a file the installed package needs (``nox -s build`` runs
it). ``anylogits/testing/`` is public API (``check_processor``, the tiny model, the pytest
plugin) and ships; the repository's ``test_support`` fixtures never do.
"""

from __future__ import annotations

import configparser
import sys
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

# Folders that never ship: test suites, benchmarks, tool caches and environments.
FORBIDDEN_FOLDERS = frozenset(
    {
        "tests",
        "conformance_tests",
        "test_support",
        "asv_bench",
        "__pycache__",
        ".nox",
        ".venv",
        ".git",
        ".hypothesis",
        ".pytest_cache",
        ".ruff_cache",
        ".mypy_cache",
        ".asv",
        ".support-results",
    }
)
FORBIDDEN_SUFFIXES = (".pyc", ".pyo")
FORBIDDEN_NAMES = frozenset({".coverage", "coverage.xml"})
# Files of the package an installed copy needs (paths inside the package's folder).
REQUIRED_PACKAGE_FILES = (
    "__init__.py",
    "catalogue.json",
    "cli/__init__.py",
    "py.typed",
    "support_matrix.json",
    "testing/__init__.py",
)
PACKAGE = "anylogits"
CONSOLE_SCRIPT = ("anylogits", "anylogits.cli:main")


def members(path: Path) -> list[str]:
    """The file names in a wheel, or in an sdist without its top folder."""
    if path.name.endswith(".whl"):
        with zipfile.ZipFile(path) as archive:
            return [name for name in archive.namelist() if not name.endswith("/")]
    if path.name.endswith(".tar.gz"):
        with tarfile.open(path) as archive:
            return [
                str(PurePosixPath(*PurePosixPath(member.name).parts[1:]))
                for member in archive.getmembers()
                if not member.isdir()
            ]
    raise ValueError(f"{path} is neither a wheel (.whl) nor an sdist (.tar.gz)")


def forbidden(name: str) -> str | None:
    """Why ``name`` must not ship, or ``None``."""
    path = PurePosixPath(name)
    folders = FORBIDDEN_FOLDERS.intersection(path.parts[:-1])
    if folders:
        return f"inside {sorted(folders)[0]}/"
    if path.suffix in FORBIDDEN_SUFFIXES or path.name in FORBIDDEN_NAMES:
        return "a cache or bytecode file"
    return None


def console_script(path: Path, name: str) -> str | None:
    """What the wheel's console script ``name`` runs, or ``None``."""
    with zipfile.ZipFile(path) as archive:
        files = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        entry_points = configparser.ConfigParser()
        if files:
            entry_points.read_string(archive.read(files[0]).decode())
    return entry_points.get("console_scripts", name, fallback=None)


def problems(path: Path) -> list[str]:
    """Everything wrong with one distribution (empty: it may ship)."""
    names = members(path)
    found = [f"{name}: {why}" for name in names if (why := forbidden(name)) is not None]
    package = PACKAGE if path.name.endswith(".whl") else f"src/{PACKAGE}"
    found += [
        f"{package}/{required}: missing"
        for required in REQUIRED_PACKAGE_FILES
        if f"{package}/{required}" not in names
    ]
    if path.name.endswith(".whl"):
        script, target = CONSOLE_SCRIPT
        if console_script(path, script) != target:
            found.append(f"entry_points.txt: no console script {script} = {target}")
    else:
        found += [
            f"{name}: missing" for name in ("PKG-INFO", "pyproject.toml") if name not in names
        ]
    return found


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: python tools/check_dist.py DIST_FILE...", file=sys.stderr)
        return 2
    failed = False
    for name in paths:
        path = Path(name)
        found = problems(path)
        if found:
            failed = True
            print(f"{path}: {len(found)} problem(s)", file=sys.stderr)
            for problem in found:
                print(f"  {problem}", file=sys.stderr)
        else:
            print(f"{path}: ok ({len(members(path))} files)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
