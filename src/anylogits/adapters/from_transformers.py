"""Bring a ``transformers.LogitsProcessor`` to llama.cpp, MLX and vLLM offline.

Thousands of processors exist as transformers ``LogitsProcessor`` objects: callables
``scores = processor(input_ids, scores)``. :func:`from_transformers` wraps one so that it
runs wherever anylogits runs in-process: it is called with the history anylogits tracks,
laid out as transformers lays it out (``(B, L)`` int64 ids, left-padded). Importing this
module does not import transformers: the wrapped object is only called.

A Python object cannot be a spec, so its spec names the object by an id that only this
process knows: vLLM runs it when its engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``); elsewhere the request is refused with an error
saying so, and a server never knows the id (HTTP 400).

What cannot work:

- processors that keep state per row index across calls (rows are sequences only within
  one of transformers' own ``generate`` calls; anylogits moves and forks rows);
- a vLLM server, or a vLLM engine in another process (see above).
"""

from __future__ import annotations

import uuid
from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.processor import LogitsProcessor
from anylogits.core.registry import in_process_only
from anylogits.core.transfer import to_device

SPEC_NAME = "transformers_object"

# The wrapped objects of this process, by the id their specs carry.
_OBJECTS: dict[str, Any] = {}

NOT_HERE = (
    "object_id {object_id!r} names no transformers processor of this process: "
    "from_transformers objects run only where they were made (transformers, llama.cpp, "
    "MLX, and vLLM with its engine in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0); a "
    "vLLM server cannot run them: write the processor as an anylogits processor "
    "(docs/authoring.md)"
)


@in_process_only
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

    spec_name = SPEC_NAME

    def __init__(
        self, processor: Any = None, *, pad_token_id: int = 0, object_id: str | None = None
    ) -> None:
        if object_id is not None:
            if processor is not None:
                raise ValueError("pass processor or object_id, not both")
            if not isinstance(object_id, str) or object_id not in _OBJECTS:
                raise ValueError(NOT_HERE.format(object_id=object_id))
            processor = _OBJECTS[object_id]
        if not callable(processor):
            raise ValueError(
                f"processor must be a transformers LogitsProcessor (a callable "
                f"(input_ids, scores) -> scores), got {type(processor).__qualname__}"
            )
        if not isinstance(pad_token_id, int) or isinstance(pad_token_id, bool):
            raise ValueError(f"pad_token_id must be an int, got {pad_token_id!r}")
        if object_id is None:
            object_id = uuid.uuid4().hex
            _OBJECTS[object_id] = processor
        self.processor = processor
        self.pad_token_id = pad_token_id
        self.object_id = object_id

    def config(self) -> dict[str, Any]:
        # Only this process can build the processor back from it (see the module's doc).
        return {"object_id": self.object_id, "pad_token_id": self.pad_token_id}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        ids = to_device(batch.token_ids, logits.device)
        # Our history is right-aligned like transformers' left-padded batch; only the
        # padding value differs.
        padded = torch.where(to_device(batch.valid_mask, logits.device), ids, self.pad_token_id)
        return self.processor(padded, logits)

    def __repr__(self) -> str:
        return f"from_transformers({self.processor!r})"


def from_transformers(processor: Any, *, pad_token_id: int = 0) -> TransformersProcessor:
    """Wrap a ``transformers.LogitsProcessor`` instance as an anylogits processor, so it
    runs with ``for_llama_cpp``, ``for_mlx``, ``for_transformers`` and, with vLLM's engine
    in this process, ``for_vllm`` (see :class:`TransformersProcessor`)."""
    return TransformersProcessor(processor, pad_token_id=pad_token_id)
