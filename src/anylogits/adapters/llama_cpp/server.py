"""llama-cpp-python's OpenAI-compatible server with per-request anylogits processors.

``anylogits serve llama-cpp --model X.gguf [its options]`` runs llama-cpp-python's own
server command (``python -m llama_cpp.server``, every option of it) with the app its
``create_app`` builds, wired here in two places:

- an ASGI middleware reads each completion request's body before llama-cpp-python's
  request models (which drop fields they do not know) and admits its
  ``vllm_xargs["anylogits"]`` specs (:func:`anylogits.serving.admit`): a refusal is an
  HTTP 400 with vLLM's message, an admitted request's processors go with it in a context
  variable (FastAPI and anyio carry it into the worker thread that generates);
- the served ``Llama``'s own ``create_completion`` (every completion and chat completion
  runs through it, streamed or not) adds them to its ``logits_processor`` list, and its
  ``generate`` notes the token ids when the request asks for them (``return_token_ids``,
  vLLM's flag; the middleware writes them into the response).

Every completion stops at its ``max_tokens``, with or without processors
(:mod:`~anylogits.adapters.llama_cpp.budget`: llama-cpp-python's own loop does not while
its text ends in an unfinished UTF-8 sequence).

llama-cpp-python serves one request at a time, so a request's processors run alone.

What of llama-cpp-python it relies on is listed in the package's docstring.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import llama_cpp
import llama_cpp.server.__main__ as server_command
import llama_cpp.server.app as server_app

from anylogits.adapters.llama_cpp.budget import bound_max_tokens
from anylogits.adapters.llama_cpp.candidates import use_candidate_sets
from anylogits.adapters.llama_cpp.hook import (
    AnyLogitsProcessorList,
    HookFailures,
    LlamaCppLogitsProcessor,
)
from anylogits.adapters.llama_cpp.vocabulary import vocabulary_of
from anylogits.core.vocab import Vocabulary
from anylogits.processors.structured.warm import prepare_structured_in_background
from anylogits.serving import Admitted, Refused, admit, error_body, log_refusal, with_token_ids

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass
class _Request:
    """What the middleware admitted, and the token ids generation noted for it."""

    admitted: Admitted
    prompt_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)


_CURRENT: contextvars.ContextVar[_Request | None] = contextvars.ContextVar(
    "anylogits_llama_cpp_request", default=None
)


class _LoggedFailures(HookFailures):
    """A server request's hook failures, logged and never raised into llama-cpp-python's
    worker: the hook has already ended the sequence. (The request's pipeline logs its
    processors' own errors; what reaches here failed in the hook around it.)"""

    def record(self, error: BaseException) -> None:
        logger.error(
            "anylogits: the llama.cpp hook failed: %r; the request's sequence is ended", error
        )

    def raise_if_any(self) -> None:
        pass


class SpecAdmission:
    """ASGI middleware: admits each completion request's processor specs before the app
    sees it (HTTP 400 on a refusal), and writes noted token ids into its response."""

    def __init__(
        self, app: Callable[[Scope, Receive, Send], Awaitable[None]], *, vocabulary: Vocabulary
    ):
        self.app = app
        self.vocabulary = vocabulary
        self.served = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].endswith("/completions")
        ):
            await self.app(scope, receive, send)
            return
        body, more = await _read_body(receive)
        try:
            parsed = json.loads(body) if not more else None
        except (ValueError, RecursionError):
            parsed = None  # llama-cpp-python answers malformed JSON itself
        self.served += 1
        try:
            admitted = await anyio.to_thread.run_sync(
                functools.partial(admit, parsed, self.vocabulary, request=f"request {self.served}")
            )
        except Refused as refusal:
            log_refusal(f"POST {scope['path']}", str(refusal), parsed)
            await _send_json(send, 400, error_body(str(refusal)))
            return
        request = _Request(admitted)
        token = _CURRENT.set(request)
        try:
            replay = _replay(body, more, receive)
            if admitted.return_token_ids:
                await self.app(scope, replay, _TokenIdWriter(send, request).send)
            else:
                await self.app(scope, replay, send)
        finally:
            _CURRENT.reset(token)


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request body; ``True`` when the client went away before it ended."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, disconnected: bool, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent or disconnected:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _TokenIdWriter:
    """Holds back a JSON response to write the noted token ids into it (a streamed
    response passes as it is)."""

    def __init__(self, send: Send, request: _Request) -> None:
        self._send = send
        self._request = request
        self._start: Message | None = None
        self._chunks: list[bytes] = []

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers", []))
            if headers.get(b"content-type", b"").startswith(b"application/json"):
                self._start = message
                return
        elif message["type"] == "http.response.body" and self._start is not None:
            self._chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            await self._send_written(b"".join(self._chunks))
            return
        await self._send(message)

    async def _send_written(self, body: bytes) -> None:
        assert self._start is not None
        try:
            response = json.loads(body)
        except ValueError:
            response = None
        if isinstance(response, dict) and self._start["status"] == 200:
            request = self._request
            body = json.dumps(
                with_token_ids(response, request.prompt_ids, request.token_ids)
            ).encode()
        headers = [
            (name, value) for name, value in self._start["headers"] if name != b"content-length"
        ]
        headers.append((b"content-length", b"%d" % len(body)))
        await self._send({**self._start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})


