"""llama-cpp-python's own server, started as ``anylogits serve llama-cpp``: the server
suite (``server_suite``), and what the wiring relies on in llama-cpp-python."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("fastapi")

from conformance_tests.server_suite import *  # noqa: F403  (the suite's tests)
from conformance_tests.servers import frontend_pid

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("llama_cpp")]


@pytest.fixture(scope="module")
def server_backend() -> str:
    return "llama_cpp"


def test_the_server_runs_with_two_malloc_arenas(server: Any) -> None:
    """``anylogits serve llama-cpp`` starts llama-cpp-python's server with
    ``MALLOC_ARENA_MAX=2`` (unless the operator set it): with glibc's default, each of
    FastAPI's worker threads kept an arena and a 720-request soak grew the server by
    ~370 MiB; with two it stayed flat."""
    environ = Path(f"/proc/{frontend_pid(server)}/environ").read_bytes().split(b"\0")
    expected = os.environ.get("MALLOC_ARENA_MAX", "2")
    assert f"MALLOC_ARENA_MAX={expected}".encode() in environ


def test_what_the_wiring_relies_on_is_there() -> None:
    """The server's wiring calls what llama-cpp-python's server command and app are
    built from (the names themselves: ``test_llama_cpp.py``)."""
    import llama_cpp
    import llama_cpp.server.__main__ as command
    import llama_cpp.server.app as app

    assert hasattr(app, "_llama_proxy"), "llama_cpp.server.app._llama_proxy is gone"
    assert command.create_app is app.create_app, "the server command calls create_app no more"
    for name in ("settings", "server_settings", "model_settings"):
        assert name in inspect.signature(app.create_app).parameters, name
    completion = inspect.signature(llama_cpp.Llama.create_completion).parameters
    assert "logits_processor" in completion
    assert "logits_processor" in inspect.signature(llama_cpp.Llama.generate).parameters
