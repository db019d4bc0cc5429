"""The request wire format every server reads, below every adapter: a request names its
processors as specs under ``extra_args["anylogits"]`` (vLLM's offline ``SamplingParams``)
or ``vllm_xargs["anylogits"]`` (each OpenAI-compatible server: vLLM's carries only flat
values, so there the specs travel as one JSON string). Clients import it to build
requests (:func:`vllm_xargs`) without any engine."""

from __future__ import annotations

import json
from typing import Any

from anylogits.core.limits import checking_client_side
from anylogits.core.pipeline import flatten
from anylogits.core.registry import offered
from anylogits.core.specs import CheckedSpecs, parse_specs, to_specs

SPEC_KEY = "anylogits"
"""The key of a request's processor specs in vLLM ``extra_args`` / ``vllm_xargs``."""

SPEC_FIELD = f"extra_args[{SPEC_KEY!r}]"
"""How error messages name a request's specs."""


def request_specs(extra_args: dict[str, Any] | None) -> CheckedSpecs | None:
    """The validated specs of one request's ``extra_args``, or ``None`` when it has none.

    The value under :data:`SPEC_KEY` is a list of spec dicts, one spec dict, or their JSON
    text (what :func:`vllm_xargs` sends through the OpenAI-compatible server).

    Raises ``ValueError`` naming the bad field, e.g. ``extra_args['anylogits'][1]``.
    """
    if not extra_args or SPEC_KEY not in extra_args:
        return None
    return parse_specs(extra_args[SPEC_KEY], SPEC_FIELD) or None


def validate_request(
    extra_args: dict[str, Any] | None, *, engine_in_this_process: bool
) -> list[dict[str, Any]]:
    """What every server checks of one request before admitting it (vLLM's frontend through
    each ``validate_params`` of :mod:`anylogits.adapters.vllm`, the llama-cpp-python and
    mlx-lm servers through :func:`anylogits.serving.admit`, and ``anylogits check-spec``):
    the checked specs (``[]`` when there are none), or a ``ValueError`` whose text is the
    message of the server's HTTP 400.

    Args:
        extra_args: the request's ``SamplingParams.extra_args`` (a server request's
            ``vllm_xargs``).
        engine_in_this_process: whether a vLLM engine runs in this process; only then
            can ``from_transformers`` objects, which exist in this process alone, run.
    """
    # vLLM turns a ValueError into HTTP 400 and anything else into a 500, so whatever a
    # client sent fails as a ValueError.
    try:
        specs: list[dict[str, Any]] = request_specs(extra_args) or []
    except ValueError:
        raise
    except Exception as error:
        raise ValueError(f"{SPEC_FIELD} is not usable: {error!r}") from None
    if not engine_in_this_process and any(not offered(spec["type"]) for spec in specs):
        raise ValueError(
            f"{SPEC_FIELD} holds from_transformers objects, which exist in this process only, "
            "but vLLM's engine runs in another one: set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
            "before creating the LLM, or write the processor as an anylogits processor"
        )
    return specs


def processor_specs(*processors: Any) -> list[dict[str, Any]]:
    """The checked specs of ``processors`` (pipelines flattened), in order."""
    # Not a Pipeline: building one would rebind the processors to no vocabulary.
    return to_specs(flatten(processors))


def vllm_xargs(*processors: Any) -> dict[str, str]:
    """The ``vllm_xargs`` payload that asks a vLLM server to run ``processors``.

    Needs no vLLM, and no llguidance for a structured processor (the server compiles
    it): clients send it as ``extra_body={"vllm_xargs": vllm_xargs(...)}``. The server
    only carries flat values, so the specs travel as one JSON string.

    Example:
        >>> from anylogits import TopK
        >>> vllm_xargs(TopK(5))
        {'anylogits': '[{"type":"top_k","top_k":5,"min_tokens_to_keep":1}]'}
    """
    text = json.dumps(processor_specs(*processors), separators=(",", ":"))
    with checking_client_side():
        request_specs({SPEC_KEY: text})
    return {SPEC_KEY: text}
