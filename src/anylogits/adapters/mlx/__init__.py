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
  and converted while the model runs; so is the tracker's work and what processors can
  do without the logits (a grammar's mask: ``PendingLogits``), before the wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import torch

from anylogits.adapters._hook import PipelineHook
from anylogits.core.arrays import same_memory
from anylogits.core.pending import PendingLogits
from anylogits.core.pipeline import Pipeline
from anylogits.core.processor import LogitsProcessor
from anylogits.core.vocab import Vocabulary, hf_vocabulary

_UNSIGNED = {2: mx.uint16, 4: mx.uint32, 8: mx.uint64}
# Where MLX's arrays reach torch: DLPack hands them over on the host (unified memory).
HOST = torch.device("cpu")


class MlxLogitsProcessor(PipelineHook):
    """The mlx-lm hook around an anylogits :class:`~anylogits.Pipeline`.

    Args:
        pipeline: the processors to run.
        tokenizer: the tokenizer the pipeline's vocabulary came from (kept alive).
        cached_tokens: the ids already in the ``prompt_cache`` mlx-lm generates from,
            which it does not pass to processors: they are put back in front of every
            history the hook is given.
    """

    def __init__(
        self, pipeline: Pipeline, tokenizer: Any = None, cached_tokens: Sequence[int] = ()
    ) -> None:
        super().__init__(pipeline, tokenizer)
        self.cached_tokens = tuple(cached_tokens)
        for token in self.cached_tokens:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(
                    f"cached_tokens must be token ids (ints >= 0), got {token!r}: give the "
                    "ids the prompt cache was filled with"
                )
        self._cached = mx.array(self.cached_tokens, dtype=mx.int64) if cached_tokens else None

    def after(self, cached_tokens: Sequence[int]) -> MlxLogitsProcessor:
        """This hook's pipeline, for a generation from a prompt cache holding
        ``cached_tokens``."""
        return MlxLogitsProcessor(self.pipeline, self.tokenizer, cached_tokens)

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        owned = _copy(logits)
        history = tokens.astype(mx.int64)
        if self._cached is not None:
            history = mx.concatenate([self._cached, history])
        history = history.reshape(1, -1)
        mx.async_eval(history)  # queued first: ready before the model's logits
        mx.async_eval(owned)
        token_ids = torch.from_dlpack(history)  # waits for the history only
        waited: list[torch.Tensor] = []

        def scores() -> torch.Tensor:
            waited.append(torch.from_dlpack(owned))  # waits for the model
            return waited[0][None] if waited[0].ndim == 1 else waited[0]

        rows = 1 if logits.ndim == 1 else logits.shape[0]
        result = self.pipeline(PendingLogits(rows, HOST, scores), token_ids)
        if same_memory(result, waited[0]):
            return owned
        return mx.array(result.reshape(waited[0].shape))


def _copy(array: mx.array) -> mx.array:
    """A lazy copy of ``array`` in a buffer of its own, exact to the bit.

    An integer op on the bits: float arithmetic would round nothing either, but costs
    several times more in bfloat16 / float16 on the CPU. ``array`` is still referenced
    by the caller, so MLX cannot donate its buffer to the result.
    """
    bits = array.view(_UNSIGNED[array.itemsize])
    return (bits | 0).view(array.dtype)


def for_mlx(
    *processors: LogitsProcessor | Pipeline,
    tokenizer: Any,
    cached_tokens: Sequence[int] = (),
) -> list[MlxLogitsProcessor]:
    """The list mlx-lm takes as ``logits_processors``, running ``processors`` in order.

    Args:
        *processors: anylogits processors (or pipelines), applied in the order given.
        tokenizer: the tokenizer ``mlx_lm.load`` returned (a ``TokenizerWrapper``) or the
            Hugging Face tokenizer itself. Its ``eos_token_ids`` (every id mlx-lm stops
            on) are the vocabulary's end-of-sequence ids.
        cached_tokens: the token ids already in the ``prompt_cache`` given to
            ``generate`` / ``stream_generate`` / ``generate_step``. Those pass processors
            only the tokens they feed the model, so without this a warm cache hides its
            part of the prompt (a penalty would not see it) and the tokens differ from a
            cold start. ``BatchGenerator`` passes them itself (its ``all_tokens``).

    Give ``BatchGenerator`` one list per sequence (call ``for_mlx`` once per sequence,
    or reuse one list: rows are told apart by their tokens).

    Example::

        from mlx_lm import generate, load
        from anylogits import RepetitionPenalty, for_mlx

        model, tokenizer = load("model-folder")
        generate(model, tokenizer, "Once upon a time", max_tokens=32,
                 logits_processors=for_mlx(RepetitionPenalty(1.3), tokenizer=tokenizer))

        # With a warm prompt cache, name what it holds:
        cache = make_prompt_cache(model)
        prefix, rest = prompt[:-1], prompt[-1:]
        model(mx.array(prefix)[None], cache=cache)
        stream_generate(model, tokenizer, rest, prompt_cache=cache, logits_processors=
                        for_mlx(RepetitionPenalty(1.3), tokenizer=tokenizer,
                                cached_tokens=prefix))
    """
    if not processors:
        raise ValueError("for_mlx needs at least one processor")
    pipeline = Pipeline(processors, _vocabulary_of(tokenizer))
    return [MlxLogitsProcessor(pipeline, tokenizer, cached_tokens)]


def _vocabulary_of(tokenizer: Any) -> Vocabulary:
    # mlx-lm's TokenizerWrapper holds the HF tokenizer and stops on every eos_token_ids.
    # A Hugging Face tokenizer answers any `*_ids` name too (transformers 5:
    # `eos_token_ids` is the one EOS id, an int): its own EOS is read as for transformers.
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    if not isinstance(tokenizer, TokenizerWrapper):
        return hf_vocabulary(tokenizer)
    return hf_vocabulary(tokenizer._tokenizer, eos_token_ids=tokenizer.eos_token_ids)
