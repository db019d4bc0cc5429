"""transformers' own server, started as ``anylogits serve transformers`` on its plain path
(``model.generate`` per request): the server suite (``server_suite``), the OpenAI fields
anylogits applies per request, and what the wiring relies on in transformers."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("transformers")

from conformance_tests.server_suite import *  # noqa: F403  (the suite's tests)
from conformance_tests.transformers_server_cases import *  # noqa: F403  (both paths')

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("transformers")]


@pytest.fixture(scope="module")
def server_backend() -> str:
    return "transformers"


def test_what_the_wiring_relies_on_is_there() -> None:
    """The names of transformers that ``anylogits.adapters.transformers_server`` lists
    beyond its public API: a release that moves one fails here, by name."""
    from transformers.cli.serving import utils
    from transformers.cli.serving.chat_completion import ChatCompletionHandler
    from transformers.cli.serving.completion import CompletionHandler

    for handler in (CompletionHandler, ChatCompletionHandler):
        parameters = inspect.signature(handler.handle_request).parameters
        assert list(parameters) == ["self", "body", "request_id"], handler
        source = inspect.getsource(handler.handle_request)
        for call in ("self._validate_request(body)", "self._resolve_model(body)", "init_cb("):
            assert call in source, (handler, call)
    assert "def _resolve_model" in inspect.getsource(utils.BaseHandler)
    plain = inspect.getsource(utils.GenerateManager)
    assert plain.count("{**inputs,") == 2, "inputs no longer reach model.generate as given"
    batched = inspect.getsource(utils.CBGenerateManager)
    assert batched.count("add_request(") == 2 and batched.count("request_id=request_id") >= 2
    assert "self._cb = model.init_continuous_batching(" in batched
    for manager in (utils.GenerateManager, utils.CBGenerateManager):
        for name in ("generate_streaming", "generate_non_streaming"):
            parameters = list(inspect.signature(getattr(manager, name)).parameters)
            assert parameters[:6] == [
                "self",
                "model",
                "processor",
                "inputs",
                "gen_config",
                "request_id",
            ], (manager, name)
    from transformers.cli import transformers as command

    assert "serve" in inspect.getsource(command)


def test_the_supported_servers_are_the_extras_and_another_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformers 5.25 rewrote its server (``GenerateRunner``, API server processes):
    the wiring would fail on a missing name. The ``transformers-serve`` extra installs a
    release it is written for, and another is refused with the install that fixes it."""
    from pathlib import Path

    import tomllib
    import transformers

    from anylogits.adapters import transformers_server

    (low_major, low_minor), (high_major, high_minor) = transformers_server.SUPPORTED_SERVE
    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    wanted = f"transformers>={low_major}.{low_minor},<{high_major}.{high_minor}"
    assert (
        f"transformers[serving]>={low_major}.{low_minor},<{high_major}.{high_minor}"
        in (extras["project"]["optional-dependencies"]["transformers-serve"])
    )
    monkeypatch.setattr(transformers, "__version__", f"{high_major}.{high_minor}.0")
    with pytest.raises(SystemExit, match=f"pip install '{wanted}'"):
        transformers_server.main(["--model", "unused"])
