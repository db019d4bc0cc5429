"""A machine without llguidance (the ``structured`` extra): a client still builds structured
specs, ``check-spec`` says only this machine lacks it, and a server refuses structured
requests without telling the client anything of its own installation.

Each check runs in a child process where ``import llguidance`` fails."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from anylogits import JSONSchema, Regex, vllm_xargs
from test_support import child_environment

pytest.importorskip("llguidance")  # the specs built with it are the reference

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
WITHOUT_LLGUIDANCE = "import sys\nsys.modules['llguidance'] = None\n"


def _without_llguidance(code: str) -> str:
    """What ``code`` prints, run where llguidance cannot be imported."""
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_LLGUIDANCE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=child_environment(),
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_a_client_builds_structured_specs_without_llguidance() -> None:
    """docs/serving.md: a client needs none of the server's code."""
    printed = _without_llguidance(
        f"""
        import json
        from anylogits import JSONSchema, Regex, vllm_xargs
        print(json.dumps(vllm_xargs(JSONSchema({SCHEMA!r}), Regex("[0-9]{{4}}"))))
        """
    )
    assert json.loads(printed) == vllm_xargs(JSONSchema(SCHEMA), Regex("[0-9]{4}"))


def test_a_server_without_llguidance_refuses_without_its_paths() -> None:
    printed = _without_llguidance(
        """
        from anylogits import Vocabulary
        from anylogits.serving import Refused, admit
        vocab = Vocabulary((b"a", b"b", b"<eos>"), eos_token_ids=frozenset({2}))
        body = {"vllm_xargs": {"anylogits": '[{"type": "json_schema", "schema": {}}]'}}
        try:
            admit(body, vocab, request="r")
        except Refused as refusal:
            print(refusal)
        from anylogits.cli.serve import start_line
        print(start_line("llama-cpp"))
        """
    )
    refusal, start = printed.splitlines()
    assert "structured output" in refusal and "unavailable on this server" in refusal, refusal
    assert "pip install" not in refusal and "/" not in refusal, refusal
    # The operator is told at start, with the command that adds it.
    assert "structured output (regex, JSON schema, choice, grammar) is unavailable" in start
    assert "pip install" in start and "[structured]" in start, start


def test_check_spec_without_llguidance_blames_this_machine_not_the_servers() -> None:
    printed = _without_llguidance(
        f"""
        import json
        from anylogits.cli.check_spec import check_request
        verdict = check_request(json.dumps([{{"type": "json_schema", "schema": {SCHEMA!r}}}]))
        print(json.dumps([verdict.admitted, verdict.text]))
        """
    )
    admitted, text = json.loads(printed)
    assert admitted, text
    assert "refuses it with HTTP 400" not in text
    assert "this machine lacks llguidance" in " ".join(text.split()), text


def test_check_spec_with_llguidance_compiles_and_refuses() -> None:
    """The same command where llguidance is installed: no note, and a schema that does not
    compile is the server's 400."""
    from anylogits.cli.check_spec import check_request

    verdict = check_request(json.dumps([{"type": "json_schema", "schema": SCHEMA}]))
    assert verdict.admitted and "lacks llguidance" not in verdict.text, verdict.text
    bad = check_request(json.dumps([{"type": "regex", "pattern": "(unclosed"}]))
    assert not bad.admitted and bad.from_server, bad.text
