"""transformers' OpenAI-compatible server (``transformers serve``) with per-request
anylogits processors, on its plain path and with ``--continuous-batching``.

``anylogits serve transformers --model DIR [its options]`` runs transformers' own server
command (every option of it; ``--model DIR`` is its model argument). Wired here, while
:func:`main` runs:

- the completion and chat handlers' ``handle_request``: a request's
  ``vllm_xargs["anylogits"]`` specs (and ``return_token_ids``, vLLM's flag) are taken out
  of the body before transformers checks its fields, checked as on every server
  (:func:`anylogits.serving.request_specs`: a refusal is an HTTP 400 with vLLM's message)
  and built for the served model's vocabulary;
- the OpenAI fields transformers drops or applies to a whole batch reach generation per
  request through the catalogue: ``presence_penalty`` (:class:`PresencePenalty`) and
  ``logit_bias`` (:class:`LogitBias`) on both paths; on the continuous-batching path, where
  transformers passes a request only its ``max_new_tokens`` and EOS, each request's own
  generation config (its temperature, top-p, the ``frequency_penalty`` transformers maps to
  a repetition penalty, ``stop``) becomes processors in transformers' order
  (:func:`config_specs`). The manager itself samples without warpers;
- the plain path (``model.generate``) gets the request's pipeline as its
  ``logits_processor``; the continuous-batching manager runs
  :class:`~anylogits.adapters.transformers_cb.ContinuousBatchingHook`, each request its
  specs (``add_request(..., anylogits=...)``).

Left out: ``seed`` on the continuous-batching path (transformers samples every row from one
generator, so a request's draws depend on its neighbours; the plain path seeds as
transformers does); ``return_token_ids`` on streamed answers.

What of transformers this relies on beyond its public API (checked against the installed
version by ``conformance_tests/test_transformers_server.py``): ``CompletionHandler`` and
``ChatCompletionHandler.handle_request(body, request_id)``, ``BaseHandler._resolve_model``,
``GenerateManager`` / ``CBGenerateManager.generate_streaming`` / ``generate_non_streaming``
(``inputs`` reach ``model.generate``; ``cb.add_request(..., request_id=...)``),
``CBGenerateManager.init_cb`` and ``_cb``, and the ``transformers`` command's ``serve``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse, Response
from transformers import GenerationConfig, LogitsProcessorList
from transformers.cli.serving import utils as serving
from transformers.cli.serving.chat_completion import ChatCompletionHandler
from transformers.cli.serving.completion import CompletionHandler

from anylogits.adapters.transformers import TransformersLogitsProcessor
from anylogits.adapters.transformers_cb import (
    AROUND_KEY,
    _vocabulary,
    check_transformers_version,
    for_continuous_batching,
)
from anylogits.core.specs import build_specs, from_spec, to_specs
from anylogits.core.wire import SPEC_FIELD, SPEC_KEY
from anylogits.processors.bias import LogitBias
from anylogits.processors.length import StopStrings
from anylogits.processors.penalties import PresencePenalty, RepetitionPenalty
from anylogits.processors.structured.warm import prepare_structured_in_background
from anylogits.processors.temperature import Temperature
from anylogits.processors.truncation import MinP, TopK, TopP
from anylogits.serving import (
    REQUEST_FIELD,
    TOKEN_IDS_FIELD,
    Refused,
    RequestPipeline,
    error_body,
    log_refusal,
    request_specs,
    with_token_ids,
)

logger = logging.getLogger(__name__)

ROUTES = {
    CompletionHandler: "POST /v1/completions",
    ChatCompletionHandler: "POST /v1/chat/completions",
}
OUR_FIELDS = (REQUEST_FIELD, TOKEN_IDS_FIELD)
_numbers = itertools.count(1)


@dataclasses.dataclass
class ServedRequest:
    """One admitted request: its specs (``vllm_xargs``), those of the OpenAI fields anylogits
    applies, its pipeline for the plain path (both), and its ids once generated."""

    specs: list[dict[str, Any]]  # the client's own (vllm_xargs), under the limits
    fields: list[dict[str, Any]]  # its OpenAI fields that anylogits applies, run first
    pipeline: RequestPipeline | None
    return_token_ids: bool
    # On continuous batching: its generation config's processors around its specs.
    around: dict[str, list[dict[str, Any]]] | None = None
    prompt_ids: list[int] | None = None
    token_ids: list[int] | None = None


# The requests being handled, by transformers' request id.
REQUESTS: dict[str, ServedRequest] = {}


def openai_specs(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The specs of the OpenAI fields anylogits applies itself, taken out of ``body``."""
    presence, bias = body.pop("presence_penalty", None), body.pop("logit_bias", None)
    processors: list[Any] = []
    try:
        if presence is not None:
            processors.append(PresencePenalty(float(presence)))
        if bias is not None:
            if not isinstance(bias, dict):
                raise ValueError(f"must be an object of token id -> bias, got {bias!r}")
            processors.append(LogitBias({int(key): float(value) for key, value in bias.items()}))
    except (TypeError, ValueError) as error:
        raise Refused(f"an OpenAI sampling field is not usable: {error}") from None
    return to_specs(processors)


