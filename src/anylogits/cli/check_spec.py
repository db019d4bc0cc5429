"""``anylogits check-spec``: check a request's processor specs as every anylogits server
checks them (:func:`~anylogits.core.wire.validate_request`, which vLLM's
``validate_params`` and the llama-cpp-python and mlx-lm servers' admission call),
without an engine or a model.

The input is what a client sends: the specs' JSON (a list of specs or one spec, the
string ``vllm_xargs["anylogits"]`` carries), or a JSON object holding them under
``vllm_xargs`` (an OpenAI-compatible request body) or ``extra_args`` (offline
``SamplingParams``), or the ``vllm_xargs`` object itself (``{"anylogits": ...}``).
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

from anylogits.core import registry
from anylogits.core.limits import checking_client_side
from anylogits.core.processor import LogitsProcessor
from anylogits.core.specs import from_spec
from anylogits.core.wire import SPEC_KEY, validate_request

ENVELOPES = ("vllm_xargs", "extra_args")
# Who checks specs with this code: every server anylogits serve starts.
SERVERS = "every anylogits server (vLLM's, llama-cpp-python's, mlx-lm's)"
LINE_WIDTH = 100
VOCABULARY_CHECKS = (
    "checked against the model's vocabulary on the server (token ids in range, strings "
    "tokenized, grammars compiled for the tokenizer): llama-cpp-python's and mlx-lm's "
    "servers build the processors before generating and answer a failure with HTTP 400; "
    "vLLM's frontend has no vocabulary, so there a failure ends the request's sequence "
    "and is logged"
)
UNCOMPILED = (
    "structured specs were checked for their size and counts only: this machine lacks "
    "llguidance, which compiles them ({install}); a server that has it compiles them on "
    "arrival and answers a grammar that does not compile with HTTP 400, and one without "
    "it refuses every structured spec"
)


@dataclass(frozen=True)
class SpecCheck:
    """The verdict: ``admitted`` with a summary, or the message the server refuses with
    (``from_server``: the text of its HTTP 400; otherwise a refusal of this command's own,
    which names why)."""

    admitted: bool
    text: str
    from_server: bool = True


def _request_extra_args(text: str) -> tuple[Any, str]:
    """The ``extra_args`` a server request carrying ``text`` has, and where they came from."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None  # not JSON: the server's own check says so, with its message
    if isinstance(value, dict) and "type" not in value:
        for envelope in ENVELOPES:
            if envelope in value:
                return value[envelope], envelope
        if SPEC_KEY in value:
            return value, "vllm_xargs"
    return {SPEC_KEY: text}, f"vllm_xargs[{SPEC_KEY!r}]"


def _is_flat(value: Any) -> bool:
    """Whether vLLM's request model accepts ``value`` in ``vllm_xargs`` (str, int, float,
    or a list of them)."""
    scalar = (str, int, float)
    return isinstance(value, scalar) or (
        isinstance(value, list) and all(isinstance(item, scalar) for item in value)
    )


def _line(index: int, processor: LogitsProcessor) -> str:
    vocabulary = type(processor).bind is not LogitsProcessor.bind
    text = f"  [{index}] {processor.spec_name}: {processor!r}"
    if len(text) > LINE_WIDTH:
        text = text[: LINE_WIDTH - 3] + "..."
    return text + (" *" if vocabulary else "")


def check_request(text: str) -> SpecCheck:
    """Check the specs of a request carrying ``text`` (see the module's docstring) as the
    server's frontend would."""
    extra_args, source = _request_extra_args(text)
    if not isinstance(extra_args, dict):
        return SpecCheck(False, f"{source} is a {type(extra_args).__name__}, not an object", False)
    if source == "vllm_xargs" and SPEC_KEY in extra_args and not _is_flat(extra_args[SPEC_KEY]):
        return SpecCheck(
            False,
            f"vllm_xargs[{SPEC_KEY!r}] is a {type(extra_args[SPEC_KEY]).__name__} holding "
            "objects; vLLM's server accepts only flat values in vllm_xargs (str, int, float "
            "or a list of them) and refuses the request before anylogits sees it: send the "
            "specs as one JSON string (anylogits.vllm_xargs(...) builds it)",
            False,
        )
    try:
        # As a server that has loaded its plugins (its engine loads every one at start,
        # its frontend each on first use), so an unknown type's message lists the same.
        registry.load_plugins()
    except ValueError as error:
        return SpecCheck(
            False, f"a plugin fails to load, as it would at engine start: {error}", False
        )
    try:
        # Where llguidance is missing, only this machine lacks it: a structured spec is
        # checked as far as it can be here, and the note says what was left out.
        with checking_client_side():
            specs = validate_request(extra_args, engine_in_this_process=False)
            processors = [from_spec(spec) for spec in specs]
    except ValueError as error:
        return SpecCheck(False, str(error))
    if SPEC_KEY not in extra_args:
        return SpecCheck(
            False,
            f"{source} has no {SPEC_KEY!r} key (its keys: {sorted(extra_args)}): the server "
            "runs this request without anylogits processors",
            False,
        )
    lines = [
        f"admitted: {len(processors)} processor(s), as {SERVERS} checks them (from {source})",
        *(_line(index, processor) for index, processor in enumerate(processors)),
    ]
    if any(line.endswith(" *") for line in lines):
        lines += textwrap.wrap(f"* {VOCABULARY_CHECKS}", LINE_WIDTH, subsequent_indent="  ")
    if any(_uncompiled(processor) for processor in processors):
        from anylogits.installation import pip_install

        note = UNCOMPILED.format(install=pip_install("structured"))
        lines += textwrap.wrap(f"note: {note}", LINE_WIDTH, subsequent_indent="  ")
    return SpecCheck(True, "\n".join(lines))


def _uncompiled(processor: LogitsProcessor) -> bool:
    """Whether ``processor`` is a structured one whose grammar this machine could not
    build (no llguidance)."""
    return bool(getattr(processor, "grammar_pending", False))


def _read(path: str) -> str:
    """The text of ``path`` (``-``: stdin); ``OSError`` or ``UnicodeDecodeError`` when it
    cannot be read as UTF-8."""
    if path == "-":
        return sys.stdin.buffer.read().decode("utf-8")
    with open(path, "rb") as file:
        return file.read().decode("utf-8")


def run_check_spec(path: str) -> int:
    """``anylogits check-spec``: 0 when the server admits the specs in ``path`` (``-``:
    stdin), 1 when it refuses them (its HTTP 400 message on stderr), 2 when ``path``
    cannot be read."""
    name = "stdin" if path == "-" else path
    try:
        text = _read(path)
    except (OSError, UnicodeDecodeError) as error:
        print(f"anylogits check-spec: cannot read {name} as UTF-8 text: {error}", file=sys.stderr)
        return 2
    verdict = check_request(text)
    if verdict.admitted:
        print(verdict.text)
        return 0
    if verdict.from_server:
        print(f"{name}: {SERVERS} refuses it with HTTP 400:", file=sys.stderr)
    else:
        print(f"{name}: refused by check-spec (before the server's own checks):", file=sys.stderr)
    print(verdict.text, file=sys.stderr)
    return 1
