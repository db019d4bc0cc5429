"""Install hints in the form that works where anylogits came from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from anylogits import installation


class _Distribution:
    def __init__(self, direct_url: dict[str, Any] | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return None if self.direct_url is None else json.dumps(self.direct_url)


@pytest.fixture
def installed_from(monkeypatch: pytest.MonkeyPatch):
    def install(direct_url: dict[str, Any] | None) -> None:
        monkeypatch.setattr(
            installation.metadata, "distribution", lambda name: _Distribution(direct_url)
        )
        installation._installed_from.cache_clear()

    yield install
    installation._installed_from.cache_clear()


def test_a_package_from_the_index_is_named_by_its_project(installed_from) -> None:
    installed_from(None)
    assert installation.pip_install("mlx") == 'pip install "anylogits[mlx]"'


def test_an_editable_checkout_is_installed_again_from_its_folder_with_its_pins(
    installed_from, tmp_path: Path
) -> None:
    (tmp_path / "constraints.txt").write_text("torch==2.13.0\n")
    installed_from({"url": tmp_path.as_uri(), "dir_info": {"editable": True}})
    assert installation.pip_install("mlx") == (
        f'pip install -c {tmp_path / "constraints.txt"} -e "{tmp_path}[mlx]"'
    )


@pytest.mark.parametrize("extra", ["llama-cpp", "all"])
def test_llama_cpp_is_built_portable_and_not_from_pips_cache(installed_from, extra: str) -> None:
    """A build for the local CPU (pip's default) crashed on a Q4_1 model on an AMX host;
    pip's wheel cache would hand back such a build whatever CMAKE_ARGS says."""
    installed_from(None)
    assert installation.pip_install(extra) == (
        'CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" '
        f'pip install --no-cache-dir "anylogits[{extra}]"'
    )


def test_nox_builds_llama_cpp_with_the_flags_the_hint_names() -> None:
    """The suite tests the build users are told to install: noxfile.py's flags are read
    from the hint's own line."""
    import ast
    import re

    noxfile = Path(__file__).parents[1] / "noxfile.py"
    tree = ast.parse(noxfile.read_text())
    (assignment,) = [
        node
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(target, "id", "") == "LLAMA_CPP_CMAKE_ARGS" for target in node.targets)
    ]
    namespace = {"re": re, "Path": Path, "__file__": str(noxfile)}
    exec(compile(ast.Module([assignment], []), str(noxfile), "exec"), namespace)
    assert namespace["LLAMA_CPP_CMAKE_ARGS"] == installation.LLAMA_CPP_CMAKE_ARGS
    assert "-DGGML_NATIVE=OFF" in installation.LLAMA_CPP_CMAKE_ARGS


def test_a_wheel_file_is_installed_again_from_that_file(installed_from, tmp_path: Path) -> None:
    wheel = tmp_path / "with space" / "anylogits-0.1.0-py3-none-any.whl"
    installed_from({"url": wheel.as_uri(), "archive_info": {}})
    assert installation.pip_install("structured") == f'pip install "{wheel}[structured]"'


def test_this_checkout_is_named_by_its_folder() -> None:
    # The test run's own anylogits: installed editable from this checkout (or run from it).
    installation._installed_from.cache_clear()
    root = Path(__file__).parents[1]
    assert f'"{root}[mlx]"' in installation.pip_install("mlx")


def test_the_llama_cpp_page_installs_it_as_the_hints_do(installed_from) -> None:
    installed_from(None)
    page = Path(__file__).parents[1] / "docs" / "backends" / "llama-cpp.md"
    assert installation.pip_install("llama-cpp") in page.read_text()


def test_a_native_llama_cpp_is_replaced_by_the_portable_build_of_its_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Installing the extra again would keep the llama-cpp-python there: the rebuild
    forces it, without touching its dependencies."""
    monkeypatch.setattr(installation.metadata, "version", lambda name: "0.3.36")
    assert installation.llama_cpp_rebuild() == (
        'CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" pip install --no-cache-dir '
        '--force-reinstall --no-deps "llama-cpp-python==0.3.36"'
    )
