"""Hostile specs: one oversized value per size-valued field of the catalogue, plus the
request-level shapes that once stalled or killed a vLLM server. The unit tests check
each against the limits in Python; the server suite sends each to a real vLLM server.

Sizes are read from the limits in force when a case is built, so a case is exactly one
past its limit.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

from anylogits.core.limits import limits

# (field as the error names it, the limit, spec builder)
Case = tuple[str, str, Callable[[], dict[str, Any]]]


def _over(name: str) -> int:
    return getattr(limits(), name) + 1


def _text(name: str = "text_chars") -> str:
    return "x" * _over(name)


def _ids(name: str) -> list[int]:
    return [1] * _over(name)


def _distinct_ids(name: str) -> list[int]:
    return list(range(_over(name)))


def _long_choices() -> list[str]:
    """Distinct choices, each within ``text_chars``, together over ``grammar_chars``."""
    size = limits().text_chars
    return [f"{i:08d}".ljust(size, "x") for i in range(limits().grammar_chars // size + 1)]


def _nested_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


# Ordinary mistakes in vllm_xargs["anylogits"], each with (part of) the HTTP 400 message
# every server answers: the server suites send them, `anylogits check-spec`'s tests check
# its own answer to them.
BAD_PAYLOADS = {
    "invalid_value": (
        '[{"type": "top_k", "top_k": 0}]',
        "extra_args['anylogits'][0]: top_k must be >= 1, got 0",
    ),
    "unknown_type": (
        '[{"type": "no_such_processor"}]',
        "extra_args['anylogits'][0]: spec field 'type' is 'no_such_processor'",
    ),
    "unknown_field": (
        '[{"type": "top_k", "top_k": 3, "colour": "red"}]',
        "extra_args['anylogits'][0]: spec for 'top_k' has unknown field(s) ['colour']",
    ),
    "not_json": ("[{not json", "extra_args['anylogits'] is a string but not valid JSON"),
    "not_a_list": ("42", "extra_args['anylogits'] must be a list"),
}


OVERSIZED: dict[str, Case] = {
    "bad_words.words": (
        "words",
        "items",
        lambda: {"type": "bad_words", "words": [[1]] * _over("items")},
    ),
    "bad_words.words[0].text": (
        "words[0]",
        "text_chars",
        lambda: {"type": "bad_words", "words": [_text()]},
    ),
    "bad_words.words[0].ids": (
        "words[0]",
        "sequence_tokens",
        lambda: {"type": "bad_words", "words": [_ids("sequence_tokens")]},
    ),
    "sequence_bias.biases": (
        "biases",
        "items",
        lambda: {"type": "sequence_bias", "biases": [[[i], 1.0] for i in range(_over("items"))]},
    ),
    "sequence_bias.biases[0][0]": (
        "biases[0][0]",
        "sequence_tokens",
        lambda: {"type": "sequence_bias", "biases": [[_ids("sequence_tokens"), 1.0]]},
    ),
    "stop_strings.stop_strings": (
        "stop_strings",
        "items",
        lambda: {"type": "stop_strings", "stop_strings": ["x"] * _over("items")},
    ),
    "stop_strings.stop_strings[0]": (
        "stop_strings[0]",
        "text_chars",
        lambda: {"type": "stop_strings", "stop_strings": [_text()]},
    ),
    "logit_bias.bias": (
        "bias",
        "token_ids",
        lambda: {"type": "logit_bias", "bias": {str(i): 1.0 for i in _distinct_ids("token_ids")}},
    ),
    "suppress_tokens.token_ids": (
        "token_ids",
        "token_ids",
        lambda: {"type": "suppress_tokens", "token_ids": _ids("token_ids")},
    ),
    "xtc.protected_token_ids": (
        "protected_token_ids",
        "token_ids",
        lambda: {
            "type": "xtc",
            "threshold": 0.1,
            "probability": 0.5,
            "protected_token_ids": _ids("token_ids"),
        },
    ),
    "min_new_tokens.eos_token_id": (
        "eos_token_id",
        "token_ids",
        lambda: {"type": "min_new_tokens", "min_new_tokens": 2, "eos_token_id": _ids("token_ids")},
    ),
    "exponential_decay_length.eos_token_id": (
        "eos_token_id",
        "token_ids",
        lambda: {
            "type": "exponential_decay_length",
            "start_index": 2,
            "decay_factor": 1.5,
            "eos_token_id": _ids("token_ids"),
        },
    ),
    "force_last_phrase.eos_token_id": (
        "eos_token_id",
        "token_ids",
        lambda: {"type": "force_last_phrase", "phrase": [4], "eos_token_id": _ids("token_ids")},
    ),
    "cite_from_prompt.eos_token_id": (
        "eos_token_id",
        "token_ids",
        lambda: {"type": "cite_from_prompt", "eos_token_id": _ids("token_ids")},
    ),
    "dry.sequence_breakers": (
        "sequence_breakers",
        "sequence_breakers",
        lambda: {
            "type": "dry",
            "multiplier": 0.8,
            "sequence_breakers": ["x"] * _over("sequence_breakers"),
        },
    ),
    "dry.sequence_breakers[0]": (
        "sequence_breakers[0]",
        "text_chars",
        lambda: {"type": "dry", "multiplier": 0.8, "sequence_breakers": [_text()]},
    ),
    "dry.penalty_last_n": (
        "penalty_last_n",
        "window",
        lambda: {"type": "dry", "multiplier": 0.8, "penalty_last_n": _over("window")},
    ),
    "repetition_penalty.context_size": (
        "context_size",
        "window",
        lambda: {"type": "repetition_penalty", "penalty": 1.3, "context_size": _over("window")},
    ),
    "no_repeat_ngram.ngram_size": (
        "ngram_size",
        "ngram_size",
        lambda: {"type": "no_repeat_ngram", "ngram_size": _over("ngram_size")},
    ),
    "watermark.context_width": (
        "context_width",
        "ngram_size",
        lambda: {"type": "watermark", "context_width": _over("ngram_size")},
    ),
    "force_sequence.phrase.text": (
        "phrase",
        "text_chars",
        lambda: {"type": "force_sequence", "phrase": _text()},
    ),
    "force_sequence.phrase.ids": (
        "phrase",
        "sequence_tokens",
        lambda: {"type": "force_sequence", "phrase": _ids("sequence_tokens")},
    ),
    "trigger_phrase.trigger": (
        "trigger",
        "text_chars",
        lambda: {
            "type": "trigger_phrase",
            "trigger": _text(),
            "phrase": [4],
            "trigger_after": True,
        },
    ),
    "trigger_phrase.phrase": (
        "phrase",
        "sequence_tokens",
        lambda: {"type": "trigger_phrase", "trigger": [5], "phrase": _ids("sequence_tokens")},
    ),
    "force_last_phrase.phrase": (
        "phrase",
        "text_chars",
        lambda: {"type": "force_last_phrase", "phrase": _text()},
    ),
    "gen_length.boost_token": (
        "boost_token",
        "text_chars",
        lambda: {"type": "gen_length", "boost_factor": 0.5, "boost_token": _text()},
    ),
    "multiple_choice.choices": (
        "choices",
        "items",
        lambda: {"type": "multiple_choice", "choices": [2] * _over("items")},
    ),
    "multiple_choice.choices[0]": (
        "choices[0]",
        "text_chars",
        lambda: {"type": "multiple_choice", "choices": [_text()]},
    ),
    "multiple_choice.delimiter": (
        "delimiter",
        "text_chars",
        lambda: {"type": "multiple_choice", "delimiter": _text()},
    ),
    "choice.choices": (
        "choices",
        "items",
        lambda: {"type": "choice", "choices": [str(i) for i in range(_over("items"))]},
    ),
    "choice.choices.chars": (
        "choices",
        "grammar_chars",
        lambda: {"type": "choice", "choices": _long_choices()},
    ),
    "json_schema.schema.depth": (
        "schema",
        "spec_depth",
        lambda: {"type": "json_schema", "schema": _nested_dict(_over("spec_depth"))},
    ),
    "regex.pattern": (
        "pattern",
        "grammar_chars",
        lambda: {"type": "regex", "pattern": _text("grammar_chars")},
    ),
    "grammar.grammar": (
        "grammar",
        "grammar_chars",
        lambda: {"type": "grammar", "grammar": 'start: "' + _text("grammar_chars") + '"'},
    ),
    "json_schema.schema": (
        "schema",
        "grammar_chars",
        lambda: {
            "type": "json_schema",
            "schema": {"type": "string", "pattern": _text("grammar_chars")},
        },
    ),
}

# Fields that are options, not sizes: any oversized value is simply not one of them.
NOT_SIZES = {("watermark", "seeding_scheme"), ("grammar", "syntax"), ("json_schema", "separators")}


def alternatives_grammar(count: int) -> str:
    """A Lark grammar of ``count`` literal alternatives (100,000 once held a vLLM engine
    for ~65 s)."""
    return "start: " + " | ".join(f'"tok{i}"' for i in range(count))


def largest_alternatives_grammar() -> str:
    """The longest :func:`alternatives_grammar` within ``limits().grammar_chars``."""
    count = limits().grammar_chars // 12
    while len(alternatives_grammar(count)) > limits().grammar_chars:
        count -= 1
    return alternatives_grammar(count)


_never_seen_rules = itertools.count()


def never_seen(grammar: str) -> str:
    """``grammar`` with an unused rule of its own: a process remembers a grammar's
    verdict and compiled form by its text, so this one is checked and compiled anew."""
    return f'{grammar}\nunused{next(_never_seen_rules)}: "u"\n'


def nested(depth: int) -> str:
    """JSON text of lists nested ``depth`` deep (5,000 was a 500 from vLLM's server)."""
    return "[" * depth + "]" * depth


# The requests of issue 14, as the text of vllm_xargs' "anylogits" field, with the limit
# each must be refused by under the default limits.
REQUEST_LEVEL: dict[str, tuple[str, str]] = {
    "dry_100k_breakers": (
        json.dumps([{"type": "dry", "multiplier": 0.8, "sequence_breakers": ["x" * 50] * 100_000}]),
        "spec_bytes",
    ),
    "grammar_100k_alternatives": (
        json.dumps(
            [{"type": "grammar", "syntax": "lark", "grammar": alternatives_grammar(100_000)}]
        ),
        "spec_bytes",
    ),
    "top_k_10k_times": (json.dumps([{"type": "top_k", "top_k": 5}] * 10_000), "spec_bytes"),
    "top_k_17_times": (json.dumps([{"type": "top_k", "top_k": 5}] * 17), "processors"),
    "nested_5000": (nested(5000), "spec_depth"),
    "nested_65": (nested(65), "spec_depth"),
}


def _array_schema(keyword: str, count: int) -> dict[str, Any]:
    return {"type": "array", keyword: count, "items": {"type": "integer"}}


# Structured specs whose counts cost memory or time inside the grammar engine: the three
# schemas of issue 25 (a ~100-byte request that made llguidance 1.7 allocate without bound
# in vLLM's API server, OOM-killed at 21 GB; minItems 1e7 held it 11 s), and what the
# structured fuzzer found since. Each is refused naming its limit, on every llguidance.
# (spec, the limit that refuses it, the text the message names)
STRUCTURED: dict[str, tuple[dict[str, Any], str, str]] = {
    "schema_max_items_1e9": (
        {"type": "json_schema", "schema": _array_schema("maxItems", 10**9)},
        "schema_items",
        "schema['maxItems'] is 1000000000",
    ),
    "schema_min_items_1e9": (
        {"type": "json_schema", "schema": _array_schema("minItems", 10**9)},
        "schema_items",
        "schema['minItems'] is 1000000000",
    ),
    "schema_min_items_1e7": (
        {"type": "json_schema", "schema": _array_schema("minItems", 10**7)},
        "schema_items",
        "schema['minItems'] is 10000000",
    ),
    "schema_nested_max_contains": (
        {
            "type": "json_schema",
            "schema": {"type": "object", "properties": {"a": {"maxContains": 10**6}}},
        },
        "schema_items",
        "schema['properties']['a']['maxContains']",
    ),
    "schema_max_length_1e9": (
        {"type": "json_schema", "schema": {"type": "string", "maxLength": 10**9}},
        "string_length",
        "schema['maxLength'] is 1000000000",
    ),
    "schema_pattern_nested_counts": (
        {"type": "json_schema", "schema": {"type": "string", "pattern": "^((a{100}){100}){100}$"}},
        "repeat_count",
        "schema['pattern'] is 1000000",
    ),
    "schema_multiple_of_in_any_of": (
        {
            "type": "json_schema",
            "schema": {
                "anyOf": [{"type": "integer", "multipleOf": 10**9 + 7}, {"type": "boolean"}]
            },
        },
        "multiple_of",
        "schema['anyOf'][0]['multipleOf'] is 1000000007",
    ),
    "regex_nested_counts": (
        {"type": "regex", "pattern": "((a{100}){100}){100}"},
        "repeat_count",
        "in pattern is 1000000",
    ),
    "lark_counts_through_rules": (
        {"type": "grammar", "grammar": 'start: x~1000\nx: y~1000\ny: "a"~1000'},
        "repeat_count",
        "in grammar is 1000000000",
    ),
    "lark_embedded_schema": (
        {
            "type": "grammar",
            "grammar": "start: %json" + json.dumps(_array_schema("maxItems", 10**9)),
        },
        "schema_items",
        "(%json block)['maxItems'] is 1000000000",
    ),
    "gbnf_counts_through_rules": (
        {
            "type": "grammar",
            "syntax": "gbnf",
            "grammar": 'root ::= x{1000}\nx ::= y{1000}\ny ::= "a"{1000}',
        },
        "repeat_count",
        "in grammar is 1000000000",
    ),
}

# Specs the structured fuzzer found failing (an exception other than ValueError, a crash,
# a budget breach), kept as regressions: each must now be refused or served.
FOUND_BY_FUZZING: dict[str, dict[str, Any]] = {
    # Compiled, allowed no first token: a RuntimeError at the first mask. Now refused
    # when compiled for the vocabulary.
    "gbnf_allows_no_output": {
        "type": "grammar",
        "syntax": "gbnf",
        "grammar": "root ::= r0\nr0 ::= r0\n",
    },
    # Started, then needed more Earley items for one token than grammar_step_items: a
    # RuntimeError at that step. Now its sequence ends there, as on a server.
    "lark_over_step_items": {
        "type": "grammar",
        "grammar": 'start: r0\nr0: (/(((\\p{L})))/)~12 r0{11} r0~300 ["a"]\n'
        "    | [/(\\\\\\\\[0-9a-fA-F]\\D)/]\n",
    },
    # llguidance 1.7 only: the lexer builds too many regex expressions at a later token
    # ("lexer error: too many expressions constructed"): a RuntimeError at that step.
    # Now a budget run out like the one above.
    "gbnf_lexer_expressions_llguidance_1_7": {
        "type": "grammar",
        "syntax": "gbnf",
        "grammar": 'root ::= r0\nr0 ::= "a" "a" "a"* "a"{250}\n',
    },
    # Allows the prefix "aa", which no token extends (r1 is empty): a RuntimeError at the
    # third step. Now its sequence ends there.
    "lark_dead_end_after_a_prefix": {
        "type": "grammar",
        "grammar": 'start: r0\nr0: "a" "a" r1\nr1: r1 "a"\n',
    },
    # A token ending in a repetition of one word, followed only by what starts with that
    # word: llguidance's greedy lexer forces the word forever (a mask that never returns,
    # memory growing). GBNF's all-terminal rule r1 becomes the token R1: "a"*. Now
    # refused where the grammar is parsed (both llguidance 1.7.6 and 1.9.1 stalled).
    "gbnf_greedy_token_forced_forever": {
        "type": "grammar",
        "syntax": "gbnf",
        "grammar": 'root ::= r0\nr0 ::= (r1) (r0)\nr1 ::= "a"*\n',
    },
    "lark_greedy_token_forced_forever": {
        "type": "grammar",
        "grammar": 'start: r0\nr0: [/(?:a)*/ "a"]\n',
    },
}
