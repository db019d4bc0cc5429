"""Constraint families and validity checks shared by every backend's structured tests.

Each backend draws schemas and regexes from the same families, generates a batch of 1 or
8 sequences, greedy or sampled, with the tiny model, and checks every output: a finished
one (ended by EOS) must validate, one cut by the token budget must be a valid prefix.
Text is the concatenation of the tokens' own bytes in the engine's vocabulary.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from anylogits import JSONSchema, Vocabulary
from anylogits.engines.generation import Generated
from anylogits.processors.structured.engine import ENGINE

PROMPTS = ["Hello", "1 2 3 4 5 6 7 8 9 10 11 12", "The answer is"]
BATCHES = st.sampled_from([1, 8])
JSON_TOKENS = 96  # a random model may fill strings slowly: cut outputs are checked as prefixes
REGEX_TOKENS = 48  # every family below finishes well within this

# Bounded strings and integers, enums, nested objects and arrays.
SCALARS = st.sampled_from(
    [
        {"type": "integer", "minimum": 0, "maximum": 999},
        {"type": "string", "maxLength": 6},
        {"type": "boolean"},
        {"enum": ["red", "green", 7]},
        {"type": "string", "pattern": "^[a-z]{2,4}$"},
        {"type": "number", "enum": [1.5, -2, 0.25]},
    ]
)
SCHEMAS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.dictionaries(
            st.sampled_from(["id", "name", "tags", "ok"]), inner, min_size=1, max_size=3
        ).map(
            lambda props: {
                "type": "object",
                "properties": props,
                "required": sorted(props),
                "additionalProperties": False,
            }
        ),
        inner.map(lambda item: {"type": "array", "items": item, "maxItems": 3}),
    ),
    max_leaves=4,
)
REGEXES = st.sampled_from(
    [
        r"[a-z]{3}-[0-9]{2}",
        r"(yes|no|maybe)",
        r"[0-9]{1,3}(\.[0-9]{1,2})?",
        r"\([a-c]{0,5}\)",
        r"[A-Z][a-z]{1,6} [A-Z][a-z]{1,6}",
    ]
)

GENERATION = settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def text_of(vocab: Vocabulary, ids: list[int]) -> str:
    return b"".join(vocab.tokens[token] for token in ids).decode("utf-8")


def is_valid_prefix(grammar: str, vocab: Vocabulary, ids: list[int]) -> bool:
    matcher = ENGINE.start(grammar, vocab)
    return matcher.try_consume_tokens(ids) == len(ids)


def check_json(outputs: list[Generated], schema: Any, vocab: Vocabulary) -> int:
    """Every finished output validates, every cut one is a valid prefix; the number of
    finished ones."""
    import jsonschema

    grammar = JSONSchema(schema).grammar
    for output in outputs:
        if output.finished:
            jsonschema.validate(json.loads(text_of(vocab, output.ids)), schema)
        else:
            assert is_valid_prefix(grammar, vocab, output.ids), output
    return sum(output.finished for output in outputs)


def check_regex(outputs: list[Generated], pattern: str, vocab: Vocabulary) -> None:
    """Every output finished and matches ``pattern`` in full."""
    for output in outputs:
        assert output.finished, f"did not finish within the budget: {output}"
        assert re.fullmatch(pattern, text_of(vocab, output.ids)), output
