"""Penalties on tokens the sequence already holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.processor import LogitsProcessor, RowwiseProcessor
from anylogits.processors._checks import int_at_least, positive_float
from anylogits.processors.sampling import opmath, row_values


def history_within(
    batch: Batch, width: int, last: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``(B, L)`` history with every id usable as a column of ``width`` logits; with
    ``last``, only each row's last ``last`` tokens (``(B, min(L, last))``).

    Padding and ids ``>= width`` (models whose embedding is wider than their LM head) are
    replaced by an id the same row already holds, so gathering / scattering them only
    repeats work done for that id. Also returns which rows hold any usable id (``None``
    when all do); rows that hold none must be left unchanged.
    """
    ids = batch.token_ids
    lengths = batch.lengths.to(ids.device)
    if last is not None and ids.shape[1] > last:
        # Right-aligned: every row's last tokens share the last columns.
        ids = ids[:, -last:]
        lengths = lengths.clamp(max=last)
    usable = ids < width
    if lengths.min() < ids.shape[1]:
        columns = torch.arange(ids.shape[1], device=ids.device)
        usable &= columns >= (ids.shape[1] - lengths)[:, None]
    if bool(usable.all()):
        return ids, None
    fill = torch.where(usable, ids, -1).amax(dim=1, keepdim=True)
    return torch.where(usable, ids, fill.clamp(min=0)), (fill >= 0)


class RepetitionPenalty(LogitsProcessor):
    """CTRL repetition penalty over every token of the sequence (prompt included).

    A token already present has its logit divided by ``penalty`` when positive and
    multiplied by it when negative (``penalty`` > 1 discourages repetition).

    Oracle: transformers ``RepetitionPenaltyLogitsProcessor`` (identical result, including
    its choice to penalize prompt tokens and left-padding ids that ``generate`` passes).
    With ``context_size``: mlx-lm ``make_repetition_penalty(penalty, context_size)`` and
    llama.cpp's ``penalties`` sampler with ``penalty_last_n`` fed the whole sequence, as
    its server does (identical; llama.cpp tests ``logit <= 0`` where we test ``< 0``,
    the same at 0).

    Args:
        penalty: strictly positive; 1.0 is a no-op.
        context_size: only the last ``context_size`` tokens of the sequence count, prompt
            included (mlx-lm ``repetition_context_size``, llama.cpp ``penalty_last_n``),
            >= 1; ``None`` counts the whole history (transformers, vLLM). 0 is rejected:
            mlx-lm reads it as the whole history, llama.cpp as "disabled".

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, RepetitionPenalty
        >>> logits = torch.tensor([[2.0, -2.0, 2.0]])
        >>> Pipeline([RepetitionPenalty(2.0)])(logits, torch.tensor([[0, 1]]))
        tensor([[ 1., -4.,  2.]])
    """

    spec_name = "repetition_penalty"

    def __init__(self, penalty: float, context_size: int | None = None) -> None:
        self.penalty = positive_float("penalty", penalty)
        self.context_size = (
            None
            if context_size is None
            else int_at_least("context_size", context_size, 1, limit="window")
        )

    def config(self) -> dict[str, Any]:
        return {"penalty": self.penalty, "context_size": self.context_size}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return _repetition_penalty(logits, batch, self.penalty, self.context_size)

    @classmethod
    def stack(cls, processors: Sequence[LogitsProcessor]) -> LogitsProcessor | None:
        sizes = {p.context_size for p in processors}  # type: ignore[attr-defined]
        if len(sizes) > 1:
            return None
        penalties = row_values([p.penalty for p in processors])  # type: ignore[attr-defined]
        return RowwiseProcessor(_repetition_penalty, penalty=penalties, context_size=sizes.pop())


def _repetition_penalty(
    logits: torch.Tensor,
    batch: Batch,
    penalty: float | torch.Tensor,
    context_size: int | None = None,
) -> torch.Tensor:
    ids, rows_with_ids = history_within(batch, logits.shape[-1], context_size)
    ids = ids.to(logits.device)
    seen = logits.gather(1, ids)
    if isinstance(penalty, torch.Tensor):
        # One penalty per row, computed and rounded as a Python float would be.
        factor = opmath(penalty, logits)[:, None]
        wide = seen.to(factor.dtype)
        penalized = torch.where(wide < 0, wide * factor, wide / factor).to(seen.dtype)
    else:
        penalized = torch.where(seen < 0, seen * penalty, seen / penalty)
    if rows_with_ids is not None:
        penalized = torch.where(rows_with_ids.to(logits.device), penalized, seen)
    return logits.scatter_(1, ids, penalized)


class NoRepeatNGram(LogitsProcessor):
    """Forbid any token that would complete an n-gram the sequence already contains.

    Vectorized: every window of the history is compared with the last ``n - 1`` tokens
    at once, so the cost is one ``(B, L, n)`` comparison instead of a Python loop.

    Oracle: transformers ``NoRepeatNGramLogitsProcessor`` (identical result; like it,
    the prompt counts).

    Args:
        ngram_size: n, >= 1 (1 forbids every token already present).

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, NoRepeatNGram
        >>> history = torch.tensor([[5, 1, 2, 5]])  # "5 1" was seen: 1 may not follow 5
        >>> Pipeline([NoRepeatNGram(2)])(torch.zeros(1, 6), history)
        tensor([[0., -inf, 0., 0., 0., 0.]])
    """

    spec_name = "no_repeat_ngram"

    def __init__(self, ngram_size: int) -> None:
        self.ngram_size = int_at_least("ngram_size", ngram_size, 1, limit="ngram_size")

    def config(self) -> dict[str, Any]:
        return {"ngram_size": self.ngram_size}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        n = self.ngram_size
        ids = batch.token_ids.to(logits.device)
        width = ids.shape[1]
        if width < n:
            return logits
        windows = ids.unfold(1, n, 1)  # (B, W, n), W = L - n + 1
        matches = (windows[..., :-1] == ids[:, width - n + 1 :].unsqueeze(1)).all(-1)
        if batch.lengths.min() < width:
            # A window must lie inside the row, and the row must hold n - 1 tokens.
            starts = torch.arange(windows.shape[1], device=ids.device)
            row_starts = (width - batch.lengths.to(ids.device))[:, None]
            inside = (starts >= row_starts) & (batch.lengths.to(ids.device) >= n)[:, None]
            matches &= inside
        followers = windows[..., -1]
        if int(followers.max()) >= logits.shape[-1]:
            # Ids beyond the logits (embedding wider than the LM head) cannot be banned.
            matches &= followers < logits.shape[-1]
            followers = followers.clamp(max=logits.shape[-1] - 1)
        # amin with +inf leaves a logit alone, with -inf bans it; duplicates are harmless.
        banned = torch.full(followers.shape, float("inf"), dtype=logits.dtype, device=ids.device)
        banned.masked_fill_(matches, float("-inf"))
        return logits.scatter_reduce_(1, followers, banned, reduce="amin")
