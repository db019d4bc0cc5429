"""vLLM's OpenAI-compatible server with the anylogits processor class registered, driven
by the real ``openai`` client: per-request processors travel as ``vllm_xargs``, greedy
output agrees with transformers on the same weights (plugins' processors included: the
example package's entry point and the probes of ``ANYLOGITS_PLUGINS``), bad specs come
back as HTTP 400 and leave the server serving. The server
(``conformance_tests/servers.py``) is shared with the hostile-spec suite.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

from anylogits import (  # noqa: E402
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    NoRepeatNGram,
    SuppressTokens,
    vllm_xargs,
)
from anylogits.engines.generation import NEW_TOKENS, TransformersEngine  # noqa: E402
from conformance_tests.server_bounds import (  # noqa: E402, F401  (run here too)
    served_vocabulary,
    test_a_client_dropping_its_stream_leaves_the_server_whole,
    test_a_forced_byte_stops_at_max_tokens,
    test_an_error_answer_leaves_the_connection_serving,
)
from conformance_tests.server_soak import (  # noqa: E402, F401  (run here too)
    test_a_soak_of_random_specs_from_concurrent_clients,
)
from conformance_tests.server_suite import (  # noqa: E402, F401  (run here too)
    test_a_server_whose_engine_dies_says_so_and_exits_non_zero,
    test_concurrent_clients_get_what_each_gets_alone,
    test_the_serving_pages_client_talks_to_this_server,
)
from conformance_tests.servers import (  # noqa: E402
    MODEL_NAME,
    Server,
    check_spec_message,
    load_installed_plugins,
)
from test_support.generation_cases import COUNTING, CROSS_ENGINE_CASES  # noqa: E402
from test_support.hostile import BAD_PAYLOADS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("vllm")]

CHAT_MESSAGES = [{"role": "user", "content": "Count with me: 1 2 3 4 5 6 7 8"}]


# Every case, probes included: the server imports them through ANYLOGITS_PLUGINS.
SERVER_CASES = sorted(CROSS_ENGINE_CASES)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def counting(tokenizer: Any) -> list[int]:
    """The counting prompt's ids, BOS included (what transformers' reference is given)."""
    return tokenizer(COUNTING)["input_ids"]


def _token_ids(choice: Any) -> list[int]:
    ids = getattr(choice, "token_ids", None)
    assert ids is not None, f"the server returned no token_ids (return_token_ids): {choice}"
    return list(ids)


def _xargs(*processors: LogitsProcessor) -> dict[str, Any]:
    return {"vllm_xargs": vllm_xargs(*processors)} if processors else {}


def _greedy(
    create: Any, server: Server, processors: tuple[LogitsProcessor, ...], **request: Any
) -> Any:
    """``create(**request)`` greedy, with the token ids in the response and ``processors``
    as ``vllm_xargs``; a dead server says why it died."""
    try:
        return create(
            model=MODEL_NAME,
            temperature=0.0,
            extra_body={"return_token_ids": True, **_xargs(*processors)},
            **request,
        )
    except openai.APIConnectionError:
        server.check_alive()
        raise


def complete(
    client: Any,
    server: Server,
    prompt: list[int],
    *processors: LogitsProcessor,
    max_tokens: int = NEW_TOKENS,
) -> list[int]:
    """Greedy new token ids from the completions endpoint, prompt given as ids."""
    create = client.completions.create
    response = _greedy(create, server, processors, prompt=prompt, max_tokens=max_tokens)
    return _token_ids(response.choices[0])


def chat(
    client: Any, server: Server, *processors: LogitsProcessor, max_tokens: int = 8
) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy new token ids) from the chat completions endpoint."""
    create = client.chat.completions.create
    response = _greedy(create, server, processors, messages=CHAT_MESSAGES, max_tokens=max_tokens)
    prompt_ids = getattr(response, "prompt_token_ids", None)
    assert prompt_ids is not None, f"the server returned no prompt_token_ids: {response}"
    return list(prompt_ids), _token_ids(response.choices[0])


def repeated_bigrams(tokens: list[int]) -> set[tuple[int, int]]:
    seen: set[tuple[int, int]] = set()
    repeated: set[tuple[int, int]] = set()
    for bigram in itertools.pairwise(tokens):
        if bigram in seen:
            repeated.add(bigram)
        seen.add(bigram)
    return repeated


