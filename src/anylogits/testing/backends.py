"""How each backend calls a logits hook, reproduced exactly.

One small class per backend (einops-style): whether it is installed, how to build its
native hook from anylogits processors, and how the backend calls that hook. The
conformance suite and the benchmarks both drive backends through these classes, so a
new backend is one class here plus one entry in :data:`BACKENDS`.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from anylogits.core.processor import LogitsProcessor


class TransformersBackend:
    """``generate`` calls ``hook(input_ids (B, L) int64, scores (B, V) float32)``."""

    name = "transformers"
    module = "transformers"
    # generate keeps the logits it passed in (output_logits): the hook must not edit them.
    preserves_logits = True

    def hook(self, processors: list[LogitsProcessor], tokenizer: Any = None) -> Any:
        from anylogits.adapters.transformers import for_transformers

        return for_transformers(*processors, tokenizer=tokenizer)

    def call(self, hook: Any, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Call ``hook`` as transformers does; ``logits`` is the backend's own tensor."""
        return hook(token_ids, logits)


BACKENDS: dict[str, Any] = {backend.name: backend for backend in (TransformersBackend(),)}


def installed(name: str) -> bool:
    """Whether backend ``name``'s library can be imported here."""
    return importlib.util.find_spec(BACKENDS[name].module) is not None
