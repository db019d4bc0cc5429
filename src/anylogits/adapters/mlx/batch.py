"""mlx-lm's ``BatchGenerator`` with its rows' anylogits hooks run as one batch a step.

mlx-lm's ``GenerationBatch._step`` calls each row's ``logits_processors`` on that row
alone, then concatenates the rows: 32 requests with a schema each mean 32 waits for the
model, 32 copies, 32 grammar fills and 32 applies. :class:`BatchedHooks` runs mlx-lm's
own processors row by row as it does, and then every row whose list ends with an
:class:`~anylogits.adapters.mlx.MlxLogitsProcessor` in one call of a
:class:`~anylogits.core.persistent_batch.PersistentBatch` (a request's processors are
one group; groups of the same kinds, grammars of different schemas included, stack into
one fill and one apply), on one copy of the step's logits.

A row's identity is its token buffer (``GenerationBatch._token_context[row]``): mlx-lm
creates it when the request starts generating and moves it with the row through
``extend`` and ``filter``. Its first step gives the request's prompt (the buffer's
tokens, cached ones included); each later step adds the token sampled for it, so the
buffer itself is brought up to date (an MLX op a row and step) only for rows that also
run processors of mlx-lm's, which read it. A row whose buffer is gone has left, and its
request is forgotten at the next step.

:func:`batched_step` is mlx-lm's ``GenerationBatch._step`` of the release it was written
from (:data:`STEP_SHA256`), its processor loop replaced by :meth:`BatchedHooks.process`;
:func:`install` puts it in place only over that same ``_step``, and otherwise leaves
mlx-lm's own (each hook then runs on its row alone, as everywhere else).
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import itertools
import logging
import weakref
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import torch
from mlx_lm.generate import GenerationBatch

from anylogits.adapters.mlx import HOST, MlxLogitsProcessor, _copy
from anylogits.core.pending import PendingLogits
from anylogits.core.persistent_batch import PersistentBatch
from anylogits.core.slot_requests import PushedTokens
from anylogits.core.vocab import Vocabulary

logger = logging.getLogger(__name__)

STEP_SHA256 = "d7513c5031029194ca3820ae81d8966b792e66a90c39c1d7ad61d30bc9e8c5ad"
"""SHA-256 of the source of ``mlx_lm.generate.GenerationBatch._step`` (mlx-lm 0.32.2)
that :func:`batched_step` copies."""

# Slot of a row that runs no batched hook: PersistentBatch leaves it as it is.
_NO_SLOT = -1


class BatchedHooks:
    """The anylogits hooks of a ``BatchGenerator``'s rows, run as one batch a step.

    Args:
        vocab: the served model's vocabulary (its first EOS id ends a request whose
            processors failed).
    """

    def __init__(self, vocab: Vocabulary | None) -> None:
        self._requests = PersistentBatch(vocab)
        # A row's token buffer -> (its slot, its new tokens).
        self._rows: weakref.WeakKeyDictionary[Any, tuple[int, PushedTokens]] = (
            weakref.WeakKeyDictionary()
        )
        self._numbers = itertools.count()
        # Slots of rows whose buffers were freed (appended wherever the buffer dies).
        self._gone: collections.deque[int] = collections.deque()

    def __len__(self) -> int:
        """Requests followed (rows that left are forgotten at the next step)."""
        return len(self._requests) - len(self._gone)

    def process(
        self, batch: Any, logits: mx.array, inputs: mx.array
    ) -> tuple[mx.array, list[mx.array]]:
        """A ``GenerationBatch``'s ``(B, V)`` logits after every row's processors, and
        the token contexts mlx-lm's loop hands on (what ``_step`` evaluates with the
        next tokens).

        Args:
            batch: the ``GenerationBatch`` taking the step.
            logits: the model's last-position logits, one row per sequence.
            inputs: the tokens the model was just fed (each row's newest token).
        """
        while self._gone:
            self._requests.remove(self._gone.popleft())
        # The tokens first: they wait for the last step's sampling, not for this forward.
        newest = inputs.tolist()
        contexts: list[mx.array] = []
        row_slots = [_NO_SLOT] * len(newest)
        own_rows: list[tuple[int, mx.array, Any]] = []  # rows with mlx-lm's processors
        for row, processors in enumerate(batch.logits_processors):
            if not processors:
                continue
            buffer = batch._token_context[row]
            hook = processors[-1]
            if not _batched(hook):
                context = buffer.update_and_fetch(inputs[row : row + 1])
                contexts.append(context)
                own_rows.append((row, context, processors))
                continue
            known = self._rows.get(buffer)
            alone = len(processors) == 1
            # A row whose hook alone reads its tokens is given them: mlx-lm's context for
            # its processors would be an MLX op a row and step, read by no one.
            if known is None or not alone:
                context = buffer.update_and_fetch(inputs[row : row + 1])
                contexts.append(context)
                if not alone:
                    own_rows.append((row, context, processors[:-1]))
            if known is None:
                row_slots[row] = self._follow(buffer, hook, context)
            else:
                slot, tokens = known
                tokens.pending.append(newest[row])
                row_slots[row] = slot
        if own_rows:
            rows = [logits[row : row + 1] for row in range(len(newest))]
            for row, context, own in own_rows:
                sample = rows[row]
                for processor in own:
                    sample = processor(context, sample)
                rows[row] = sample
            logits = mx.concatenate(rows, axis=0)
        if max(row_slots, default=_NO_SLOT) == _NO_SLOT:
            return logits, contexts
        owned = _copy(logits)
        mx.async_eval(owned)
        # The masks are filled while MLX runs the model; then its logits are waited for.
        pending = PendingLogits(len(row_slots), HOST, lambda: torch.from_dlpack(owned))
        self._requests.process(pending, row_slots)
        return owned, contexts

    def _follow(self, buffer: Any, hook: MlxLogitsProcessor, context: mx.array) -> int:
        """A slot for the request of a row seen first, whose prompt is ``context``."""
        slot, tokens = next(self._numbers), PushedTokens()
        self._requests.put(
            slot, None, pipeline=hook.pipeline, prompt_ids=context.tolist(), output=tokens
        )
        self._rows[buffer] = (slot, tokens)
        weakref.finalize(buffer, self._gone.append, slot)
        return slot


def _batched(hook: Any) -> bool:
    """Whether a row's last processor runs in the batch: an anylogits hook that needs no
    prompt ids put in front (a batch row's buffer holds its cached prompt too)."""
    return type(hook) is MlxLogitsProcessor and not hook.cached_tokens


def batched_step(hooks: BatchedHooks) -> Callable[[Any], tuple[list[int], list[mx.array]]]:
    """mlx-lm's ``GenerationBatch._step`` (:data:`STEP_SHA256`), its rows' processors run
    by ``hooks``."""

    def _step(self: Any) -> tuple[list[int], list[mx.array]]:
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = self._current_tokens

        # Forward pass
        logits = self.model(inputs[:, None], cache=self.prompt_cache)
        logits = logits[:, -1, :]

        # Logits processors: mlx-lm's own row by row, then the anylogits hooks at once.
        token_context: list[mx.array] = []
        if any(self.logits_processors):
            logits, token_context = hooks.process(self, logits, inputs)

        # Normalize the logits
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)

        # One batched call when the batch shares a sampler.
        samplers = [
            self.fallback_sampler if s is None else s
            for s in (self.samplers or [None] * len(self.uids))
        ]
        if not samplers or all(s is samplers[0] for s in samplers):
            sampled = (samplers[0] if samplers else self.fallback_sampler)(logprobs)
        else:
            sampled = mx.concatenate(
                [s(logprobs[e : e + 1]) for e, s in enumerate(samplers)], axis=0
            )

        self._next_tokens = sampled
        self._next_logprobs = list(logprobs)
        mx.async_eval(self._next_tokens, self._next_logprobs, token_context)

        mx.eval(inputs, self._current_logprobs)
        inputs = inputs.tolist()
        for sti, ti in zip(self.tokens, inputs, strict=False):
            sti.append(ti)
        return inputs, self._current_logprobs

    return _step


def step_is_the_one_copied() -> bool:
    """Whether the installed mlx-lm's ``GenerationBatch._step`` is the one
    :func:`batched_step` copies."""
    try:
        source = inspect.getsource(GenerationBatch._step)
    except (OSError, TypeError):  # no source installed
        return False
    return hashlib.sha256(source.encode()).hexdigest() == STEP_SHA256


def install(vocab: Vocabulary | None) -> BatchedHooks | None:
    """Put :func:`batched_step` in place of ``GenerationBatch._step`` (the caller restores
    it), or leave mlx-lm's own where it is another release's (said once in the log)."""
    if not step_is_the_one_copied():
        logger.warning(
            "anylogits: this mlx-lm's GenerationBatch._step is not the one anylogits "
            "batches (mlx-lm 0.32.2's): each request's processors run on its row alone"
        )
        return None
    hooks = BatchedHooks(vocab)
    GenerationBatch._step = batched_step(hooks)
    return hooks
