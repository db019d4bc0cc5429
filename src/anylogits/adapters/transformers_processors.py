"""Bring a ``transformers.LogitsProcessor`` to llama.cpp and MLX (and transformers).

Thousands of processors exist as transformers ``LogitsProcessor`` objects: callables
``scores = processor(input_ids, scores)``. :func:`from_transformers` wraps one so that it
runs wherever anylogits runs in-process: it is called with the history anylogits tracks,
laid out as transformers lays it out (``(B, L)`` int64 ids, left-padded). Importing this
module does not import transformers: the wrapped object is only called.

What cannot work:

- processors that keep state per row index across calls (rows are sequences only within
  one of transformers' own ``generate`` calls; anylogits moves and forks rows);
- a vLLM server or engine: the processor is a Python object, not a spec, so it cannot
  travel to vLLM's engine process (``for_vllm`` raises ``ValueError`` saying so).
"""

from __future__ import annotations

from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.processor import LogitsProcessor

NO_SPEC = (
    "from_transformers({name}) wraps a Python object, which cannot travel to a vLLM engine "
    "as a spec; it runs with transformers, llama.cpp and MLX. For vLLM, write the "
    "processor as an anylogits processor (docs/authoring.md)"
)


class TransformersProcessor(LogitsProcessor):
    """A ``transformers.LogitsProcessor`` (any ``scores = f(input_ids, scores)``) run as an
    anylogits processor.

    Args:
        processor: the transformers processor instance.
        pad_token_id: the id left of a shorter row's history, as transformers pads a
            batch (its ``generation_config.pad_token_id``); only batches of rows with
            different lengths show it.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> def ban_last(input_ids, scores):  # a transformers-style processor
        ...     return scores.scatter(1, input_ids[:, -1:], float("-inf"))
        >>> Pipeline([from_transformers(ban_last)])(torch.zeros(1, 4), torch.tensor([[2]]))
        tensor([[0., 0., -inf, 0.]])
    """

    def __init__(self, processor: Any, *, pad_token_id: int = 0) -> None:
        if not callable(processor):
            raise ValueError(
                f"processor must be a transformers LogitsProcessor (a callable "
                f"(input_ids, scores) -> scores), got {type(processor).__qualname__}"
            )
        if not isinstance(pad_token_id, int) or isinstance(pad_token_id, bool):
            raise ValueError(f"pad_token_id must be an int, got {pad_token_id!r}")
        self.processor = processor
        self.pad_token_id = pad_token_id

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        ids = batch.token_ids.to(logits.device)
        # Our history is right-aligned like transformers' left-padded batch; only the
        # padding value differs.
        padded = torch.where(batch.valid_mask.to(logits.device), ids, self.pad_token_id)
        return self.processor(padded, logits)

    def to_spec(self) -> dict[str, Any]:
        raise ValueError(NO_SPEC.format(name=type(self.processor).__name__))

    def __repr__(self) -> str:
        return f"from_transformers({self.processor!r})"


def from_transformers(processor: Any, *, pad_token_id: int = 0) -> TransformersProcessor:
    """Wrap a ``transformers.LogitsProcessor`` instance as an anylogits processor, so it
    runs with ``for_llama_cpp``, ``for_mlx`` and ``for_transformers``
    (see :class:`TransformersProcessor`)."""
    return TransformersProcessor(processor, pad_token_id=pad_token_id)
