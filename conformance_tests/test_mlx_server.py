"""mlx-lm's own server, started as ``anylogits serve mlx``: the server suite
(``server_suite``), and what the wiring relies on in mlx-lm."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlx_lm")

import openai

from conformance_tests.server_suite import *  # noqa: F403  (the suite's tests)
from conformance_tests.server_suite import complete
from conformance_tests.servers import Server

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("mlx")]


@pytest.fixture(scope="module")
def server_backend() -> str:
    return "mlx"


def test_what_the_wiring_relies_on_is_there() -> None:
    """The names of mlx-lm that ``anylogits.adapters.mlx.server`` lists beyond its public
    API: a release that moves one fails here, by name."""
    import mlx_lm.server as server

    parameters = inspect.signature(server._make_logits_processors).parameters
    assert list(parameters) == ["args"], parameters
    assert "handler_class" in inspect.signature(server._run_http_server).parameters
    assert {f.name for f in dataclasses.fields(server.GenerationArguments)} >= {"logits"}
    assert "tokens" in inspect.signature(server.APIHandler.generate_response).parameters
    assert "run" in inspect.getsource(server.main), "mlx_lm.server.main calls run no more"
    source = inspect.getsource(server.ResponseGenerator)
    assert source.count("_make_logits_processors(args)") == 2, "a request path changed"


def test_a_list_prompt_is_a_400_and_the_server_serves_on(
    client: Any,
    server: Server,
    plain: list[int],
) -> None:
    # mlx-lm tokenizes the prompt in its generation thread: a list killed it, and every
    # later request got 404 "generation thread died".
    with pytest.raises(openai.BadRequestError, match="prompt must be a string"):
        client.completions.create(
            model=client.served_model, prompt=["Once upon a time"], max_tokens=4
        )
    assert complete(client, server)[1] == plain


def test_the_served_model_is_listed_without_a_hugging_face_cache(client: Any) -> None:
    # mlx-lm lists what it finds in the Hugging Face cache, and answered a traceback
    # where ~/.cache/huggingface/hub does not exist (a fresh machine, this one).
    listed = [model.id for model in client.models.list().data]
    assert any((Path(name) / "config.json").is_file() for name in listed), listed