def config_specs(config: GenerationConfig, vocab_size: int) -> tuple[list[Any], list[Any]]:
    """A request's generation config as processors, in ``generate``'s order: those that run
    before a user's processors, and the sampling warpers after them (greedy: only the
    best token is left, for a manager that samples)."""
    before: list[Any] = []
    if config.repetition_penalty not in (None, 1.0):
        before.append(RepetitionPenalty(float(config.repetition_penalty)))
    if config.stop_strings:
        eos = config.eos_token_id
        before.append(StopStrings(config.stop_strings, eos_token_id=eos))
    if not config.do_sample:
        return before, [TopK(1)]
    after: list[Any] = []
    if config.temperature not in (None, 1.0):
        after.append(Temperature(float(config.temperature)))
    if config.top_k not in (None, 0) and config.top_k < vocab_size:
        after.append(TopK(int(config.top_k)))
    if config.top_p not in (None, 1.0):
        after.append(TopP(float(config.top_p)))
    if config.min_p not in (None, 0.0):
        after.append(MinP(float(config.min_p)))
    return before, after


def _admit(handler: Any, body: dict[str, Any], ours: dict[str, Any], request_id: str) -> Any:
    """The request's :class:`ServedRequest`, or :class:`Refused`."""
    specs = request_specs({REQUEST_FIELD: ours[REQUEST_FIELD]} if REQUEST_FIELD in ours else {})
    fields = openai_specs(body)
    try:
        _, model, processor = handler._resolve_model(dict(body))
    except HTTPException as refused:
        if refused.status_code != 400:
            raise
        # A server pinned to its model answers another with 400: said as every server says it.
        raise Refused(
            f"model {body.get('model')!r}: anylogits processors run on the served model only "
            f"({refused.detail})"
        ) from None
    tokenizer = getattr(processor, "tokenizer", processor)
    vocab = _vocabulary(model, tokenizer)
    assert vocab is not None  # a served model has its tokenizer
    if "init_continuous_batching" not in vars(model):
        for_continuous_batching(model, tokenizer=tokenizer)
        prepare_structured_in_background(vocab)
    pipeline = None
    if specs or fields:
        try:
            processors = [*map(from_spec, fields), *build_specs(specs)]
            pipeline = RequestPipeline(processors, vocab, request=f"request {request_id}")
        except Exception as error:  # whatever a client's spec raises is that client's 400
            raise Refused(
                f"{SPEC_FIELD} cannot run on the served model: {type(error).__name__}: {error}"
            ) from None
    return ServedRequest(specs, fields, pipeline, ours.get(TOKEN_IDS_FIELD) is True)


def _handling(original: Any) -> Any:
    @functools.wraps(original)
    async def handle_request(self: Any, body: Any, request_id: str) -> Any:
        if not isinstance(body, dict):
            return await original(self, body, request_id)
        ours = {name: body.pop(name) for name in OUR_FIELDS if name in body}
        try:
            request = _admit(self, body, ours, request_id)
        except Refused as refusal:
            route = ROUTES.get(type(self), "a request")
            log_refusal(route, str(refusal), ours)
            return Response(error_body(str(refusal)), 400, media_type="application/json")
        REQUESTS[request_id] = request
        try:
            response = await original(self, body, request_id)
        finally:
            REQUESTS.pop(request_id, None)
        wanted = request.return_token_ids and request.token_ids is not None
        if wanted and isinstance(response, JSONResponse):
            answer = with_token_ids(
                json.loads(bytes(response.body)), request.prompt_ids, request.token_ids
            )
            response = JSONResponse(answer, status_code=response.status_code)
        return response

    return handle_request


def _ids(values: Any) -> list[int]:
    return values.reshape(-1).tolist() if hasattr(values, "tolist") else list(values)


