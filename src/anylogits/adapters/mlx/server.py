"""mlx-lm's OpenAI-compatible server with per-request anylogits processors.

``anylogits serve mlx --model DIR [its options]`` runs mlx-lm's own server command
(``mlx_lm.server``, every option of it), which batches requests with ``BatchGenerator``
and gives each row its own ``logits_processors`` list. Wired here:

- :class:`AnyLogitsHandler`, its request handler: reads each completion request's body
  and admits its ``vllm_xargs["anylogits"]`` specs (:func:`anylogits.serving.admit`; a
  refusal is an HTTP 400 with vLLM's message) before mlx-lm parses it; an admitted
  request's processors travel with its generation arguments
  (:class:`RequestLogitsArguments`), and its token ids come back when it asks
  (``return_token_ids``, vLLM's flag);
- ``mlx_lm.server._make_logits_processors``, the function the generation thread calls
  for each request (batched or served alone), adds that request's processors to mlx-lm's
  own: one row, one list, one pipeline;
- ``GenerationBatch._step`` (while :func:`main` runs), so that a step runs the batched
  requests' processors at once (:mod:`~anylogits.adapters.mlx.batch`): their grammars
  fill one bitmask and take one apply, after mlx-lm's own processors of each row;
- a request served alone (it has a ``seed``, or the server runs ``--draft-model`` /
  ``--kv-bits``) goes through ``stream_generate`` with only the prompt's uncached part:
  the prompt cache (:class:`PromptCacheNamingItsTokens`) says which ids it holds, and
  ``mlx_lm.server.stream_generate`` (wrapped while :func:`main` runs) gives them to the
  request's hooks, so a warm cache gives the cold tokens. mlx-lm's own processors (its
  ``repetition_penalty``) still see the uncached part only there.

What of mlx-lm this relies on, beyond its public API (checked against the pinned version
by ``conformance_tests/test_mlx_server.py``): ``mlx_lm.server._make_logits_processors``
and ``mlx_lm.server.stream_generate`` (wrapped while :func:`main` runs),
``ResponseGenerator._serve_single``'s call of ``LRUPromptCache.fetch_nearest_cache``,
``mlx_lm.server.run`` (the name its command calls, replaced while :func:`main` runs),
``mlx_lm.generate.GenerationBatch._step`` (replaced only where its source is the one
copied),
``mlx_lm.server._run_http_server`` (takes the handler class),
``APIHandler.response_generator`` / ``generate_response`` / ``GenerationArguments.logits``
and ``ModelProvider.tokenizer`` / ``cli_args``.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx_lm.server as mlx_server
from mlx_lm.generate import GenerationBatch

from anylogits.adapters.mlx import MlxLogitsProcessor, _vocabulary_of, batch
from anylogits.core.vocab import Vocabulary
from anylogits.processors.structured.warm import prepare_structured_in_background
from anylogits.serving import Admitted, Refused, admit, error_body, log_refusal, with_token_ids

logger = logging.getLogger(__name__)

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions", "/chat/completions")
DEFAULT_MODEL = "default_model"  # what mlx-lm calls the model given with --model
MODEL_LOAD_TIMEOUT_S = 600.0


@dataclasses.dataclass
class RequestLogitsArguments(mlx_server.LogitsProcessorArguments):
    """mlx-lm's logits arguments of one request, with its anylogits hooks."""

    anylogits: list[MlxLogitsProcessor] = dataclasses.field(default_factory=list)


def _make_logits_processors_with_requests(args: Any) -> list[Any]:
    """mlx-lm's processors for a request's generation arguments, then its own."""
    processors = _ORIGINAL_MAKE_LOGITS_PROCESSORS(args)
    return [*processors, *getattr(args.logits, "anylogits", ())]


_ORIGINAL_MAKE_LOGITS_PROCESSORS = mlx_server._make_logits_processors


class _CachedPrompt(list):  # type: ignore[type-arg]
    """A prompt cache fetched for a request, and the prompt ids it holds."""

    def __init__(self, cache: list[Any], tokens: list[int]) -> None:
        super().__init__(cache)
        self.tokens = tokens


