"""Hugging Face transformers: a ``LogitsProcessor`` for ``generate`` and pipelines.

transformers passes ``input_ids`` ``(B, L)`` (prompt included, left padding included,
every row the same length) and float32 ``scores`` ``(B, V)``. Rows are hypotheses, not
sequences: beam search reorders them every step and assisted generation calls the
processor once per candidate position, then drops rejected candidates. The pipeline's
prefix tracker handles both, so this adapter only converts and wires in.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor as _HFLogitsProcessor

from anylogits.adapters._hook import PipelineHook
from anylogits.core.buffers import ReusedOutputs
from anylogits.core.pipeline import Pipeline
from anylogits.core.processor import LogitsProcessor
from anylogits.core.vocab import hf_vocabulary


class TransformersLogitsProcessor(PipelineHook, _HFLogitsProcessor):
    """The transformers hook around an anylogits :class:`~anylogits.Pipeline`."""

    def __init__(self, pipeline: Pipeline, tokenizer: Any = None, in_place: bool = False) -> None:
        super().__init__(pipeline, tokenizer)
        self.in_place = in_place
        self._outputs = ReusedOutputs()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.FloatTensor:
        # generate keeps `scores` (output_logits=True returns them), so by default they
        # are not edited: the first processor writes its result to another tensor, in
        # the same pass. The result has the dtype of `scores`, a FloatTensor as
        # transformers' signature says.
        if self.in_place:
            return self.pipeline(scores, input_ids)  # type: ignore[return-value]
        return self.pipeline(scores, input_ids, out=self._outputs.like(scores))  # type: ignore[return-value]

    def reset(self) -> None:
        super().reset()
        self._outputs.clear()


def for_transformers(
    *processors: LogitsProcessor | Pipeline, tokenizer: Any = None, in_place: bool = False
) -> TransformersLogitsProcessor:
    """A ``transformers.LogitsProcessor`` that runs ``processors`` in order.

    Args:
        *processors: anylogits processors (or pipelines), applied in the order given.
        tokenizer: the model's Hugging Face tokenizer; needed by processors that use the
            vocabulary (e.g. :class:`~anylogits.MinNewTokens` without ``eos_token_id``).
        in_place: edit the ``scores`` transformers passes instead of returning a new
            tensor, as xgrammar's and outlines' processors do. transformers' own
            processors never edit them, because ``generate(..., output_logits=True)``
            returns the very tensor it passed: with ``in_place=True`` those logits come
            back processed. Faster where the rows are many and wide (a JSON schema over
            32 rows of 49k tokens: one pass over the logits instead of two tensors').

    Example::

        from transformers import LogitsProcessorList
        from anylogits import RepetitionPenalty, TopK, for_transformers

        hook = for_transformers(RepetitionPenalty(1.3), TopK(20), tokenizer=tokenizer)
        model.generate(**inputs, logits_processor=LogitsProcessorList([hook]))
    """
    if not processors:
        raise ValueError("for_transformers needs at least one processor")
    if not isinstance(in_place, bool):
        raise ValueError(f"in_place must be a bool, got {in_place!r}")
    vocab = hf_vocabulary(tokenizer) if tokenizer is not None else None
    return TransformersLogitsProcessor(Pipeline(processors, vocab), tokenizer, in_place)
