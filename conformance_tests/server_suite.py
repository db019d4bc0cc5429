"""What every local engine's server must do with per-request processors, driven by the
real ``openai`` client: the tests of ``test_llama_cpp_server`` and ``test_mlx_server``
(each module imports them and names its server with a ``server_backend`` fixture).

The request is the one vLLM's server takes (``extra_body={"vllm_xargs": {"anylogits":
...}}``), and the tokens are compared as ids (``return_token_ids``, vLLM's flag): each
catalogue case gives the tokens of the same processors in-process on that engine and
transformers' own; bad specs get vLLM's 400 messages, word for word ``anylogits
check-spec``'s; clients with different specs at once get what each gets alone; a failing
processor ends its own request.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from anylogits import (
    JSONSchema,
    LogitBias,
    LogitsProcessor,
    NoRepeatNGram,
    SuppressTokens,
    to_specs,
)
from anylogits.engines.generation import NEW_TOKENS, GenerationEngine, TransformersEngine
from conformance_tests.server_bounds import *  # noqa: F403  (every server's bounds)
from conformance_tests.server_soak import *  # noqa: F403  (every server's soak)
from conformance_tests.servers import (
    Server,
    Servers,
    check_spec_message,
    client_of,
    load_installed_plugins,
)
from test_support.generation_cases import COUNTING, CROSS_ENGINE_CASES, EOS
from test_support.hostile import BAD_PAYLOADS
from test_support.probes import RaiseAfter

openai = pytest.importorskip("openai")

CHAT_MESSAGES = [{"role": "user", "content": "Count with me: 1 2 3 4 5 6 7 8"}]


def _extra_body(
    client: Any, processors: tuple[LogitsProcessor, ...] | list[LogitsProcessor]
) -> dict:
    """The request fields beyond OpenAI's: the token ids asked for, the client's server's
    own fields (:func:`~conformance_tests.servers.client_of`) and the processors' specs."""
    body: dict[str, Any] = {"return_token_ids": True, **client.native_fields}
    if processors:
        body["vllm_xargs"] = {"anylogits": json.dumps(to_specs(list(processors)))}
    return body


def complete(
    client: Any, server: Server, *processors: LogitsProcessor, max_tokens: int = NEW_TOKENS
) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy new token ids) of the counting prompt, as text."""
    try:
        response = client.completions.create(
            model=client.served_model,
            prompt=COUNTING,
            max_tokens=max_tokens,
            temperature=0.0,
            extra_body=_extra_body(client, processors),
        )
    except openai.APIConnectionError:
        server.check_alive()
        raise
    extra = response.choices[0].model_extra
    return list(extra["prompt_token_ids"]), list(extra["token_ids"])


def chat(client: Any, *processors: LogitsProcessor, **options: Any) -> tuple[list[int], Any]:
    """(prompt ids, the response) of a greedy chat completion."""
    response = client.chat.completions.create(
        model=client.served_model,
        messages=CHAT_MESSAGES,
        max_tokens=8,
        temperature=0.0,
        extra_body=_extra_body(client, processors),
        **options,
    )
    return list(response.model_extra["prompt_token_ids"]), response


@pytest.fixture(scope="module")
def engine(server_backend: str, engines: Any) -> GenerationEngine:
    """The same engine in-process, on the same tiny model."""
    return engines[server_backend]


@pytest.fixture(scope="module")
def counting(client: Any, server: Server) -> list[int]:
    return complete(client, server)[0]


@pytest.fixture(scope="module")
def plain(client: Any, server: Server) -> list[int]:
    """The server's unprocessed greedy tokens on the counting prompt."""
    tokens = complete(client, server)[1]
    assert len(tokens) == NEW_TOKENS, tokens
    return tokens


def test_unprocessed_is_in_process_and_transformers(
    plain: list[int], counting: list[int], engine: GenerationEngine, reference: TransformersEngine
) -> None:
    assert counting == engine.encode(COUNTING)
    assert plain == engine.greedy(counting) == reference.greedy(counting)


@pytest.mark.parametrize("case", sorted(CROSS_ENGINE_CASES))
def test_catalogue_case_is_in_process_and_transformers(
    case: str,
    client: Any,
    server: Server,
    counting: list[int],
    plain: list[int],
    engine: GenerationEngine,
    reference: TransformersEngine,
) -> None:
    processors = CROSS_ENGINE_CASES[case](plain)
    _, tokens = complete(client, server, *processors)
    assert tokens != plain, f"{case} did not change the greedy output"
    assert tokens == engine.greedy(counting, CROSS_ENGINE_CASES[case](plain))
    assert tokens == reference.greedy(counting, CROSS_ENGINE_CASES[case](plain))


