"""Representative configurations of every catalogue processor, as specs.

Specs, not instances: every test builds fresh processors, so no cache or tracker state
leaks from one backend's run into another's. Also the small constraints the structured
cases share, and :func:`catalogue_classes`, every catalogue processor by spec name.
"""

from __future__ import annotations

from typing import Any

import test_support.probes  # noqa: F401  (registers the probe processors' specs)
from anylogits import LogitsProcessor, from_spec

# Small constraints every engine must apply alike (and the hook-level JSON case).
SMALL_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "tag": {"enum": ["red", "green", "blue"]},
    },
    "required": ["id", "tag"],
    "additionalProperties": False,
}
SMALL_REGEX = r"[a-z]{2,5}-[0-9]{2}( [a-z]{1,4})?"
SMALL_CHOICES = ["red alert", "green light", "blue moon"]
SMALL_GBNF = 'root ::= ("ab" | "cd")+ " end"'

PROCESSOR_SPECS: dict[str, dict[str, Any]] = {
    "temperature": {"type": "temperature", "temperature": 0.7},
    "top_k": {"type": "top_k", "top_k": 5},
    "top_p": {"type": "top_p", "top_p": 0.8},
    "min_p": {"type": "min_p", "min_p": 0.2},
    "repetition_penalty": {"type": "repetition_penalty", "penalty": 1.5, "context_size": 4},
    "no_repeat_ngram": {"type": "no_repeat_ngram", "ngram_size": 2},
    "min_new_tokens": {"type": "min_new_tokens", "min_new_tokens": 3, "eos_token_id": 1},
    "logit_bias": {"type": "logit_bias", "bias": {"2": 3.0, "5": -2.0}},
    "suppress_tokens": {"type": "suppress_tokens", "token_ids": [0, 4]},
    "typical_p": {"type": "typical_p", "mass": 0.5},
    "epsilon_cutoff": {"type": "epsilon_cutoff", "epsilon": 0.01},
    "eta_cutoff": {"type": "eta_cutoff", "epsilon": 0.02},
    "top_n_sigma": {"type": "top_n_sigma", "n": 1.0},
    "top_h": {"type": "top_h", "top_h": 0.4},
    "xtc": {"type": "xtc", "threshold": 0.02, "probability": 0.5, "seed": 7},
    "bad_words": {"type": "bad_words", "words": [[3], [1, 2]]},
    "sequence_bias": {"type": "sequence_bias", "biases": [[[1, 2], 3.0], [[5], -2.0]]},
    "exponential_decay_length": {
        "type": "exponential_decay_length",
        "start_index": 2,
        "decay_factor": 1.5,
        "eos_token_id": 1,
    },
    "presence_penalty": {"type": "presence_penalty", "penalty": 0.5},
    "frequency_penalty": {"type": "frequency_penalty", "penalty": 0.5},
    "dry": {
        "type": "dry",
        "multiplier": 0.8,
        "base": 1.75,
        "allowed_length": 1,
        "sequence_breakers": [],
        "penalty_last_n": -1,
    },
    "watermark": {
        "type": "watermark",
        "bias": 4.0,
        "seeding_scheme": "selfhash",
        "context_width": 2,
    },
    "force_sequence": {"type": "force_sequence", "phrase": [3, 5, 7]},
    "trigger_phrase": {
        "type": "trigger_phrase",
        "trigger": [5],
        "phrase": [4, 6],
        "trigger_count": 2,
        "trigger_after": True,
    },
    "force_last_phrase": {
        "type": "force_last_phrase",
        "phrase": [4, 6],
        "eos_token_id": list(range(32)),
    },
    "gen_length": {"type": "gen_length", "boost_factor": 0.5, "p": 1, "boost_token": 1},
    "cite_from_prompt": {
        "type": "cite_from_prompt",
        "boost_factor": 1.5,
        "conditional_boost_factor": 0.5,
        "eos_token_id": 1,
    },
    "multiple_choice": {"type": "multiple_choice", "choices": [2, 3, 5]},
    "stateful_probe": {"type": "testing.generated_hash_bias", "bias": 4.0},
}


def build(name: str) -> LogitsProcessor:
    return from_spec(PROCESSOR_SPECS[name])


# Processors configured with text or grammars: they need a vocabulary (the hook-level
# tests give them the tiny model's real tokenizer, 128,256 tokens).
VOCABULARY_SPECS: dict[str, dict[str, Any]] = {
    "stop_strings": {"type": "stop_strings", "stop_strings": ["7 8", " 1"]},
    "bad_words": {"type": "bad_words", "words": [" 3", "1 2"]},
    "json_schema": {"type": "json_schema", "schema": SMALL_SCHEMA},
    "regex": {"type": "regex", "pattern": r"[0-9]{1,3}( [0-9]{1,3})*"},
    "choice": {"type": "choice", "choices": ["1 2 3 4 5 6 7 8 9", " 10 11 12 13 14 15 16"]},
    "grammar": {"type": "grammar", "grammar": 'root ::= ("1" | " 2" | "34")+', "syntax": "gbnf"},
    "dry": {"type": "dry", "multiplier": 0.8, "allowed_length": 1},
    "force_sequence": {"type": "force_sequence", "phrase": " Sure, here it is"},
    "trigger_phrase": {
        "type": "trigger_phrase",
        "trigger": "3",
        "phrase": " five",
        "trigger_after": True,
    },
    "multiple_choice": {"type": "multiple_choice", "choices": ["1", "2", "3"]},
}


def catalogue_classes() -> dict[str, str]:
    """Spec name -> class name of every catalogue processor."""
    import anylogits.processors

    names = {}
    for public in anylogits.processors.__all__:
        value = getattr(anylogits.processors, public)
        if isinstance(value, type) and issubclass(value, LogitsProcessor):
            spec_name = value.__dict__.get("spec_name")
            if spec_name:
                names[spec_name] = value.__name__
    return names
