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

from anylogits import RepetitionPenalty
from anylogits.engines.generation import NEW_TOKENS
from conformance_tests.server_suite import *  # noqa: F403  (the suite's tests)
from conformance_tests.server_suite import _extra_body, complete
from conformance_tests.servers import Server
from test_support.generation_cases import COUNTING

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
    serve_single = inspect.getsource(server.ResponseGenerator._serve_single)
    for call in ("self.prompt_cache.fetch_nearest_cache(", "stream_generate(", "prompt=rest"):
        assert call in serve_single, f"the unbatched path no longer calls {call}"
    assert "LRUPromptCache(" in inspect.getsource(server.run)
    from anylogits.adapters.mlx import batch

    assert batch.step_is_the_one_copied(), (
        "mlx_lm.generate.GenerationBatch._step changed: copy it anew into "
        "anylogits.adapters.mlx.batch.batched_step and update STEP_SHA256"
    )


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


def test_processors_see_the_cached_prompt_on_the_unbatched_path(
    client: Any, server: Server, counting: list[int], plain: list[int], engine: Any
) -> None:
    # A request with a seed is served alone (stream_generate), which passes processors
    # only the prompt's uncached part: a warm cache hid the prompt from the penalty.
    # The prompt ends with the greedy tokens the model goes on to repeat.
    prompt = COUNTING + engine.tokenizer.decode(plain[:7])
    ids = engine.encode(prompt)
    assert ids == counting + plain[:7]
    expected = engine.greedy(ids, [RepetitionPenalty(1.3)])
    assert expected != engine.greedy(ids), "the penalty does not change the greedy output"
    for seed in range(3):
        response = client.completions.create(
            model=client.served_model,
            prompt=prompt,
            max_tokens=NEW_TOKENS,
            temperature=0.0,
            seed=seed,
            extra_body=_extra_body(client, [RepetitionPenalty(1.3)]),
        )
        cached = response.usage.prompt_tokens_details
        assert list(response.choices[0].model_extra["token_ids"]) == expected, (seed, cached)
    assert cached is not None and cached.cached_tokens > 0, "the prompt cache stayed cold"
