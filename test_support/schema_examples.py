"""Instances of real-world JSON schemas, built from the schema itself: the texts the
real-schema level shows the model to copy, and the token paths the structured corpus
benchmark walks (a real instance's tokens, not random allowed ones).

:func:`example` builds one: the required properties, a few optional scalar ones, one
item per list (``NoExample`` where nothing obvious fits: a ``pattern``, a ``format``, a
reference outside the schema). :func:`lenient_validator` checks it against what
llguidance enforces in lenient mode.
"""

from __future__ import annotations

from typing import Any

# Keywords llguidance's lenient mode ignores (it refuses them in strict mode).
IGNORED_WHEN_LENIENT = (
    "uniqueItems",
    "if",
    "then",
    "else",
    "not",
    "propertyNames",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
    "unevaluatedProperties",
)


class NoExample(Exception):
    """The schema (or a part of it) has no obvious instance."""


def resolve(node: Any, root: dict) -> Any:
    """``node`` with its local ``$ref`` chain followed inside ``root``."""
    seen = 0
    while isinstance(node, dict) and isinstance(node.get("$ref"), str):
        ref = node["$ref"]
        if not ref.startswith("#"):
            raise NoExample(ref)
        target: Any = root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise NoExample(ref)
            target = target[part]
        node, seen = target, seen + 1
        if seen > 32:
            raise NoExample(ref)
    return node


def _scalar(node: Any, root: dict) -> bool:
    node = resolve(node, root)
    if not isinstance(node, dict) or node.get("pattern") or node.get("format"):
        return False
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return (
        "enum" in node
        or "const" in node
        or any(k in ("string", "integer", "boolean") for k in kinds)
    )


def example(
    node: Any, root: dict, depth: int = 0, *, optional_keys: int = 2, max_depth: int = 4
) -> Any:
    """A small instance of ``node`` inside the schema ``root``: its required properties
    and the first ``optional_keys`` optional scalar ones, in the schema's order (as
    llguidance lays them out), down to ``max_depth`` levels; raises :class:`NoExample`
    where none is obvious."""
    node = resolve(node, root)
    if node is True or node == {}:
        return "example"
    if not isinstance(node, dict) or depth > max_depth:
        raise NoExample(node)

    def nested(child: Any, level: int = depth + 1) -> Any:
        return example(child, root, level, optional_keys=optional_keys, max_depth=max_depth)

    if "const" in node:
        return node["const"]
    if node.get("enum"):
        return node["enum"][0]
    for combinator in ("anyOf", "oneOf"):
        if combinator in node:
            rest = {key: value for key, value in node.items() if key != combinator}
            for branch in node[combinator]:
                try:
                    return nested({**rest, **resolve(branch, root)}, depth)
                except NoExample:
                    continue
            raise NoExample(node)
    if "allOf" in node:
        merged = {k: v for k, v in node.items() if k != "allOf"}
        for branch in node["allOf"]:
            for key, value in resolve(branch, root).items():
                if key == "properties":
                    merged["properties"] = {**merged.get("properties", {}), **value}
                elif key == "required":
                    merged["required"] = [*merged.get("required", []), *value]
                else:
                    merged.setdefault(key, value)
        return nested(merged, depth)
    kind = node.get("type")
    kinds = [k for k in (kind if isinstance(kind, list) else [kind]) if k != "null"]
    kind = (
        kinds[0]
        if kinds
        else ("object" if "properties" in node else "array" if "items" in node else None)
    )
    if kind == "object":
        required = node.get("required", [])
        properties = node.get("properties", {})
        if any(name not in properties for name in required):
            raise NoExample(node)
        optional = [n for n, p in properties.items() if n not in required and _scalar(p, root)]
        chosen = set(required) | set(optional[:optional_keys])
        found = {name: nested(p) for name, p in properties.items() if name in chosen}
        # Shown "{}", a model fills it: one property (or map entry) at least.
        for name, value in properties.items() if not found else ():
            try:
                return {name: nested(value)}
            except NoExample:
                continue
        extra = node.get("additionalProperties")
        if not found and isinstance(extra, dict) and not properties:
            return {"example": nested(extra)}
        return found
    if kind == "array":
        # One item at least: shown "[]", a model fills the list.
        count = max(node.get("minItems", 0), min(1, node.get("maxItems", 1)))
        return [nested(node.get("items", {})) for _ in range(count)]
    if kind == "string":
        if node.get("pattern") or node.get("format"):
            raise NoExample(node)
        return "example"[: node.get("maxLength", 7)].ljust(node.get("minLength", 0), "x")
    if kind in ("integer", "number"):
        return int(node.get("minimum", 0)) + (1 if "exclusiveMinimum" in node else 0)
    if kind == "boolean":
        return True
    raise NoExample(node)


def lenient_validator(schema: dict, lenient: bool) -> Any:
    """jsonschema's validator of ``schema``; in lenient mode, of what llguidance enforces:
    ``oneOf`` as ``anyOf`` (``coerce_one_of``), the keywords it ignores ignored."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    if lenient:
        ignored = {
            key: (lambda validator, value, instance, node: None) for key in IGNORED_WHEN_LENIENT
        }
        cls = jsonschema.validators.extend(cls, {**ignored, "oneOf": cls.VALIDATORS["anyOf"]})
    return cls(schema)
