"""MLX (mlx-lm): logits processors for ``generate``, ``stream_generate``,
``generate_step`` and ``BatchGenerator``.

mlx-lm calls each processor as ``logits = processor(tokens, logits)``: ``tokens`` is the
1-D history of one sequence (prompt included; int32 at first, int64 later), ``logits``
``(1, V)`` in the model's dtype (bfloat16 included). ``BatchGenerator`` calls the
per-sequence list with ``(1, V)`` slices, and speculative decoding calls it once per
draft position and then truncates: the pipeline's prefix tracker keeps state right.

MLX -> torch is zero-copy through DLPack (it evaluates the lazy array); MLX arrays are
immutable, so the pipeline works on a copy, and ``mx.array(tensor)`` copies the result
back. numpy is never on the way, since it has no bfloat16.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import torch

from anylogits.adapters._hook import PipelineHook
from anylogits.core.pipeline import Pipeline
from anylogits.core.processor import LogitsProcessor
from anylogits.core.vocab import Vocabulary, hf_vocabulary


class MlxLogitsProcessor(PipelineHook):
    """The mlx-lm hook around an anylogits :class:`~anylogits.Pipeline`."""

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        scores = torch.from_dlpack(logits)
        was_1d = scores.ndim == 1
        owned = (scores[None] if was_1d else scores).clone()
        history = torch.from_dlpack(tokens).to(torch.int64).reshape(1, -1)
        result = self.pipeline(owned, history)
        return mx.array(result[0] if was_1d else result)


def for_mlx(*processors: LogitsProcessor | Pipeline, tokenizer: Any) -> list[MlxLogitsProcessor]:
    """The list mlx-lm takes as ``logits_processors``, running ``processors`` in order.

    Args:
        *processors: anylogits processors (or pipelines), applied in the order given.
        tokenizer: the tokenizer ``mlx_lm.load`` returned (a ``TokenizerWrapper``) or the
            Hugging Face tokenizer itself. Its ``eos_token_ids`` (every id mlx-lm stops
            on) are the vocabulary's end-of-sequence ids.

    Give ``BatchGenerator`` one list per sequence (call ``for_mlx`` once per sequence,
    or reuse one list: rows are told apart by their tokens).

    Example::

        from mlx_lm import generate, load
        from anylogits import RepetitionPenalty, for_mlx

        model, tokenizer = load("model-folder")
        generate(model, tokenizer, "Once upon a time", max_tokens=32,
                 logits_processors=for_mlx(RepetitionPenalty(1.3), tokenizer=tokenizer))
    """
    if not processors:
        raise ValueError("for_mlx needs at least one processor")
    return [MlxLogitsProcessor(Pipeline(processors, _vocabulary_of(tokenizer)), tokenizer)]


def _vocabulary_of(tokenizer: Any) -> Vocabulary:
    # mlx-lm's TokenizerWrapper holds the HF tokenizer; it stops on every eos_token_ids.
    hf_tokenizer = getattr(tokenizer, "_tokenizer", tokenizer)
    return hf_vocabulary(hf_tokenizer, eos_token_ids=getattr(tokenizer, "eos_token_ids", None))
