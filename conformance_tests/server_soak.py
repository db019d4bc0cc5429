"""A soak of every server (``server_suite`` imports it for llama-cpp-python's and mlx-lm's,
``test_vllm_server`` for vLLM's): hundreds of requests from concurrent ``openai`` clients,
each with specs drawn at random (seeded) from every kind of the catalogue, unique JSON
schemas and regexes (each a compile of its own, so caches fill and turn over), and
malformed specs.

Every well-formed request is answered with what it asked (JSON that parses and validates,
text matching its regex, never more than its ``max_tokens``), every malformed one with
HTTP 400, and the server's memory (its process tree's resident set) after the second half
stays within a bound of its size after the first. p50/p99 latencies are printed.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from conformance_tests.servers import Server, native_fields, process_tree_rss
from test_support.catalogue import PROCESSOR_SPECS, VOCABULARY_SPECS
from test_support.generation_cases import COUNTING
from test_support.hostile import BAD_PAYLOADS

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

REQUESTS = 240  # two halves; the memory is read after each
CLIENTS = 8
SOAK_SECONDS = 900.0  # the whole soak, on a busy 2-core machine
PLAIN_TOKENS = 8
STRUCTURED_TOKENS = 48
# The process tree may grow this much between the halves: a tenth of its size, plus what
# the second half's unique grammars add to the compiled-grammar cache (bounded at 256
# grammars; ~1.3 MiB each measured on llama.cpp's server, 82 MiB for 60 grammars).
MEMORY_GROWTH_FRACTION = 0.10
MEMORY_PER_GRAMMAR_BYTES = 2 * 2**20
CATALOGUE = {**PROCESSOR_SPECS, **VOCABULARY_SPECS}


@dataclass(frozen=True)
class Draw:
    """One request of the soak: its specs (``None``: none; a string: sent as it is) and
    what its answer must satisfy."""

    kind: str
    specs: Any
    max_tokens: int
    chat: bool = False
    schema: dict[str, Any] | None = None
    pattern: str | None = None
    refused: bool = False


def draw(rng: random.Random, index: int) -> Draw:
    """The ``index``-th request: unique schemas and regexes carry ``index`` in them."""
    roll = rng.random()
    if roll < 0.10:
        return Draw("none", None, PLAIN_TOKENS, chat=rng.random() < 0.5)
    if roll < 0.20:
        name = rng.choice(sorted(BAD_PAYLOADS))
        return Draw(f"malformed:{name}", BAD_PAYLOADS[name][0], PLAIN_TOKENS, refused=True)
    if roll < 0.35:
        key = f"field_{index}_{rng.randrange(10**6)}"
        schema = {
            "type": "object",
            "properties": {key: {"enum": ["red", "green", "blue"]}},
            "required": [key],
            "additionalProperties": False,
        }
        specs = [{"type": "json_schema", "schema": schema}]
        return Draw("unique_json_schema", specs, STRUCTURED_TOKENS, schema=schema)
    if roll < 0.45:
        pattern = f"id{index}-[a-c]{{2}}"
        specs = [{"type": "regex", "pattern": pattern}]
        return Draw("unique_regex", specs, STRUCTURED_TOKENS, pattern=pattern)
    names = rng.sample(sorted(CATALOGUE), rng.choice((1, 1, 2, 3)))
    return Draw(
        "+".join(names), [CATALOGUE[name] for name in names], PLAIN_TOKENS, rng.random() < 0.3
    )


def _send(client: Any, request: Draw, native: dict[str, Any]) -> tuple[Draw, Any, float]:
    """``(request, its response or the API error, seconds)``."""
    extra: dict[str, Any] = {"return_token_ids": True, **native}
    if request.specs is not None:
        specs = request.specs if isinstance(request.specs, str) else json.dumps(request.specs)
        extra["vllm_xargs"] = {"anylogits": specs}
    common = {
        "model": client.served_model,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "extra_body": extra,
    }
    started = time.monotonic()
    try:
        if request.chat:
            answer = client.chat.completions.create(
                messages=[{"role": "user", "content": COUNTING}], **common
            )
        else:
            answer = client.completions.create(prompt=COUNTING, **common)
    except openai.APIStatusError as error:
        answer = error
    return request, answer, time.monotonic() - started


def _wrong(request: Draw, answer: Any) -> str | None:
    """What is wrong with ``answer`` to ``request``, or ``None``."""
    if request.refused:
        if isinstance(answer, openai.BadRequestError):
            return None
        return f"expected HTTP 400, got {answer!r}"[:300]
    if isinstance(answer, openai.APIStatusError):
        return f"HTTP {answer.status_code}: {answer.message}"[:300]
    choice = answer.choices[0]
    text = choice.message.content if request.chat else choice.text
    if answer.usage.completion_tokens > request.max_tokens:
        return f"{answer.usage.completion_tokens} tokens, max_tokens {request.max_tokens}"
    if request.schema is not None:
        try:
            jsonschema.validate(json.loads(text), request.schema)
        except (ValueError, jsonschema.ValidationError) as error:
            return f"not JSON of its schema: {text!r} ({error})"[:300]
    if request.pattern is not None and re.fullmatch(request.pattern, text or "") is None:
        return f"{text!r} does not match {request.pattern!r}"
    return None


def test_a_soak_of_random_specs_from_concurrent_clients(client: Any, server: Server) -> None:
    rng = random.Random(20261128)
    native = native_fields(server)
    requests = [draw(rng, index) for index in range(REQUESTS)]
    started = time.monotonic()
    wrong: list[str] = []
    latencies: list[float] = []
    memory: list[int] = []
    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        for half in (requests[: REQUESTS // 2], requests[REQUESTS // 2 :]):
            for request, answer, seconds in pool.map(lambda r: _send(client, r, native), half):
                latencies.append(seconds)
                problem = _wrong(request, answer)
                if problem is not None:
                    wrong.append(f"{request.kind}: {problem}")
            server.check_alive()
            memory.append(process_tree_rss(server.process.pid))
            assert time.monotonic() - started < SOAK_SECONDS, "the soak ran out of time"
    kinds = {request.kind.split(":")[0] for request in requests}
    p99 = statistics.quantiles(latencies, n=100, method="inclusive")[98]
    print(
        f"\n{server.backend} soak: {len(requests)} requests ({len(kinds)} kinds), "
        f"{CLIENTS} clients, {time.monotonic() - started:.1f} s; latency p50 "
        f"{statistics.median(latencies):.2f} s, p99 {p99:.2f} s; "
        f"process tree {memory[0] / 2**20:.0f} MiB after the first half, "
        f"{memory[1] / 2**20:.0f} MiB after the second; wrong: {len(wrong)}"
    )
    assert not wrong, "\n".join(wrong[:20])
    names = {name for request in requests for name in request.kind.split("+")}
    assert set(CATALOGUE) <= names, sorted(set(CATALOGUE) - names)
    grammars = sum(
        request.schema is not None or request.pattern is not None
        for request in requests[REQUESTS // 2 :]
    )
    allowed = MEMORY_GROWTH_FRACTION * memory[0] + MEMORY_PER_GRAMMAR_BYTES * grammars
    assert memory[1] - memory[0] <= allowed, (memory, grammars)
