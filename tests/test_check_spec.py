"""`anylogits check-spec`: a request's specs checked as a vLLM server's frontend checks
them, with the server's HTTP 400 message (the vLLM server suite compares the two live)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from anylogits.cli.check_spec import SpecCheck, check_request
from anylogits.core.wire import validate_request
from test_support.catalogue import PROCESSOR_SPECS
from test_support.hostile import BAD_PAYLOADS, OVERSIZED, REQUEST_LEVEL

VALID = [{"type": "top_k", "top_k": 5}, {"type": "suppress_tokens", "token_ids": [3]}]


def check_spec(argument: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "anylogits", "check-spec", argument],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def server_message(text: str) -> str:
    """What the server's frontend answers a request carrying ``text`` in vllm_xargs."""
    with pytest.raises(ValueError) as raised:
        validate_request({"anylogits": text}, engine_in_this_process=False)
    return str(raised.value)


@pytest.fixture(scope="module")
def fresh_server_messages() -> dict[str, str]:
    """:func:`server_message` of every bad payload in a new process whose plugins are
    loaded, as the command runs (an unknown type's message lists the types and plugins
    that process has loaded)."""
    code = (
        "import json, sys\n"
        "from anylogits.core.wire import validate_request\n"
        "from anylogits.core.registry import load_plugins\n"
        "load_plugins()\n"
        "messages = {}\n"
        "for case, text in json.load(sys.stdin).items():\n"
        "    try:\n"
        "        validate_request({'anylogits': text}, engine_in_this_process=False)\n"
        "    except ValueError as error:\n"
        "        messages[case] = str(error)\n"
        "print(json.dumps(messages))\n"
    )
    texts = {case: text for case, (text, _) in BAD_PAYLOADS.items()}
    result = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_valid_file_is_admitted_with_a_summary_of_what_it_builds(tmp_path: Path) -> None:
    path = tmp_path / "specs.json"
    path.write_text(json.dumps(VALID))
    result = check_spec(str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("admitted: 2 processor(s)")
    assert lines[1] == "  [0] top_k: TopK(top_k=5, min_tokens_to_keep=1)"
    # SuppressTokens checks its ids against the vocabulary, which only the engine has.
    assert lines[2] == "  [1] suppress_tokens: SuppressTokens(token_ids=[3]) *"
    said = " ".join(result.stdout.split())
    assert "checked against the model's vocabulary on the server" in said
    # What each server does with a failure there: llama.cpp's and mlx-lm's answer 400.
    assert (
        "servers build the processors before generating and answer a failure with HTTP 400" in said
    )
    assert "vLLM's frontend has no vocabulary" in said


@pytest.mark.parametrize("case", sorted(BAD_PAYLOADS))
def test_stdin_with_a_bad_payload_exits_1_with_the_server_s_message(
    case: str, fresh_server_messages: dict[str, str]
) -> None:
    text, expected = BAD_PAYLOADS[case]
    result = check_spec("-", stdin=text)
    assert result.returncode == 1, result
    assert result.stdout == ""
    header, *message = result.stderr.splitlines()
    assert header == (
        "stdin: every anylogits server (vLLM's, llama-cpp-python's, mlx-lm's) refuses it "
        "with HTTP 400:"
    )
    assert "\n".join(message) == fresh_server_messages[case]
    assert expected in result.stderr


@pytest.mark.parametrize(
    "text",
    [
        '[{"type": "logit_bias", "bias": {"1": 1e999}}]',  # not finite
        '[{"type": "suppress_tokens", "token_ids": [1.5]}]',  # not an id
        '[{"type": "top_k"}]',  # missing field
        '[{"type": "transformers_object", "object_id": "x"}]',  # an object of no process
        "[[1, 2]]",  # a spec that is not a dict
        "[" * 3000 + "]" * 3000,  # nested too deep
    ],
)
def test_every_kind_of_bad_spec_gets_the_server_s_message(text: str) -> None:
    assert check_request(text) == SpecCheck(False, server_message(text))


@pytest.mark.parametrize("case", sorted(OVERSIZED))
def test_an_oversized_field_is_refused_by_its_limit(case: str) -> None:
    field, limit, build = OVERSIZED[case]
    text = json.dumps([build()])
    verdict = check_request(text)
    assert verdict == SpecCheck(False, server_message(text))
    # As the server suite checks it: a case too large for the request's own size limit
    # is refused by that one first.
    if "'spec_bytes'" not in verdict.text:
        assert f"anylogits limit {limit!r}" in verdict.text and field in verdict.text


@pytest.mark.parametrize("case", sorted(REQUEST_LEVEL))
def test_an_oversized_request_is_refused_by_its_limit(case: str) -> None:
    text, limit = REQUEST_LEVEL[case]
    verdict = check_request(text)
    assert verdict == SpecCheck(False, server_message(text))
    assert f"anylogits limit {limit!r}" in verdict.text


@pytest.mark.parametrize("name", sorted(PROCESSOR_SPECS))
def test_every_catalogue_spec_is_admitted(name: str) -> None:
    verdict = check_request(json.dumps(PROCESSOR_SPECS[name]))
    assert verdict.admitted, verdict.text
    assert f"[0] {PROCESSOR_SPECS[name]['type']}: " in verdict.text


ENVELOPES: dict[str, Callable[[list[dict]], dict]] = {
    "request body": lambda specs: {"model": "m", "vllm_xargs": {"anylogits": json.dumps(specs)}},
    "vllm_xargs": lambda specs: {"anylogits": json.dumps(specs)},
    "offline extra_args": lambda specs: {"extra_args": {"anylogits": specs}},
}


@pytest.mark.parametrize("envelope", sorted(ENVELOPES))
def test_the_server_s_envelopes_are_read(envelope: str) -> None:
    wrap = ENVELOPES[envelope]
    verdict = check_request(json.dumps(wrap([{"type": "top_k", "top_k": 5}])))
    assert verdict.admitted, verdict.text
    assert "[0] top_k: TopK(top_k=5" in verdict.text
    assert check_request(json.dumps(wrap([{"type": "top_k", "top_k": 0}]))) == SpecCheck(
        False, "extra_args['anylogits'][0]: top_k must be >= 1, got 0"
    )


def test_specs_as_objects_in_vllm_xargs_are_refused_as_vllm_refuses_them() -> None:
    verdict = check_request(json.dumps({"vllm_xargs": {"anylogits": VALID}}))
    assert not verdict.admitted and not verdict.from_server
    assert "only flat values in vllm_xargs" in verdict.text
    assert "anylogits.vllm_xargs(...)" in verdict.text


def test_an_envelope_without_specs_is_refused_naming_its_keys() -> None:
    verdict = check_request(json.dumps({"vllm_xargs": {"anylogit": "[]"}}))
    assert not verdict.admitted and not verdict.from_server
    assert "no 'anylogits' key (its keys: ['anylogit'])" in verdict.text


def test_an_unreadable_file_exits_2(tmp_path: Path) -> None:
    missing = check_spec(str(tmp_path / "missing.json"))
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr and "missing.json" in missing.stderr
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe[]")
    assert check_spec(str(binary)).returncode == 2