class PromptCacheNamingItsTokens(mlx_server.LRUPromptCache):  # type: ignore[misc]
    """mlx-lm's prompt cache, whose fetched caches say which prompt ids they hold."""

    def fetch_nearest_cache(self, model: Any, tokens: list[int]) -> tuple[Any, list[int]]:
        cache, rest = super().fetch_nearest_cache(model, tokens)
        if cache is None:
            return cache, rest
        return _CachedPrompt(cache, list(tokens[: len(tokens) - len(rest)])), rest


def _stream_generate_seeing_the_cache(*args: Any, **kwargs: Any) -> Any:
    """mlx-lm's ``stream_generate`` for a request served alone, whose anylogits hooks are
    given the prompt ids its cache holds (mlx-lm passes processors only the rest).

    A vision prompt's cached ids name its images by negative ids, not their tokens:
    there the hooks see the uncached part only, as mlx-lm's own processors do.
    """
    cached = getattr(kwargs.get("prompt_cache"), "tokens", [])
    hooks = kwargs.get("logits_processors")
    if cached and hooks and min(cached) >= 0:
        kwargs["logits_processors"] = [
            hook.after(cached) if isinstance(hook, MlxLogitsProcessor) else hook for hook in hooks
        ]
    return _ORIGINAL_STREAM_GENERATE(*args, **kwargs)


_ORIGINAL_STREAM_GENERATE = mlx_server.stream_generate


class _RequestGeneration:
    """The server's response generator as one request's handler sees it: the request's
    hooks join its generation arguments, and its prompt's ids are noted."""

    def __init__(self, shared: Any, hooks: list[MlxLogitsProcessor]) -> None:
        self._shared = shared
        self._hooks = hooks
        self.prompt_ids: list[int] | None = None

    def generate(self, request: Any, generation_args: Any, *args: Any, **kwargs: Any) -> Any:
        if self._hooks:
            fields = {
                f.name: getattr(generation_args.logits, f.name)
                for f in dataclasses.fields(generation_args.logits)
            }
            generation_args.logits = RequestLogitsArguments(**fields, anylogits=self._hooks)
        ctx, responses = self._shared.generate(request, generation_args, *args, **kwargs)
        self.prompt_ids = list(ctx.prompt)
        return ctx, responses

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shared, name)


class AnyLogitsHandler(mlx_server.APIHandler):
    """mlx-lm's request handler, admitting each completion request's processor specs.

    :func:`handler_for` sets the served model's vocabulary and names.
    """

    vocabulary: Vocabulary
    served_models: frozenset[str] = frozenset({DEFAULT_MODEL})
    rfile: Any
    response_generator: Any
    _admitted: Admitted | None = None
    # ThreadingHTTPServer handles each request in a thread of its own.
    _numbers = itertools.count(1)

    def do_POST(self) -> None:
        if self.path in COMPLETION_PATHS:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                length = -1  # mlx-lm answers a missing or bad length itself
            if length >= 0:
                raw = self.rfile.read(length)
                self.rfile = io.BytesIO(raw)  # mlx-lm reads the body again
                if not self._admit(raw):
                    return
        try:
            super().do_POST()
        except (BrokenPipeError, ConnectionResetError):
            # A client that hung up mid-answer: mlx-lm stops its generation (its handler's
            # `finally`); one line for the operator instead of socketserver's traceback.
            self.close_connection = True
            logger.info(
                "anylogits: the client of POST %s went away; its generation is stopped", self.path
            )

    def _admit(self, raw: bytes) -> bool:
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return True  # mlx-lm answers malformed JSON itself
        try:
            if isinstance(body, dict) and not isinstance(body.get("prompt", ""), str):
                # mlx-lm tokenizes it in its generation thread, which a list kills: every
                # later request would get 404 "generation thread died".
                raise Refused(
                    f"prompt must be a string on mlx-lm's server, got "
                    f"{type(body['prompt']).__name__}: send one prompt per request"
                )
            admitted = admit(body, self.vocabulary, request=f"request {next(self._numbers)}")
            model = body.get("model", DEFAULT_MODEL) if isinstance(body, dict) else None
            if admitted.pipeline is not None and model not in self.served_models:
                raise Refused(
                    f"model {model!r}: anylogits processors run on the served model only "
                    f"(one of {sorted(self.served_models)})"
                )
        except Refused as refusal:
            log_refusal(f"POST {self.path}", str(refusal), body)
            message = error_body(str(refusal))
            self._set_completion_headers(400)
            self.send_header("Content-Length", str(len(message)))
            self.end_headers()
            self.wfile.write(message)
            return False
        self._admitted = admitted
        hooks = [] if admitted.pipeline is None else [MlxLogitsProcessor(admitted.pipeline)]
        if hooks or admitted.return_token_ids:
            self.response_generator = _RequestGeneration(self.response_generator, hooks)
        return True

    def generate_response(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        response = super().generate_response(*args, **kwargs)
        tokens = kwargs.get("tokens")
        admitted = self._admitted
        if admitted is not None and admitted.return_token_ids and tokens is not None:
            generation = self.response_generator
            prompt_ids = (
                generation.prompt_ids if isinstance(generation, _RequestGeneration) else None
            )
            response = with_token_ids(response, prompt_ids, list(tokens))
        return response

    def handle_models_request(self) -> None:
        # mlx-lm lists the models of the Hugging Face cache, which it scans after sending
        # its 200: on a machine without that cache the scan raises, and the client reads a
        # traceback instead of JSON. There, the served model alone is the list.
        from huggingface_hub import constants

        if Path(constants.HF_HUB_CACHE).is_dir():
            super().handle_models_request()
            return
        model = self.response_generator.cli_args.model
        path = Path(model)
        served = str(path.resolve()) if path.exists() else model
        body = {
            "object": "list",
            "data": [{"id": served, "object": "model", "created": self.created}],
        }
        self._set_completion_headers(200)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())
        self.wfile.flush()


