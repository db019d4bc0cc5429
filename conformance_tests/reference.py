"""transformers on the tiny model as the reference other engines must agree with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from anylogits import (
    JSONSchema,
    LogitBias,
    LogitsProcessor,
    NoRepeatNGram,
    Regex,
    RepetitionPenalty,
    SuppressTokens,
)
from anylogits.testing.probes import GeneratedHashBias

COUNTING = "1 2 3 4 5 6 7 8 9 10 11 12"  # a prompt where penalties change greedy output
NEW_TOKENS = 16

SMALL_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "tag": {"enum": ["red", "green", "blue"]},
    },
    "required": ["id", "tag"],
    "additionalProperties": False,
}

# Processors every engine must apply with the same greedy tokens as transformers, built
# from the engine's unprocessed greedy output (so that each one changes it).
CROSS_ENGINE_CASES: dict[str, Callable[[list[int]], list[LogitsProcessor]]] = {
    "repetition_penalty": lambda plain: [RepetitionPenalty(1.3)],
    "no_repeat_ngram": lambda plain: [NoRepeatNGram(2)],
    "suppress_tokens": lambda plain: [SuppressTokens(sorted(set(plain[:4])))],
    "logit_bias": lambda plain: [LogitBias({plain[-1]: 4.0})],
    "stateful_probe": lambda plain: [GeneratedHashBias(12.0)],
    # Structured: the same grammar over each engine's own vocabulary (llama.cpp reads its
    # pieces from the GGUF file) must pick the same tokens.
    "json_schema": lambda plain: [JSONSchema(SMALL_SCHEMA)],
    "regex": lambda plain: [Regex(r"[a-z]{2,5}-[0-9]{2}( [a-z]{1,4})?")],
}


def hf_greedy(
    model: Any, tokenizer: Any, prompt: list[int], *processors: LogitsProcessor, n: int = 16
) -> list[int]:
    """Greedy new token ids of transformers on ``prompt`` (ids, BOS included)."""
    import transformers

    from anylogits import for_transformers

    hooks = transformers.LogitsProcessorList(
        [for_transformers(*processors, tokenizer=tokenizer)] if processors else []
    )
    output = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=n,
        do_sample=False,
        top_k=None,
        top_p=1.0,
        temperature=1.0,
        logits_processor=hooks,
        pad_token_id=tokenizer.eos_token_id,
    )
    return output[0, len(prompt) :].tolist()