def _around_generation(original: Any, streaming: bool, prepare: Any) -> Any:
    """A generation manager's ``generate_streaming`` / ``generate_non_streaming`` that
    first calls ``prepare(request, model, inputs, gen_config)`` for the admitted request
    (it returns the inputs to generate from); a whole answer's ids are noted for
    ``return_token_ids``."""

    def prepared(model: Any, inputs: Any, gen_config: Any, request_id: str) -> Any:
        request = REQUESTS.get(request_id)
        return inputs if request is None else prepare(request, model, inputs, gen_config)

    if streaming:

        @functools.wraps(original)
        def generate_streaming(
            self: Any,
            model: Any,
            processor: Any,
            inputs: Any,
            gen_config: Any,
            request_id: str,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            inputs = prepared(model, inputs, gen_config, request_id)
            return original(self, model, processor, inputs, gen_config, request_id, *args, **kwargs)

        return generate_streaming

    @functools.wraps(original)
    async def generate_non_streaming(
        self: Any, model: Any, processor: Any, inputs: Any, gen_config: Any, request_id: str
    ) -> Any:
        given = prepared(model, inputs, gen_config, request_id)
        text, input_len, generated = await original(
            self, model, processor, given, gen_config, request_id
        )
        request = REQUESTS.get(request_id)
        if request is not None:
            request.prompt_ids, request.token_ids = _ids(inputs["input_ids"]), _ids(generated)
        return text, input_len, generated

    return generate_non_streaming


def _with_pipeline(request: ServedRequest, model: Any, inputs: Any, gen_config: Any) -> Any:
    """The plain path (``model.generate``): the request's pipeline is its
    ``logits_processor``."""
    if request.pipeline is None:
        return inputs
    hook = TransformersLogitsProcessor(request.pipeline)
    return {**inputs, "logits_processor": LogitsProcessorList([hook])}


def _with_config_specs(request: ServedRequest, model: Any, inputs: Any, gen_config: Any) -> Any:
    """The continuous-batching path: the request's generation config as processors around
    its own (and its OpenAI fields'), which ``add_request`` hands on."""
    before, after = config_specs(gen_config, model.config.vocab_size)
    request.around = {"before": [*to_specs(before), *request.fields], "after": to_specs(after)}
    return inputs


def _init_cb(original: Any) -> Any:
    """The manager starts from a config that samples without warpers (each request's own
    config becomes its processors), and hands each request its specs."""

    @functools.wraps(original)
    def init_cb(self: Any, model: Any, gen_config: Any) -> None:
        if self._cb is not None:
            return
        neutral = GenerationConfig(
            do_sample=True,
            temperature=1.0,
            top_k=None,
            top_p=1.0,
            max_new_tokens=gen_config.max_new_tokens,
            eos_token_id=gen_config.eos_token_id,
            pad_token_id=gen_config.pad_token_id,
            use_cache=False,
        )
        original(self, model, neutral)
        manager: Any = self._cb
        add_request = manager.add_request

        @functools.wraps(add_request)
        def add_request_with_specs(*args: Any, **kwargs: Any) -> Any:
            request = REQUESTS.get(str(kwargs.get("request_id")))
            if request is not None:
                if request.specs:
                    kwargs[SPEC_KEY] = request.specs
                if request.around:
                    kwargs[AROUND_KEY] = request.around
            return add_request(*args, **kwargs)

        manager.add_request = add_request_with_specs

    return init_cb


@contextlib.contextmanager
def wired() -> Iterator[None]:
    """transformers' server classes with the request wiring, restored after."""
    patches = [
        (CompletionHandler, "handle_request", _handling(CompletionHandler.handle_request)),
        (ChatCompletionHandler, "handle_request", _handling(ChatCompletionHandler.handle_request)),
        *(
            (manager, name, _around_generation(getattr(manager, name), streaming, prepare))
            for manager, prepare in (
                (serving.GenerateManager, _with_pipeline),
                (serving.CBGenerateManager, _with_config_specs),
            )
            for name, streaming in (("generate_streaming", True), ("generate_non_streaming", False))
        ),
        (serving.CBGenerateManager, "init_cb", _init_cb(serving.CBGenerateManager.init_cb)),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def command_line(argv: Sequence[str]) -> list[str]:
    """transformers' ``serve`` arguments for ``argv``: ``--model DIR`` becomes its model
    argument."""
    options, model = [], None
    arguments = iter(argv)
    for option in arguments:
        if option in ("--model", "-m"):
            model = next(arguments, None)
        elif option.startswith("--model="):
            model = option.split("=", 1)[1]
        else:
            options.append(option)
    if model is None:
        raise SystemExit(
            "anylogits serve transformers needs --model: the processors are built for it"
        )
    return ["serve", model, *options]


SUPPORTED_SERVE = ((5, 16), (5, 25))
"""transformers releases whose ``transformers serve`` the wiring is written for: [low,
high). 5.25 rewrote the server (``GenerateRunner`` in place of ``GenerateManager``, API
server processes apart from the model's)."""


def main(argv: Sequence[str], prog: str = "anylogits serve transformers") -> int:
    """Run transformers' server command with ``argv`` (its options), serving per-request
    anylogits processors."""
    from transformers.cli.transformers import app

    try:
        check_transformers_version(
            supported=SUPPORTED_SERVE,
            what="server (transformers serve)",
            otherwise="generate() and continuous batching work with it in your own code",
        )
    except RuntimeError as error:
        raise SystemExit(f"{prog}: {error}") from None

    arguments = (
        command_line(argv) if not any(a in ("-h", "--help") for a in argv) else ["serve", *argv]
    )
    with wired():
        try:
            app(arguments, prog_name=prog.rsplit(" ", 1)[0])
        except SystemExit as stop:
            return int(stop.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
