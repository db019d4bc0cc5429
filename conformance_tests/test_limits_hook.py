"""The cost limits on every backend: a processor over a limit fails the same way wherever
it runs.

Most limits are checked by the processor's constructor, before any backend sees it. The
tokenized length of text (``sequence_tokens``) needs the model's vocabulary, so it is
checked when a hook binds the processor: transformers, llama.cpp and MLX raise the same
``ValueError`` when the hook is built, before generation; vLLM's engine, which binds
inside a request, ends that request with EOS instead of failing the engine.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from anylogits import ForceSequence
from anylogits.core.limits import limits

# Few characters, many byte-level tokens: within text_chars, over sequence_tokens.
LONG_TOKENIZATION = "🦜" * 200


def test_a_limit_on_the_tokenized_text_fails_alike_on_every_backend(
    backend: Any, hf_tokenizer: Any
) -> None:
    tokens = hf_tokenizer.encode(LONG_TOKENIZATION, add_special_tokens=False)
    assert len(LONG_TOKENIZATION) <= limits().text_chars
    assert len(tokens) > limits().sequence_tokens
    processor = ForceSequence(LONG_TOKENIZATION)  # the text itself is within its limit
    message = (
        rf"phrase \(tokenized\) has {len(tokens)} tokens, more than the limit of "
        rf"{limits().sequence_tokens} \(anylogits limit 'sequence_tokens'"
    )
    if backend.name != "vllm":
        with pytest.raises(ValueError, match=message):
            backend.hook([processor], tokenizer=hf_tokenizer)
        return
    hook = backend.hook([processor], tokenizer=hf_tokenizer)
    width = len(hf_tokenizer)
    logits = torch.randn(1, width)
    result = backend.call(hook, torch.tensor([[1, 2, 3]]), logits.clone())
    eos = hf_tokenizer.eos_token_id
    assert result[0, eos] == 0 and torch.isinf(result[0]).sum() == width - 1, result
