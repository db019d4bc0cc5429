"""Specs: the plain-dict wire format of processors (vLLM ``extra_args``, JSON files)."""

from __future__ import annotations

import json
import math
from typing import Any

from anylogits.core.processor import LogitsProcessor, constructor_parameters, registered_processors


def check_json_value(value: Any, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` unless ``value`` is plain, finite JSON.

    vLLM hangs on a non-JSON value in ``extra_args``, so specs are checked before they
    can reach an engine.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}; spec values must be finite numbers")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json_value(item, f"{where}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(
                    f"{where} has the key {key!r} of type {type(key).__name__}; "
                    "spec dict keys must be strings"
                )
            check_json_value(item, f"{where}[{key!r}]")
        return
    raise ValueError(
        f"{where} is a {type(value).__name__} ({value!r}); spec values must be JSON "
        "(None, bool, int, float, str, list, dict)"
    )


def from_spec(spec: dict[str, Any] | str) -> LogitsProcessor:
    """Build a processor from its spec: a dict ``{"type": name, **arguments}`` or its JSON.

    Raises ``ValueError`` naming the bad field when the type is unknown, a field is not an
    argument of that processor, or a value is not plain JSON.
    """
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as error:
            raise ValueError(f"spec is not valid JSON: {error}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"a spec must be a dict with a 'type' field, got {type(spec).__name__}")
    check_json_value(spec, "spec")
    fields = dict(spec)
    kind = fields.pop("type", None)
    registry = registered_processors()
    if kind not in registry:
        known = ", ".join(sorted(registry))
        raise ValueError(f"spec field 'type' is {kind!r}; known processor types: {known}")
    cls = registry[kind]
    parameters = constructor_parameters(cls)
    unknown = sorted(set(fields) - set(parameters))
    if unknown:
        raise ValueError(
            f"spec for {kind!r} has unknown field(s) {unknown}; its fields are {sorted(parameters)}"
        )
    missing = sorted(
        name
        for name, parameter in parameters.items()
        if parameter.default is parameter.empty and name not in fields
    )
    if missing:
        raise ValueError(f"spec for {kind!r} is missing required field(s) {missing}")
    return cls(**fields)


def to_specs(processors: list[LogitsProcessor]) -> list[dict[str, Any]]:
    """The specs of several processors, each checked to be plain JSON."""
    specs = [processor.to_spec() for processor in processors]
    for index, spec in enumerate(specs):
        check_json_value(spec, f"specs[{index}]")
    return specs
