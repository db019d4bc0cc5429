"""MLX (mlx-lm): logits processors for ``generate``, ``stream_generate``,
``generate_step`` and ``BatchGenerator``; mlx-lm's OpenAI-compatible server with
per-request processors is wired in :mod:`~anylogits.adapters.mlx.server`.

mlx-lm calls each processor as ``logits = processor(tokens, logits)``: ``tokens`` is the
1-D history of one sequence (prompt included; int32 at first, int64 later), ``logits``
``(1, V)`` in the model's dtype (bfloat16 included). ``BatchGenerator`` calls the
per-sequence list with ``(1, V)`` slices, and speculative decoding calls it once per
draft position and then truncates: the pipeline's prefix tracker keeps state right.

Both arrays are lazy when the hook is called: mlx-lm evaluates a step asynchronously
(``mx.async_eval``) and keeps the model running while Python prepares the next one. The
pipeline must read the logits, so the hook waits for the model, and until it returns
mlx-lm's stream sits idle: what runs after that wait is kept to the pipeline alone.

- The pipeline edits a copy, never mlx-lm's array. The copy is an MLX op (on the bits,
  exact) evaluated with the model on mlx-lm's stream. Nobody else holds
  that fresh array, so torch edits it in place through DLPack (zero-copy, bfloat16
  included) and it goes back to mlx-lm as it is: no copy on the waiting side, none on
  the way back. Only a processor that returns a new tensor costs a copy back
  (``mx.array(tensor)``, through DLPack; numpy, which has no bfloat16, is never on the way).
- The history is cast and evaluated before the model (it only needs the previous token),
  and converted while the model runs.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import torch

from anylogits.adapters._hook import PipelineHook
from anylogits.core.arrays import same_memory
from anylogits.core.pipeline import Pipeline
from anylogits.core.processor import LogitsProcessor
from anylogits.core.vocab import Vocabulary, hf_vocabulary

_UNSIGNED = {2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


class MlxLogitsProcessor(PipelineHook):
    """The mlx-lm hook around an anylogits :class:`~anylogits.Pipeline`."""

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        owned = _copy(logits)
        history = tokens.astype(mx.int64).reshape(1, -1)
        mx.async_eval(history)  # queued first: ready before the model's logits
        mx.async_eval(owned)
        token_ids = torch.from_dlpack(history)  # waits for the history only
        scores = torch.from_dlpack(owned)  # waits for the model
        view = scores[None] if scores.ndim == 1 else scores
        result = self.pipeline(view, token_ids)
        if same_memory(result, view):
            return owned
        return mx.array(result.reshape(scores.shape))


def _copy(array: mx.array) -> mx.array:
    """A lazy copy of ``array`` in a buffer of its own, exact to the bit.

    An integer op on the bits: float arithmetic would round nothing either, but costs
    several times more in bfloat16 / float16 on the CPU. ``array`` is still referenced
    by the caller, so MLX cannot donate its buffer to the result.
    """
    bits = array.view(_UNSIGNED[array.itemsize])
    return (bits | 0).view(array.dtype)


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