def handler_for(model_provider: Any) -> type[AnyLogitsHandler]:
    """:class:`AnyLogitsHandler` for the model ``model_provider`` serves by default,
    once it is loaded (mlx-lm's generation thread loads it as it starts)."""
    deadline = time.monotonic() + MODEL_LOAD_TIMEOUT_S
    while model_provider.tokenizer is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the model was not loaded in {MODEL_LOAD_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
    served = {DEFAULT_MODEL, model_provider.cli_args.model}
    vocabulary = _vocabulary_of(model_provider.tokenizer)
    prepare_structured_in_background(vocabulary, apply_kernels=True)
    attributes = {
        "vocabulary": vocabulary,
        "served_models": frozenset(name for name in served if name),
    }
    return type("AnyLogitsHandler", (AnyLogitsHandler,), attributes)


def run(host: str, port: int, model_provider: Any, **_: Any) -> None:
    """mlx-lm's ``run``, serving with :class:`AnyLogitsHandler` (not distributed)."""
    if model_provider.cli_args.model is None:
        raise SystemExit("anylogits serve mlx needs --model: the processors are built for it")
    prompt_cache = PromptCacheNamingItsTokens(model_provider.cli_args.prompt_cache_size)
    response_generator = mlx_server.ResponseGenerator(model_provider, prompt_cache)
    handler = handler_for(model_provider)
    batch.install(handler.vocabulary)
    mlx_server._run_http_server(host, port, response_generator, handler_class=handler)


def main(argv: Sequence[str], prog: str = "anylogits serve mlx") -> int:
    """Run mlx-lm's server command with ``argv`` (its options), serving per-request
    anylogits processors."""
    names = ("run", "_make_logits_processors", "stream_generate")
    saved_argv, saved = sys.argv, {name: getattr(mlx_server, name) for name in names}
    saved_step = GenerationBatch._step  # run() may batch the requests' hooks
    sys.argv = [prog, *argv]
    mlx_server.run = run
    mlx_server._make_logits_processors = _make_logits_processors_with_requests
    mlx_server.stream_generate = _stream_generate_seeing_the_cache
    try:
        mlx_server.main()
    finally:
        sys.argv = saved_argv
        for name, value in saved.items():
            setattr(mlx_server, name, value)
        GenerationBatch._step = saved_step
    return 0
