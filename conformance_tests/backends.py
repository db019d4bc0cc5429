"""How each backend calls a logits hook, reproduced exactly, for hook-level conformance.

One small class per backend (einops-style): how to build the native hook from
anylogits processors, and how the backend calls it with native arrays.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from anylogits import LogitsProcessor


class TransformersBackend:
    """``generate`` calls ``hook(input_ids (B, L) int64, scores (B, V) float32)``."""

    name = "transformers"
    module = "transformers"

    def hook(self, processors: list[LogitsProcessor], tokenizer: Any = None) -> Any:
        from anylogits import for_transformers

        return for_transformers(*processors, tokenizer=tokenizer)

    def call(self, hook: Any, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        scores = logits.clone()
        result = hook(token_ids, scores)
        assert torch.equal(scores, logits), "the hook edited the scores transformers keeps"
        return result


BACKENDS = {backend.name: backend for backend in (TransformersBackend(),)}


def installed(name: str) -> bool:
    return importlib.util.find_spec(BACKENDS[name].module) is not None
