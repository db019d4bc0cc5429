"""Per-request processors on an engine's own OpenAI-compatible server, the engine aside.

Every server takes the request field vLLM's takes, ``vllm_xargs["anylogits"]`` (a list of
specs or its JSON text), so one client request works against vLLM's, llama-cpp-python's
and mlx-lm's servers unchanged. A request is checked where it arrives, before it reaches
the engine, by the function vLLM's frontend runs
(:func:`~anylogits.core.wire.validate_request`: the limits, the same
messages, ``anylogits check-spec``'s answer), and then built for the served model's
vocabulary: a spec that cannot run there (an id beyond the vocabulary, a grammar the
tokenizer cannot express) is an HTTP 400 too, where vLLM, whose frontend has no
vocabulary, ends the sequence instead. A refusal's body is vLLM's error body.

Once admitted, a request's processors run in a :class:`RequestPipeline`: an error in one
ends that request's sequence (only end-of-sequence allowed, the error logged) and never
reaches the engine, which serves the other requests on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from anylogits.core.fast_paths import Candidates
from anylogits.core.pending import PendingLogits
from anylogits.core.pipeline import Pipeline, end_sequences
from anylogits.core.processor import LogitsProcessor
from anylogits.core.specs import build_specs
from anylogits.core.vocab import Vocabulary
from anylogits.core.wire import SPEC_FIELD, SPEC_KEY, validate_request

logger = logging.getLogger("anylogits.serving")

REQUEST_FIELD = "vllm_xargs"
"""The request body's field that holds the specs under :data:`SPEC_KEY` (vLLM's name)."""

TOKEN_IDS_FIELD = "return_token_ids"
"""The request body's flag asking for the generated token ids (vLLM's name): a
completion's choice then carries ``token_ids``."""


class Refused(ValueError):
    """A request the server answers with HTTP 400; the text is the error message."""


@dataclass(frozen=True)
class Admitted:
    """A request that passed: its processors (``None`` when it names none) and whether
    it asked for its token ids."""

    pipeline: RequestPipeline | None
    return_token_ids: bool


class RequestPipeline(Pipeline):
    """One request's processors on a server: a processor that raises ends the request's
    sequence instead of raising into the engine, which would fail every request it
    batches. From then on only the first end-of-sequence id is allowed (as vLLM's
    requests end, :func:`~anylogits.core.pipeline.end_sequences`); the error is logged
    once.

    Args:
        processors: the request's processors.
        vocab: the served model's vocabulary; its first end-of-sequence id ends a failed
            request.
        request: how the log names the request.
    """

    def __init__(
        self, processors: Iterable[LogitsProcessor], vocab: Vocabulary, *, request: str
    ) -> None:
        super().__init__(processors, vocab)
        self.request = request
        self.failure: str | None = None

    def __call__(
        self, logits: torch.Tensor | PendingLogits, token_ids: Any = None, **kwargs: Any
    ) -> torch.Tensor:
        if self.failure is None:
            try:
                return super().__call__(logits, token_ids, **kwargs)
            except Exception as error:
                self._fail(error)
        return self._ended(logits.wait() if isinstance(logits, PendingLogits) else logits)

    def compact(
        self, logits: torch.Tensor, token_ids: Any = None, **kwargs: Any
    ) -> torch.Tensor | Candidates:
        if self.failure is None:
            try:
                return super().compact(logits, token_ids, **kwargs)
            except Exception as error:
                self._fail(error)
        return self._ended(logits)

    def _fail(self, error: Exception) -> None:
        self.failure = f"{type(error).__name__}: {error}"
        logger.error(
            "anylogits: processors of %s failed: %s; the request's sequence is ended",
            self.request,
            self.failure,
        )

    def _ended(self, logits: torch.Tensor) -> torch.Tensor:
        return end_sequences(logits, self.vocab)


def request_specs(body: Any) -> list[dict[str, Any]]:
    """The checked specs of a request body (``[]`` when it names none), or
    :class:`Refused` with the message vLLM's server answers the same specs with."""
    if not isinstance(body, dict) or body.get(REQUEST_FIELD) is None:
        return []
    extra_args = body[REQUEST_FIELD]
    if not isinstance(extra_args, dict):
        raise Refused(
            f"{REQUEST_FIELD} must be a JSON object (its {SPEC_KEY!r} entry holds the "
            f"processor specs), got {type(extra_args).__name__}"
        )
    try:
        return validate_request(extra_args, engine_in_this_process=False)
    except ValueError as error:
        raise Refused(str(error)) from None


def admit(body: Any, vocabulary: Vocabulary, *, request: str) -> Admitted:
    """Check a request body's specs and build them for ``vocabulary``.

    Args:
        body: the request's parsed JSON body.
        vocabulary: the served model's vocabulary.
        request: how logs name the request.

    Raises :class:`Refused` (HTTP 400) naming the bad field: the message of vLLM's server
    for what its frontend checks, and for what only a vocabulary shows
    ``extra_args['anylogits'] cannot run on the served model: ...``.
    """
    specs = request_specs(body)
    wants_ids = isinstance(body, dict) and body.get(TOKEN_IDS_FIELD) is True
    if not specs:
        return Admitted(None, wants_ids)
    try:
        pipeline = RequestPipeline(build_specs(specs), vocabulary, request=request)
    except Exception as error:  # whatever a client's spec raises is that client's 400
        raise Refused(
            f"{SPEC_FIELD} cannot run on the served model: {type(error).__name__}: {error}"
        ) from None
    return Admitted(pipeline, wants_ids)


# How much of a refused request's specs and message a log line quotes: a client's spec
# may be megabytes, and a log must not become its copy.
LOGGED_CHARS = 200


def excerpt(text: str, limit: int = LOGGED_CHARS) -> str:
    """``text``'s first line, at most ``limit`` characters of it (marked when cut)."""
    line = text.split("\n", 1)[0]
    return line if len(line) <= limit else f"{line[:limit]}... ({len(line)} chars)"


def log_refusal(route: str, message: str, body: Any) -> None:
    """One WARNING line for a request a server refuses with HTTP 400: ``route``, the
    first line of ``message`` and an excerpt of the request's specs."""
    specs = body.get(REQUEST_FIELD) if isinstance(body, dict) else None
    if isinstance(specs, dict):
        specs = specs.get(SPEC_KEY)
    quoted = specs if isinstance(specs, str) else json.dumps(specs)
    logger.warning(
        "anylogits: refused %s with HTTP 400: %s; specs: %s",
        route,
        excerpt(message),
        excerpt(quoted),
    )


def error_body(message: str) -> bytes:
    """The JSON body of an HTTP 400 with ``message``, as vLLM's server writes it."""
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return json.dumps({"error": error}).encode()


def with_token_ids(
    response: dict[str, Any], prompt_ids: list[int] | None, token_ids: list[int]
) -> dict[str, Any]:
    """``response`` (a completion or chat completion) with the generated ids where vLLM's
    server puts them for ``return_token_ids``: the first choice's ``token_ids``; the
    prompt's ids (when known) on that choice for a completion, on the response for a
    chat completion."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return response
    choices[0]["token_ids"] = token_ids
    if prompt_ids is not None:
        chat = str(response.get("object", "")).startswith("chat.")
        (response if chat else choices[0])["prompt_token_ids"] = prompt_ids
    return response