def serve_requests(llm: llama_cpp.Llama) -> None:
    """Wire ``llm`` (once) so that each completion runs the processors of the request
    being served and notes its token ids when asked."""
    if llm.__dict__.get("_anylogits_serving"):
        return
    use_candidate_sets(llm)
    bound_max_tokens(llm)
    eos = llm.token_eos()
    create_completion = llm.create_completion
    generate = llm.generate

    @functools.wraps(create_completion)
    def create_completion_with_processors(*args: Any, **kwargs: Any) -> Any:
        request = _CURRENT.get()
        if request is None or request.admitted.pipeline is None:
            return create_completion(*args, **kwargs)
        hook = LlamaCppLogitsProcessor(request.admitted.pipeline, eos, _LoggedFailures())
        given = kwargs.get("logits_processor") or []
        kwargs["logits_processor"] = AnyLogitsProcessorList([*given, hook])
        # The request's processors and states go as soon as it ends: llama-cpp-python
        # keeps its sampler chain (a reference cycle holding the hook) until the next
        # request and frees it only in a cycle collection (measured: a soak's process
        # grew ~0.6 MiB a request with processors, ~0.1 MiB without).
        try:
            result = create_completion(*args, **kwargs)
        except BaseException:
            hook.release()
            raise
        if isinstance(result, dict):
            hook.release()
            return result
        return _releasing(result, hook)

    @functools.wraps(generate)
    def generate_noting_ids(
        tokens: Sequence[int], *args: Any, **kwargs: Any
    ) -> Generator[int, Any, None]:
        request = _CURRENT.get()
        generated = generate(tokens, *args, **kwargs)
        if request is None or not request.admitted.return_token_ids:
            return generated
        request.prompt_ids = list(tokens)
        request.token_ids = []
        return _noted(generated, request.token_ids)

    llm.create_completion = create_completion_with_processors  # type: ignore[method-assign]
    llm.generate = generate_noting_ids  # type: ignore[method-assign]
    llm._anylogits_serving = True  # type: ignore[attr-defined]


def _releasing(chunks: Iterator[Any], hook: LlamaCppLogitsProcessor) -> Iterator[Any]:
    """A streamed completion's chunks; ``hook`` released when the stream ends or closes."""
    try:
        yield from chunks
    finally:
        hook.release()


def _noted(tokens: Generator[int, Any, None], into: list[int]) -> Generator[int, Any, None]:
    sent = None
    while True:
        try:
            token = tokens.send(sent)
        except StopIteration:
            return
        into.append(token)
        sent = yield token


def create_app(
    settings: Any = None, server_settings: Any = None, model_settings: Any = None
) -> Any:
    """llama-cpp-python's ``create_app`` (same arguments), serving per-request anylogits
    processors (``vllm_xargs["anylogits"]``) on its one model."""
    app = server_app.create_app(
        settings=settings, server_settings=server_settings, model_settings=model_settings
    )
    proxy = server_app._llama_proxy
    aliases = list(proxy) if proxy is not None else []
    if len(aliases) != 1:
        raise ValueError(
            f"anylogits serve llama-cpp serves one model, the configuration names "
            f"{len(aliases)} ({aliases}); start one server per model"
        )
    llm = proxy()
    serve_requests(llm)
    vocabulary = vocabulary_of(llm)
    prepare_structured_in_background(vocabulary, apply_kernels=True)
    app.add_middleware(SpecAdmission, vocabulary=vocabulary)
    return app


def main(argv: Sequence[str], prog: str = "anylogits serve llama-cpp") -> int:
    """Run llama-cpp-python's server command with ``argv`` (its options) and this
    module's :func:`create_app`."""
    original = server_command.create_app
    saved_argv = sys.argv
    sys.argv = [prog, *argv]
    server_command.create_app = create_app
    try:
        server_command.main()
    finally:
        server_command.create_app = original
        sys.argv = saved_argv
    return 0