def test_chat_with_processors_is_in_process(client: Any, engine: GenerationEngine) -> None:
    prompt, plain_chat = chat(client)
    plain_ids = plain_chat.choices[0].model_extra["token_ids"]
    banned = sorted(set(plain_ids[:3]))
    prompt_banned, response = chat(client, SuppressTokens(banned), NoRepeatNGram(2))
    tokens = response.choices[0].model_extra["token_ids"]
    assert prompt_banned == prompt
    assert not set(tokens) & set(banned) and tokens != plain_ids, (tokens, banned)
    assert tokens == engine.greedy(prompt, [SuppressTokens(banned), NoRepeatNGram(2)], n=8)
    assert response.choices[0].message.content


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streamed_text_is_the_unstreamed_text(client: Any, endpoint: str) -> None:
    if endpoint == "completions":
        create, request = client.completions.create, {"prompt": COUNTING}
    else:
        create, request = client.chat.completions.create, {"messages": CHAT_MESSAGES}
    common = {"model": client.served_model, "max_tokens": 8, "temperature": 0.0, **request}
    unprocessed = create(**common, extra_body=_extra_body(client, []))
    banned = sorted(set(unprocessed.choices[0].model_extra["token_ids"][:3]))
    body = _extra_body(client, [SuppressTokens(banned), NoRepeatNGram(1)])
    whole = create(**common, extra_body=body)
    assert not set(whole.choices[0].model_extra["token_ids"]) & set(banned)
    chunks = list(create(**common, extra_body=body, stream=True))
    if endpoint == "completions":
        assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    else:
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole.choices[0].message.content


def test_an_installed_plugin_is_served_by_name(
    client: Any, server: Server, counting: list[int], plain: list[int], engine: GenerationEngine
) -> None:
    """The example package's entry point makes ``ban_two_back`` a type the server knows
    (nothing but installing it into the server's environment)."""
    plugin = pytest.importorskip("anylogits_example_plugin")
    _, tokens = complete(client, server, plugin.BanTwoBack())
    assert tokens != plain, "ban_two_back did not change the greedy output"
    assert tokens == engine.greedy(counting, [plugin.BanTwoBack()])


