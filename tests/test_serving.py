"""What every engine's server does with a request's specs before the engine sees them
(``anylogits.serving``), and ``anylogits serve``'s command line. The servers themselves
run in their backends' sessions (``conformance_tests/test_*_server.py``)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

import anylogits
from anylogits import LogitBias, NoRepeatNGram, SuppressTokens, to_specs, vllm_xargs
from anylogits.cli.serve import VLLM_PROCESSOR_CLASS, help_text, start_line, vllm_command
from anylogits.core import limits as limits_module
from anylogits.core.pending import PendingLogits
from anylogits.core.wire import validate_request
from anylogits.serving import (
    Refused,
    RequestPipeline,
    admit,
    error_body,
    log_refusal,
    request_specs,
    with_token_ids,
)
from test_support import child_environment
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


def test_a_requests_schema_is_checked_and_translated_once_per_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server admits a request (its specs checked, then built to run): the second
    build, and every later request with the same specs, takes the grammar the first
    check made; the masks are those of a schema built in Python."""
    pytest.importorskip("llguidance")
    from test_support.grammar_fills import counted_checks

    checked = counted_checks(monkeypatch)
    vocab = anylogits.Vocabulary((b'"', b"A", b"B", b"C", b"AB", b"<eos>"), frozenset({5}))
    schema = {"type": "string", "enum": ["AB", "BA", "CAB"], "maxLength": 643}
    sent = {
        "prompt": "x",
        "vllm_xargs": {"anylogits": json.dumps([{"type": "json_schema", "schema": schema}])},
    }
    requests = [admit(sent, vocab, request="r") for _ in "abc"]
    assert len(checked) == 1
    grammars = {id(p.pipeline.processors[0].grammar) for p in requests if p.pipeline}
    assert len(grammars) == 1
    mine = anylogits.Pipeline([anylogits.JSONSchema(schema)], vocab)
    prompt, after = torch.tensor([[1]]), torch.tensor([[1, 0]])  # then '"'
    expected = [mine(torch.zeros(1, 6), ids) for ids in (prompt, after)]
    assert torch.isinf(expected[1]).any() and not torch.equal(*expected)
    for request in requests:
        assert request.pipeline is not None
        masks = [request.pipeline(torch.zeros(1, 6), ids) for ids in (prompt, after)]
        assert all(map(torch.equal, masks, expected))


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


def test_a_request_given_pending_logits_fails_as_one_given_logits() -> None:
    """mlx-lm's server hands a request's pipeline logits still being computed: a
    processor that fails ends the request there too, on the logits once computed."""
    pipeline = RequestPipeline([RaiseAfter(2), NoRepeatNGram(2)], VOCAB, request="request 9")
    ended = torch.full((1, 8), float("-inf"))
    ended[0, EOS] = 0.0
    for generated in range(5):
        history = torch.tensor([[1, 2, *range(generated)]])
        pending = PendingLogits(1, torch.device("cpu"), lambda: torch.zeros(1, 8))
        expected = torch.zeros(1, 8) if generated < 2 else ended
        assert torch.equal(pipeline(pending, history), expected), generated
    assert pipeline.failure is not None


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


def test_a_refusal_is_logged_in_one_bounded_line(caplog: pytest.LogCaptureFixture) -> None:
    huge = json.dumps([{"type": "bad_words", "words": ["x" * 100_000]}])
    message = "extra_args['anylogits'][0].words: too long\nsecond line"
    with caplog.at_level(logging.WARNING, logger="anylogits.serving"):
        log_refusal("POST /v1/completions", message, {"vllm_xargs": {"anylogits": huge}})
        log_refusal("a request", message, {"vllm_xargs": {"anylogits": [{"type": "x"}]}})
    first, second = (record.getMessage() for record in caplog.records)
    assert first.startswith(
        "anylogits: refused POST /v1/completions with HTTP 400: "
        'extra_args[\'anylogits\'][0].words: too long; specs: [{"type": "bad_words"'
    )
    assert "second line" not in first and "\n" not in first
    assert first.endswith(f"... ({len(huge)} chars)") and len(first) < 400
    assert second.endswith('specs: [{"type": "x"}]')


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
    result = anylogits_serve(*argv)
    assert result.returncode == 2, result
    assert "the engine is one of transformers, llama-cpp, mlx, vllm" in result.stderr, result.stderr


def anylogits_serve(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anylogits", "serve", *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=cwd,
        env=env,
    )