@pytest.fixture(scope="module")
def plain(client: Any, server: Server, counting: list[int]) -> list[int]:
    """The server's unprocessed greedy output on the counting prompt."""
    tokens = complete(client, server, counting)
    assert len(tokens) == NEW_TOKENS, f"expected {NEW_TOKENS} new tokens, got {tokens}"
    return tokens


def test_unprocessed_matches_transformers(
    plain: list[int], counting: list[int], reference: TransformersEngine
) -> None:
    assert plain == reference.greedy(counting)


def test_suppress_tokens(
    client: Any, server: Server, counting: list[int], plain: list[int]
) -> None:
    banned = sorted(set(plain[:4]))
    tokens = complete(client, server, counting, SuppressTokens(banned))
    assert not set(tokens) & set(banned), (tokens, banned)
    assert tokens != plain


def test_no_repeat_ngram(
    client: Any, server: Server, counting: list[int], plain: list[int]
) -> None:
    assert repeated_bigrams(counting + plain), "the unprocessed output repeats no bigram"
    tokens = complete(client, server, counting, NoRepeatNGram(2))
    assert not repeated_bigrams(counting + tokens), tokens
    assert tokens != plain


@pytest.mark.parametrize("case", SERVER_CASES)
def test_matches_transformers(
    case: str,
    client: Any,
    server: Server,
    counting: list[int],
    plain: list[int],
    reference: TransformersEngine,
) -> None:
    processors = CROSS_ENGINE_CASES[case](plain)
    tokens = complete(client, server, counting, *processors)
    assert tokens == reference.greedy(counting, processors)
    assert tokens != plain, f"{case} did not change the greedy output"


def test_an_installed_plugin_is_served_by_name(
    client: Any,
    server: Server,
    counting: list[int],
    plain: list[int],
    reference: TransformersEngine,
) -> None:
    """The example package's entry point makes ``ban_two_back`` a type the server knows,
    started with nothing but ``--logits-processors anylogits.adapters.vllm:AnyLogits``."""
    plugin = pytest.importorskip("anylogits_example_plugin")
    assert plugin.BanTwoBack().to_spec() == {"type": "ban_two_back"}
    tokens = complete(client, server, counting, plugin.BanTwoBack())
    assert tokens == reference.greedy(counting, [plugin.BanTwoBack()])
    assert tokens != plain, "ban_two_back did not change the greedy output"
    assert all(tokens[index] != tokens[index - 2] for index in range(2, len(tokens))), tokens


def test_the_authoring_guide_talks_to_the_server(server: Server) -> None:
    """docs/authoring.md's server blocks, run as written against this server."""
    pytest.importorskip("anylogits_example_plugin")
    guide = (Path(__file__).parents[1] / "docs" / "authoring.md").read_text()
    blocks = re.findall(r"^```python\n(# needs: openai_server\n.*?)^```", guide, re.M | re.S)
    assert blocks, "the guide has no server block"
    for block in blocks:
        namespace = {"base_url": f"{server.base_url}/v1", "served_model": MODEL_NAME}
        exec(compile(block, "docs/authoring.md", "exec"), namespace)
        assert namespace["completion"].choices[0].text


