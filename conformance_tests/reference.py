"""transformers on the tiny model as the reference other engines must agree with."""

from __future__ import annotations

from typing import Any

import torch

from anylogits import LogitsProcessor


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