@pytest.mark.parametrize("engine", ["llama-cpp", "mlx", "vllm"])
@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        (
            "ANYLOGITS_PLUGINS",
            "broken_processors",
            "anylogits plugin module 'broken_processors' (from ANYLOGITS_PLUGINS) failed to "
            "import: RuntimeError: boom",
        ),
        ("ANYLOGITS_LIMITS", "{nope", "ANYLOGITS_LIMITS is not a JSON object"),
    ],
)
def test_a_broken_plugin_or_limit_stops_every_server_at_start(
    tmp_path: Path, engine: str, variable: str, value: str, said: str
) -> None:
    # In the working directory, as a user writes one next to the command.
    (tmp_path / "broken_processors.py").write_text("raise RuntimeError('boom')\n")
    result = anylogits_serve(
        engine, "--model", "m", cwd=tmp_path, env=child_environment(**{variable: value})
    )
    assert result.returncode == 1, result
    assert result.stderr.startswith(f"anylogits serve {engine}: {said}"), result.stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_serve_help_says_what_anylogits_adds_to_every_engine(flag: str) -> None:
    result = anylogits_serve(flag)
    assert result.returncode == 0, result
    for said in (
        "usage: anylogits serve ENGINE",
        "llama-cpp-python's server",
        "mlx-lm's server",
        "vLLM's server",
        '"vllm_xargs": {"anylogits":',
        "ANYLOGITS_LIMITS",
        "ANYLOGITS_PLUGINS",
        "ANYLOGITS_LOG_LEVEL",
        "docs/serving.md",
        "anylogits check-spec",
    ):
        assert said in result.stdout, (said, result.stdout)


def test_serve_engine_help_prints_ours_then_the_engines_own() -> None:
    result = anylogits_serve("llama-cpp", "--model", "x.gguf", "--help")
    assert result.stdout.startswith("usage: anylogits serve llama-cpp"), result
    assert "ANYLOGITS_PLUGINS" in result.stdout and "mlx-lm's server" not in result.stdout
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError:  # the engine's part: how to install it
        assert result.returncode == 1 and "install it with" in result.stderr, result
        return
    assert result.returncode == 0, result
    ours, engines = result.stdout.split("own options follow.", 1)
    assert "--n_ctx" in engines and "--n_ctx" not in ours


def test_the_specs_a_client_builds_are_the_specs_a_server_admits() -> None:
    processors = [NoRepeatNGram(2), LogitBias({3: 1.5})]
    admitted = admit(body(*processors), VOCAB, request="r")
    assert admitted.pipeline is not None
    assert to_specs(list(admitted.pipeline.processors)) == to_specs(processors)


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this session"
)
def test_serve_vllm_without_vllm_says_how_to_install_it() -> None:
    result = anylogits_serve("vllm", "--model", "m")
    assert result.returncode == 1, result
    assert result.stderr.startswith("anylogits serve vllm: No module named 'vllm'; install it"), (
        result.stderr
    )
    assert "pip install" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_serve_vllm_help_names_the_server_and_what_anylogits_sets() -> None:
    text = help_text("vllm")
    assert "vLLM's server's own options follow." in text, text
    assert f"(--logits-processors {VLLM_PROCESSOR_CLASS} added)" in text, text
    assert "set's own options" not in text


def test_serve_llama_cpp_with_a_missing_model_file_says_so_in_one_line() -> None:
    result = anylogits_serve("llama-cpp", "--model", "/nonexistent.gguf")
    assert result.returncode == 2, result
    assert result.stderr.strip().splitlines() == [
        "anylogits serve llama-cpp: --model /nonexistent.gguf: no such file; it takes a GGUF "
        "file (anylogits cache lists the ones anylogits keeps)"
    ], result.stderr


def test_a_server_says_first_that_anylogits_is_active_with_its_plugins_and_limits() -> None:
    """One line before the engine's own log (llama.cpp's runs to thousands of lines), once
    the engine is there to start."""
    with mock.patch.dict(os.environ, {"ANYLOGITS_LIMITS": '{"items": 5}'}):
        limits_module._current = None
        try:
            line = start_line("mlx")
        finally:
            limits_module._current = None
    assert line.startswith("anylogits ") and "active on mlx-lm's server" in line, line
    assert "plugins loaded:" in line and "ANYLOGITS_PLUGINS" in line, line
    assert "limits: items=5 (from ANYLOGITS_LIMITS), the rest the defaults" in line, line
    assert "limits: the defaults" in start_line("mlx")


@pytest.mark.skipif(
    importlib.util.find_spec("mlx_lm") is not None, reason="mlx-lm is installed in this session"
)
def test_no_active_line_when_the_engine_is_not_there() -> None:
    result = anylogits_serve("mlx", "--model", "m")
    assert result.returncode == 1 and "active on" not in result.stderr, result.stderr
