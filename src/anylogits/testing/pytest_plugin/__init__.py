"""A pytest plugin for test suites that run the same tests on every engine (anylogits' own
conformance suite uses it): a ``--backends`` option and a ``backend`` fixture whose ids
are backend names.

Use it from your ``conftest.py`` at the root of your tests::

    pytest_plugins = ["anylogits.testing.pytest_plugin"]

    # test_my_processor.py
    from anylogits.testing import check_processor

    def test_my_processor_on_every_engine(backend):
        check_processor(MyProcessor(), backends=[backend.name])

``pytest --backends llama_cpp,mlx`` (or ``ANYLOGITS_BACKENDS``) chooses backends; the
default is every one anylogits knows, and one that is not installed is skipped with its
reason. ``@pytest.mark.only_backend("vllm")`` skips a test unless one of the named backends
is selected. ``backend`` is the backend's entry in :data:`anylogits.engines.backends.BACKENDS`
(a :class:`~anylogits.testing.check.Backend`): its ``name``, the dtypes and rows it passes,
and how it builds and calls its native hook.

A package of its own: it picks engines by name, so it stands above :mod:`anylogits.engines`,
while the rest of :mod:`anylogits.testing` stands below them (the engines use the tiny model).
"""

from __future__ import annotations

import os

import pytest

from anylogits.engines.backends import BACKENDS, installed

OPTION = "--backends"
VARIABLE = "ANYLOGITS_BACKENDS"


def selected_backends(config: pytest.Config) -> list[str]:
    """The backends ``--backends`` (or ``ANYLOGITS_BACKENDS``) names, in order."""
    value = config.getoption(OPTION)
    names = list(BACKENDS) if value == "all" else [n.strip() for n in value.split(",") if n]
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        raise pytest.UsageError(
            f"{OPTION} names unknown backend(s) {unknown}; known: {list(BACKENDS)}"
        )
    return names


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        default=os.environ.get(VARIABLE, "all"),
        help=f"comma-separated backends to run on (default: every installed one; {VARIABLE})",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "only_backend(*names): skipped unless one of these backends is selected"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    params = []
    for name in selected_backends(metafunc.config):
        marks = [] if installed(name) else [pytest.mark.skip(reason=f"{name} is not installed")]
        params.append(pytest.param(BACKENDS[name], id=name, marks=marks))
    metafunc.parametrize("backend", params)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = set(selected_backends(config))
    for item in items:
        marker = item.get_closest_marker("only_backend")
        if marker is not None and not selected & set(marker.args):
            names = " or ".join(marker.args)
            item.add_marker(pytest.mark.skip(reason=f"{names} is not selected"))