def test_an_unknown_type_names_the_plugins_and_how_to_add_one(
    client: Any, server: Server, counting: list[int]
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(
            model=MODEL_NAME,
            prompt=counting,
            max_tokens=4,
            extra_body={"vllm_xargs": {"anylogits": '[{"type": "no_such_processor"}]'}},
        )
    message = raised.value.body.get("message", "")
    assert "ANYLOGITS_PLUGINS modules: test_support.probes" in message, message
    assert "testing.generated_hash_bias" in message and "ban_two_back" in message, message
    assert "entry-point group 'anylogits.processors'" in message, message


def test_chat_logit_bias_and_no_repeat(client: Any, server: Server, tokenizer: Any) -> None:
    prompt, plain_chat = chat(client, server)
    assert plain_chat, "the chat completion generated nothing"
    (target,) = tokenizer(" banana", add_special_tokens=False)["input_ids"]
    assert target not in prompt and target not in plain_chat

    prompt_biased, forced = chat(client, server, LogitBias({target: 50.0}))
    assert prompt_biased == prompt
    assert forced == [target] * 8, forced

    # The bigram (target, target) may occur once: the third token cannot be target again.
    _, limited = chat(client, server, LogitBias({target: 50.0}), NoRepeatNGram(2))
    assert limited[:2] == [target, target], limited
    assert limited[2] != target, limited
    assert not repeated_bigrams(prompt + limited), limited


def test_chat_suppress_tokens(client: Any, server: Server) -> None:
    _, plain_chat = chat(client, server)
    banned = sorted(set(plain_chat[:3]))
    _, tokens = chat(client, server, SuppressTokens(banned))
    assert not set(tokens) & set(banned), (tokens, banned)
    assert tokens != plain_chat


def test_min_new_tokens_holds_off_eos(
    client: Any, server: Server, counting: list[int], tokenizer: Any
) -> None:
    """A bias that makes EOS the argmax, then MinNewTokens: EOS comes exactly after 5."""
    eos = tokenizer.eos_token_id
    assert complete(client, server, counting, LogitBias({eos: 50.0}), max_tokens=8) == [eos]
    tokens = complete(
        client, server, counting, LogitBias({eos: 50.0}), MinNewTokens(5), max_tokens=8
    )
    assert len(tokens) == 6 and tokens[-1] == eos and eos not in tokens[:5], tokens


def test_out_of_vocabulary_id_ends_the_request_and_server_keeps_serving(
    client: Any, server: Server, counting: list[int], plain: list[int], tokenizer: Any
) -> None:
    """Ids are checked against the vocabulary only when the engine adds the request (the
    validation hook has no vocabulary): the request's sequence is ended with EOS and the
    error is logged, instead of the engine failing."""
    too_large = 10**7
    response = client.completions.create(
        model=MODEL_NAME,
        prompt=counting,
        max_tokens=8,
        temperature=0.0,
        extra_body={"return_token_ids": True, **_xargs(SuppressTokens([too_large]))},
    )
    choice = response.choices[0]
    assert _token_ids(choice) == [tokenizer.eos_token_id], choice
    assert choice.finish_reason == "stop", choice
    server.check_alive()
    assert complete(client, server, counting) == plain
    log = server.log_path.read_text(errors="replace")
    assert "anylogits: processors" in log and str(too_large) in log, server.log_tail()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("payload", sorted(BAD_PAYLOADS))
def test_bad_payload_is_400_and_server_keeps_serving(
    payload: str,
    endpoint: str,
    client: Any,
    server: Server,
    counting: list[int],
    plain: list[int],
) -> None:
    text, expected = BAD_PAYLOADS[payload]
    extra_body = {"vllm_xargs": {"anylogits": text}}
    with pytest.raises(openai.BadRequestError) as raised:
        if endpoint == "completions":
            client.completions.create(
                model=MODEL_NAME, prompt=counting, max_tokens=4, extra_body=extra_body
            )
        else:
            client.chat.completions.create(
                model=MODEL_NAME, messages=CHAT_MESSAGES, max_tokens=4, extra_body=extra_body
            )
    error = raised.value
    assert error.status_code == 400
    # vLLM's error body: {"message": ..., "type": "BadRequestError", "param": None, "code": 400}
    assert isinstance(error.body, dict), error.body
    assert error.body.get("type") == "BadRequestError", error.body
    assert expected in error.body.get("message", ""), error.body
    server.check_alive()
    assert complete(client, server, counting) == plain


@pytest.mark.parametrize("payload", sorted(BAD_PAYLOADS))
def test_check_spec_answers_what_the_server_answers(payload: str, client: Any) -> None:
    """`anylogits check-spec`, run with the server's plugin list, prints the server's
    HTTP 400 message word for word."""
    text = BAD_PAYLOADS[payload][0]
    load_installed_plugins(client)
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(
            model=MODEL_NAME,
            prompt="1 2 3",
            max_tokens=4,
            extra_body={"vllm_xargs": {"anylogits": text}},
        )
    assert raised.value.body["message"] == check_spec_message(text)


def test_server_log_has_no_traceback(
    client: Any, server: Server, counting: list[int], plain: list[int]
) -> None:
    """Run last (file order): nothing so far may have left a traceback in the server log."""
    assert complete(client, server, counting) == plain
    server.check_alive()
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, server.log_tail()
