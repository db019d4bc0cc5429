"""What no request may do to a shared server, on every server (``server_suite`` imports
these tests for llama-cpp-python's and mlx-lm's, ``test_vllm_server`` for vLLM's):

- outlive its ``max_tokens``: a logit bias forcing one byte of a UTF-8 character
  (``test_support.byte_probes``), through the OpenAI ``logit_bias`` field or an anylogits
  ``LogitBias``, completions and chat, whole and streamed, ends with
  ``finish_reason="length"`` after at most ``max_tokens`` tokens, within seconds, and the
  next client is served at once (llama-cpp-python's own loop generated until the context
  was full and answered 500);
- leave the server broken when it fails: a client that drops its stream halfway, or a
  request the engine fails, is that client's alone; the next request on the same
  connection and on a new one is served.
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import urlparse

import pytest

from anylogits import LogitBias, Vocabulary, to_specs
from anylogits.core.vocab import hf_vocabulary
from conformance_tests.servers import Server, native_fields
from test_support.byte_probes import BYTE_PROBES, forced_byte
from test_support.generation_cases import COUNTING

openai = pytest.importorskip("openai")

MAX_TOKENS = 4
# A bounded request on the tiny model takes well under a second; the unbounded one held
# llama-cpp-python's server for tens of seconds.
BOUNDED_S = 20.0


@pytest.fixture(scope="module")
def served_vocabulary(hf_tokenizer: Any) -> Vocabulary:
    """The tiny model's vocabulary (every server serves it with the same ids)."""
    return hf_vocabulary(hf_tokenizer)


def _bias_request(forced: int, how: str, server: Server) -> dict[str, Any]:
    if how == "native_logit_bias":
        return {"logit_bias": {str(forced): 100}, "extra_body": native_fields(server)}
    specs = json.dumps(to_specs([LogitBias({forced: 100.0})]))
    return {"extra_body": {"vllm_xargs": {"anylogits": specs}, **native_fields(server)}}


def _finish(client: Any, endpoint: str, stream: bool, **request: Any) -> tuple[str, int | None]:
    """(finish_reason, completion tokens: ``None`` when streamed) of a greedy request."""
    common = {"model": client.served_model, "max_tokens": MAX_TOKENS, "temperature": 0.0}
    if endpoint == "completions":
        create, prompt = client.completions.create, {"prompt": COUNTING}
    else:
        create = client.chat.completions.create
        prompt = {"messages": [{"role": "user", "content": COUNTING}]}
    response = create(**common, **prompt, **request, stream=stream)
    if not stream:
        return response.choices[0].finish_reason, response.usage.completion_tokens
    reasons = [choice.finish_reason for chunk in response for choice in chunk.choices]
    return next(reason for reason in reasons if reason is not None), None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("how", ["native_logit_bias", "anylogits"])
@pytest.mark.parametrize("probe", sorted(BYTE_PROBES))
def test_a_forced_byte_stops_at_max_tokens(
    probe: str,
    how: str,
    endpoint: str,
    stream: bool,
    client: Any,
    server: Server,
    served_vocabulary: Vocabulary,
) -> None:
    forced = forced_byte(served_vocabulary, probe)
    started = time.monotonic()
    try:
        reason, tokens = _finish(client, endpoint, stream, **_bias_request(forced, how, server))
    except openai.APIError:
        server.check_alive()
        raise
    assert time.monotonic() - started < BOUNDED_S
    assert reason == "length"
    assert tokens is None or tokens <= MAX_TOKENS, tokens
    # The next client at once.
    started = time.monotonic()
    assert _finish(client, "completions", False)[1] == MAX_TOKENS
    assert time.monotonic() - started < BOUNDED_S


def _post(connection: http.client.HTTPConnection, body: dict[str, Any]) -> Any:
    connection.request(
        "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    return connection.getresponse()


def _connection(server: Server) -> http.client.HTTPConnection:
    address = urlparse(server.base_url)
    return http.client.HTTPConnection(address.hostname, address.port, timeout=60)


def _request(client: Any, server: Server, **fields: Any) -> dict[str, Any]:
    return {
        "model": client.served_model,
        "prompt": COUNTING,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        **native_fields(server),
        **fields,
    }


def test_a_client_dropping_its_stream_leaves_the_server_whole(client: Any, server: Server) -> None:
    """Clients that read the first chunk of a long stream and hang up: the server serves
    the next request on a new connection, in full and at once."""
    for _ in range(3):
        dropped = _connection(server)
        response = _post(dropped, _request(client, server, max_tokens=200, stream=True))
        assert response.status == 200
        assert response.fp.readline()  # the first line of the stream
        response.close()  # the socket goes with the response's file (HTTP/1.0: it owns it)
        dropped.close()
    server.check_alive()
    started = time.monotonic()
    assert _finish(client, "completions", False)[1] == MAX_TOKENS
    assert time.monotonic() - started < BOUNDED_S


# A prompt longer than the tiny model's context on every server (vLLM's 256 tokens,
# llama.cpp's 512): the engine itself fails the request. mlx-lm sets no context length
# and answers it.
OVERLONG_PROMPT = " ".join(str(number % 10) for number in range(3000))


# Servers that check no context length: they may answer an overlong prompt.
CONTEXT_UNCHECKED = ("mlx", "transformers", "transformers_cb")


@pytest.mark.parametrize(
    "failing",
    [
        pytest.param({"vllm_xargs": {"anylogits": "[{"}}, id="specs_that_do_not_parse"),
        pytest.param({"prompt": OVERLONG_PROMPT}, id="prompt_longer_than_the_context"),
    ],
)
def test_an_error_answer_leaves_the_connection_serving(
    failing: dict[str, Any], client: Any, server: Server
) -> None:
    """A request that fails on a kept-alive connection, refused by anylogits (specs that
    do not parse: HTTP 400) or by the engine (a prompt the context cannot hold: its own
    error, one clear message), then an ordinary one on the same connection: answered.
    (A server that closes every connection after its answer, HTTP/1.0, serves the second
    on a new one.)"""
    connection = _connection(server)
    try:
        refused = _post(connection, _request(client, server, **failing))
        body = refused.read()
        # mlx-lm and transformers' server check no context length: they may answer the
        # long prompt.
        answerable = server.backend in CONTEXT_UNCHECKED and "prompt" in failing
        if not (answerable and refused.status == 200):
            assert 400 <= refused.status < 600, (refused.status, body[:300])
            said = json.loads(body)
            assert said.get("error") or said.get("message") or said.get("detail"), said
        kept = connection.sock if not refused.will_close else None
        answered = _post(connection, _request(client, server))
        completion = json.loads(answered.read())
        assert answered.status == 200, completion
        assert completion["usage"]["completion_tokens"] == MAX_TOKENS
        if kept is not None:
            assert connection.sock is kept, "the server dropped a kept-alive connection"
    finally:
        connection.close()