def test_concurrent_clients_get_what_each_gets_alone(
    client: Any, server: Server, plain: list[int]
) -> None:
    cases: list[list[LogitsProcessor]] = [
        [],
        [SuppressTokens(sorted(set(plain[:4])))],
        [NoRepeatNGram(2)],
        [LogitBias({plain[-1]: 4.0})],
        [],
        [NoRepeatNGram(2)],
        # Grammars of two schemas: where a server batches its requests, one fill.
        [
            JSONSchema(
                {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
            )
        ],
        [JSONSchema({"type": "array", "items": {"type": "boolean"}, "maxItems": 3})],
    ]
    alone = [complete(client, server, *processors)[1] for processors in cases]
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        futures = [pool.submit(complete, client, server, *processors) for processors in cases]
        together = [future.result()[1] for future in futures]
    assert together == alone
    assert alone[0] == plain and len({tuple(tokens) for tokens in alone}) == 6


def _refusal(client: Any, endpoint: str, text: str) -> Any:
    extra_body = {"vllm_xargs": {"anylogits": text}}
    with pytest.raises(openai.BadRequestError) as raised:
        if endpoint == "completions":
            client.completions.create(
                model=client.served_model, prompt=COUNTING, max_tokens=4, extra_body=extra_body
            )
        else:
            client.chat.completions.create(
                model=client.served_model,
                messages=CHAT_MESSAGES,
                max_tokens=4,
                extra_body=extra_body,
            )
    return raised.value


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("payload", sorted(BAD_PAYLOADS))
def test_bad_payload_gets_vllms_400_and_check_specs_message(
    payload: str, endpoint: str, client: Any, server: Server, plain: list[int]
) -> None:
    text, expected = BAD_PAYLOADS[payload]
    load_installed_plugins(client)
    error = _refusal(client, endpoint, text)
    assert error.status_code == 400
    assert error.body.get("type") == "BadRequestError", error.body
    assert expected in error.body.get("message", ""), error.body
    assert error.body["message"] == check_spec_message(text)
    assert complete(client, server)[1] == plain


def test_what_only_the_vocabulary_shows_is_a_400_too(
    client: Any, server: Server, plain: list[int]
) -> None:
    """An id beyond the vocabulary: vLLM's frontend cannot see it (its sequence is ended
    in the engine); these servers build the processors before generating, and refuse."""
    text = json.dumps(to_specs([SuppressTokens([10**7])]))
    error = _refusal(client, "completions", text)
    message = error.body.get("message", "")
    assert "extra_args['anylogits'] cannot run on the served model" in message, message
    assert str(10**7) in message, message
    assert complete(client, server)[1] == plain


def test_a_failing_processor_ends_its_own_request(
    client: Any, server: Server, plain: list[int]
) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        failing = pool.submit(complete, client, server, RaiseAfter(3))
        ordinary = pool.submit(complete, client, server)
        assert ordinary.result()[1] == plain
        tokens = failing.result()[1]
    assert tokens == [*plain[:3], EOS], tokens
    log = server.log_path.read_text(errors="replace")
    assert "testing.raise_after: 3 tokens were generated" in log, server.log_tail()
    assert "the request's sequence is ended" in log, server.log_tail()


def test_a_request_naming_another_model_still_gets_its_processors_or_a_400(
    client: Any, server: Server, plain: list[int]
) -> None:
    """llama-cpp-python serves its one model whatever a request names; mlx-lm would load
    the named model, for which the processors were not built: a 400 there."""
    try:
        response = client.completions.create(
            model="some-other-model",
            prompt=COUNTING,
            max_tokens=NEW_TOKENS,
            temperature=0.0,
            extra_body=_extra_body(client, [NoRepeatNGram(2)]),
        )
    except openai.BadRequestError as error:
        assert "anylogits processors run on the served model only" in error.body["message"]
    else:
        assert (
            response.choices[0].model_extra["token_ids"]
            == complete(client, server, NoRepeatNGram(2))[1]
        )


def test_the_serving_pages_client_talks_to_this_server(server: Server) -> None:
    """docs/serving.md's one client snippet, run as written against this server."""
    page = (Path(__file__).parents[1] / "docs" / "serving.md").read_text()
    (block,) = re.findall(r"^```python\n(# needs: openai_server\n.*?)^```", page, re.M | re.S)
    namespace = {"base_url": f"{server.base_url}/v1", "served_model": server.model}
    exec(compile(block, "docs/serving.md", "exec"), namespace)
    assert namespace["completion"].choices[0].text


@pytest.fixture(scope="module")
def real_server(server: Server, servers: Servers, real_model_dir: Path) -> Server:
    """The same server on the real model (SmolLM2-135M-Instruct; float32 GGUF for
    llama.cpp, the HF folder for mlx-lm)."""
    return servers.serving(server.backend, real_model_dir)


def test_real_model_extracts_the_person_through_the_server(
    real_server: Server, real_model_dir: Path
) -> None:
    """The demo's JSON case as a client sends it: the chat template is the model's own
    (the prompt's ids are transformers'), and the answer parses to the person."""
    transformers = pytest.importorskip("transformers")
    from anylogits import JSONSchema
    from anylogits.cli.demo.cases import JSON_PROMPT, JSON_TOKENS, PERSON
    from anylogits.engines.real_model import chat_ids

    client = client_of(real_server)
    response = client.chat.completions.create(
        model=client.served_model,
        messages=[{"role": "user", "content": JSON_PROMPT}],
        max_tokens=JSON_TOKENS,
        temperature=0.0,
        extra_body=_extra_body(client, [JSONSchema(PERSON)]),
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(real_model_dir)
    assert response.model_extra["prompt_token_ids"] == chat_ids(tokenizer, JSON_PROMPT)
    answer = json.loads(response.choices[0].message.content)
    assert answer == {"name": "Maria", "age": 34, "city": "Lisbon"}, answer


def test_server_log_has_no_traceback(client: Any, server: Server, plain: list[int]) -> None:
    """Run last (file order): nothing so far may have left a traceback in the log."""
    assert complete(client, server)[1] == plain
    server.check_alive()
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, server.log_tail()


def test_a_server_whose_engine_dies_says_so_and_exits_non_zero(
    server: Server, servers: Servers, tmp_path: Path
) -> None:
    """A request whose processor kills the engine's process with SIGSEGV (as llama.cpp's
    native code did on an AMX host) on a server of its own: the client's connection
    drops, and ``anylogits serve`` says what died, of what, serving what, and exits
    non-zero, where the log used to end at the last request."""
    import signal

    from conformance_tests.servers import _stop, start

    crashing = start(server.backend, servers.model_dir, tmp_path)
    try:
        # vLLM's API server outlives its engine core long enough to answer 500.
        dropped = (
            openai.InternalServerError if server.backend == "vllm" else openai.APIConnectionError
        )
        with pytest.raises(dropped):
            client_of(crashing).completions.create(
                model=crashing.model,
                prompt=COUNTING,
                max_tokens=4,
                extra_body={"vllm_xargs": {"anylogits": '[{"type": "testing.crash_process"}]'}},
            )
        code = crashing.process.wait(timeout=60)
    finally:
        _stop(crashing.process)
    log = crashing.log_tail()
    if server.backend == "vllm":
        # The engine core is the API server's child: vLLM sees it die, fails the request
        # and shuts its server down, which anylogits serve then says.
        assert code == 1, log
        assert "EngineDeadError" in log, log
        stopped = r"^anylogits serve vllm: vLLM's server stopped by itself \(exit code \d+\)"
        assert re.search(stopped, log, re.M) is not None, log
        return
    assert code == 128 + signal.SIGSEGV, log
    died = re.search(
        r"^anylogits serve \S+: .* died of SIGSEGV \(signal 11\) serving \S+.*$", log, re.M
    )
    assert died is not None, log
    if server.backend == "llama_cpp":
        assert "-DGGML_NATIVE=OFF" in died[0] and "one possible cause" in died[0]
