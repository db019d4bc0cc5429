"""One session per backend extra, each in its own virtualenv (backends pin different
torch and transformers versions, so they never share an environment)."""

from __future__ import annotations

import nox

nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "tests", "conformance"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
CONSTRAINTS = ("-c", "constraints.txt")
TEST_DEPS = nox.project.dependency_groups(PYPROJECT, "test")

# What each backend's conformance session installs, and the module proving it is there.
BACKENDS = {
    "transformers": {"extra": "transformers", "module": "transformers"},
}


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def tests(session: nox.Session) -> None:
    """Core and processor unit tests and doctests: torch only, no backend installed."""
    session.install(*CONSTRAINTS, "-e", ".", *TEST_DEPS)
    session.run(
        "pytest",
        "tests",
        "--doctest-modules",
        "src/anylogits/core",
        "src/anylogits/processors",
        *session.posargs,
    )


@nox.session
@nox.parametrize("backend", list(BACKENDS))
def conformance(session: nox.Session, backend: str) -> None:
    """The conformance suite on one backend, slow generation-level tests included, plus
    the unit tests that need the backend's libraries (tiny model, HF vocabularies)."""
    spec = BACKENDS[backend]
    session.install(*CONSTRAINTS, "-e", f".[{spec['extra']}]", *TEST_DEPS)
    # A backend that failed to import would turn every test into a skip: fail instead.
    session.run("python", "-c", f"import {spec['module']}")
    session.run(
        "pytest",
        "tests",
        "conformance_tests",
        f"--backends={backend}",
        "-m",
        "",
        *session.posargs,
    )


@nox.session
def bench(session: nox.Session) -> None:
    """asv benchmarks of everything installed here, then a table of the ratios."""
    session.install(
        *CONSTRAINTS,
        "-e",
        ".[transformers]",
        *nox.project.dependency_groups(PYPROJECT, "bench"),
    )
    commit = session.run("git", "rev-parse", "HEAD", silent=True, external=True).strip()
    session.chdir("asv_bench")
    session.run("asv", "machine", "--yes")
    session.run(
        "asv",
        "run",
        "--python=same",
        "--quick",
        "--show-stderr",
        f"--set-commit-hash={commit}",
        *session.posargs,
    )
    session.run("python", "summary.py")
