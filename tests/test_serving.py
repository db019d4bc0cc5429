"""What every engine's server does with a request's specs before the engine sees them
(``anylogits.serving``), and ``anylogits serve``'s command line. The servers themselves
run in their backends' sessions (``conformance_tests/test_*_server.py``)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch

import anylogits
from anylogits import LogitBias, NoRepeatNGram, SuppressTokens, to_specs, vllm_xargs
from anylogits.adapters.vllm_requests import validate_request
from anylogits.cli.serve import VLLM_PROCESSOR_CLASS, vllm_command
from anylogits.serving import (
    Refused,
    RequestPipeline,
    admit,
    error_body,
    request_specs,
    with_token_ids,
)
from test_support.probes import RaiseAfter

EOS = 7
VOCAB = anylogits.Vocabulary(tuple(bytes([65 + i]) for i in range(8)), frozenset({EOS}))


def body(*processors: anylogits.LogitsProcessor, **fields: object) -> dict[str, object]:
    return {"prompt": "x", "vllm_xargs": vllm_xargs(*processors), **fields}


def test_a_body_without_specs_is_admitted_with_no_processors() -> None:
    for plain in ({"prompt": "x"}, {"prompt": "x", "vllm_xargs": None}, [1, 2], "text"):
        admitted = admit(plain, VOCAB, request="r")
        assert admitted.pipeline is None and not admitted.return_token_ids


def test_admitted_specs_are_built_for_the_served_vocabulary() -> None:
    admitted = admit(body(LogitBias({2: -5.0}), return_token_ids=True), VOCAB, request="r")
    assert isinstance(admitted.pipeline, RequestPipeline)
    assert admitted.pipeline.vocab is VOCAB and admitted.return_token_ids
    logits = admitted.pipeline(torch.zeros(1, 8), torch.tensor([[1]]))
    assert logits[0, 2] == -5.0 and logits[0].sum() == -5.0


@pytest.mark.parametrize(
    "text",
    [
        '[{"type": "top_k", "top_k": 0}]',
        '[{"type": "no_such_processor"}]',
        "[{not json",
        "42",
        json.dumps([{"type": "top_k", "top_k": 5 + i} for i in range(500)]),
    ],
)
def test_a_refusal_is_the_message_vllms_frontend_gives(text: str) -> None:
    with pytest.raises(ValueError) as vllm:
        validate_request({"anylogits": text}, engine_in_this_process=False)
    with pytest.raises(Refused) as ours:
        admit({"vllm_xargs": {"anylogits": text}}, VOCAB, request="r")
    assert str(ours.value) == str(vllm.value)


def test_vllm_xargs_that_is_not_an_object_is_refused_by_name() -> None:
    with pytest.raises(Refused, match=r"^vllm_xargs must be a JSON object .*got list"):
        request_specs({"vllm_xargs": [1, 2]})


def test_what_only_the_vocabulary_shows_is_refused_before_generation() -> None:
    with pytest.raises(Refused) as refused:
        admit(body(SuppressTokens([10**7])), VOCAB, request="r")
    message = str(refused.value)
    assert message.startswith("extra_args['anylogits'] cannot run on the served model: ")
    assert str(10**7) in message


def test_a_failing_processor_ends_its_request_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pipeline = RequestPipeline([RaiseAfter(2), NoRepeatNGram(2)], VOCAB, request="request 9")
    history = torch.tensor([[1, 2]])
    assert torch.equal(pipeline(torch.zeros(1, 8), history), torch.zeros(1, 8))
    ended = torch.full((1, 8), float("-inf"))
    ended[0, EOS] = 0.0
    with caplog.at_level(logging.ERROR, logger="anylogits.serving"):
        for generated in range(2, 5):
            history = torch.tensor([[1, 2, *range(generated)]])
            assert torch.equal(pipeline(torch.zeros(1, 8), history, lengths=None), ended)
            assert torch.equal(pipeline.compact(torch.zeros(1, 8), history), ended)
    assert pipeline.failure is not None and "2 tokens were generated" in pipeline.failure
    (record,) = caplog.records
    assert "request 9" in record.getMessage()
    assert "the request's sequence is ended" in record.getMessage()


def test_a_refusal_body_is_vllms_error_body() -> None:
    assert json.loads(error_body("bad top_k")) == {
        "error": {"message": "bad top_k", "type": "BadRequestError", "param": None, "code": 400}
    }


def test_token_ids_go_where_vllms_server_puts_them() -> None:
    completion = {"object": "text_completion", "choices": [{"text": "a"}]}
    assert with_token_ids(completion, [1, 2], [3, 4])["choices"][0] == {
        "text": "a",
        "token_ids": [3, 4],
        "prompt_token_ids": [1, 2],
    }
    chat = {"object": "chat.completion", "choices": [{"message": {}}]}
    written = with_token_ids(chat, [1, 2], [3])
    assert written["prompt_token_ids"] == [1, 2] and written["choices"][0]["token_ids"] == [3]
    assert with_token_ids({"choices": []}, None, [3]) == {"choices": []}


def test_serve_vllm_is_vllms_server_with_the_processor_class() -> None:
    command = vllm_command(["--model", "m"])
    assert command[1:] == [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "m",
        "--logits-processors",
        VLLM_PROCESSOR_CLASS,
    ]
    given = ["--model", "m", "--logits-processors", "mine:Class"]
    assert vllm_command(given)[3:] == given


@pytest.mark.parametrize("argv", [[], ["nonsense"]])
def test_serve_names_the_engines_it_knows(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "anylogits", "serve", *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 2, result
    assert "the engine is one of llama-cpp, mlx, vllm" in result.stderr, result.stderr


def test_the_specs_a_client_builds_are_the_specs_a_server_admits() -> None:
    processors = [NoRepeatNGram(2), LogitBias({3: 1.5})]
    admitted = admit(body(*processors), VOCAB, request="r")
    assert admitted.pipeline is not None
    assert to_specs(list(admitted.pipeline.processors)) == to_specs(processors)
