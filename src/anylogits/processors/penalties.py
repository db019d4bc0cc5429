"""Penalties on tokens the sequence already holds: :class:`RepetitionPenalty` (CTRL's,
prompt included), :class:`PresencePenalty` and :class:`FrequencyPenalty` (OpenAI's, on
generated tokens only).

Oracles: transformers ``RepetitionPenaltyLogitsProcessor`` (mlx-lm and llama.cpp with a
window); vLLM ``apply_penalties`` for presence and frequency.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from anylogits.core.batch import Batch
from anylogits.core.fast_paths import FastPaths, RowwiseProcessor
from anylogits.core.fused_forms import OutputPenalty, OutputPenaltyKind, RepetitionPenaltyForm
from anylogits.core.processor import LogitsProcessor
from anylogits.core.sync import host_sync_allowed
from anylogits.core.transfer import DeviceCopies, to_device
from anylogits.processors._checks import finite_float, int_at_least, positive_float
from anylogits.processors._ops import compute_precision, history_within, row_values

if TYPE_CHECKING:
    from typing_extensions import Self


class RepetitionPenalty(FastPaths):
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

    def process_into(self, logits: torch.Tensor, batch: Batch, out: torch.Tensor) -> torch.Tensor:
        return _repetition_penalty(logits, batch, self.penalty, self.context_size, out=out)

    def fused_form(self) -> RepetitionPenaltyForm:
        return RepetitionPenaltyForm(self.penalty, self.context_size)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor | None:
        sizes = {p.context_size for p in processors}
        if len(sizes) > 1:
            return None
        penalties = row_values([p.penalty for p in processors])
        return RowwiseProcessor(_repetition_penalty, penalty=penalties, context_size=sizes.pop())


def _repetition_penalty(
    logits: torch.Tensor,
    batch: Batch,
    penalty: float | DeviceCopies,
    context_size: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out``: where the result goes (the rows copied with the penalized columns, in
    one scatter), leaving ``logits`` untouched; by default ``logits``, in place."""
    if (
        batch.rows_are_full
        and not isinstance(penalty, DeviceCopies)
        and not host_sync_allowed(logits)
        and batch.token_ids.device == logits.device
    ):
        history = batch.token_ids
        if context_size is not None and history.shape[1] > context_size:
            history = history[:, -context_size:]
        return _penalize_full_rows(logits, history, penalty)
    ids, rows_with_ids = history_within(batch, logits.shape[-1], context_size)
    ids = to_device(ids, logits.device)
    seen = logits.gather(1, ids)
    if isinstance(penalty, DeviceCopies):
        # One penalty per row, computed and rounded as a Python float would be.
        factor = compute_precision(penalty, logits)[:, None]
        wide = seen.to(factor.dtype)
        penalized = torch.where(wide < 0, wide * factor, wide / factor).to(seen.dtype)
    else:
        penalized = torch.where(seen < 0, seen * penalty, seen / penalty)
    if rows_with_ids is not None:
        penalized = torch.where(to_device(rows_with_ids, logits.device), penalized, seen)
    if out is None:
        return logits.scatter_(1, ids, penalized)
    return torch.scatter(logits, 1, ids, penalized, out=out)


def _penalize_full_rows(logits: torch.Tensor, ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """Rows whose every column is a token (transformers' ``input_ids``) on the logits'
    accelerator, as transformers penalizes them: an id past the logits (a model whose
    embedding is wider than its LM head) goes to one extra column, dropped after. Pad
    (the copy that leaves ``logits`` untouched), clamp, gather, penalize, scatter: eight
    operations, where making every id usable took fourteen. Returns a view of the padded
    copy."""
    width = logits.shape[-1]
    if ids.shape[1] == 0:
        return logits.clone()
    padded = torch.nn.functional.pad(logits, (0, 1))
    ids = ids.clamp(max=width)
    seen = padded.gather(1, ids)
    padded.scatter_(1, ids, torch.where(seen < 0, seen * penalty, seen / penalty))
    return padded[:, :width]


class _RowwiseWithSequences(RowwiseProcessor):
    """Stacked presence / frequency penalties: they read prompt lengths, so whatever runs
    them must know which sequence each row is."""

    needs_sequences = True


def _output_tokens(
    batch: Batch, width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The tokens each row generated after its prompt, as columns of ``width`` logits.

    Returns ``(index, usable, has_any)``, or ``None`` when no row generated anything
    (known where reading the lengths is free, see :func:`host_sync_allowed`, or when the
    history is empty). ``index`` is the ``(B, G)`` tail of the right-aligned history, ``G``
    the longest generation (else the whole history); prompt tokens, padding and ids
    ``>= width`` (no logit to penalize) are not ``usable`` and are replaced by a usable id
    of the same row, so reading or writing them repeats work done for that id.
    ``has_any`` (``(B, 1)``) marks rows holding a usable id.
    """
    generated = batch.generated_lengths
    history = batch.token_ids
    if host_sync_allowed(generated):
        # Only the longest generated tail: prompts are often far longer than outputs.
        longest = int(generated.max()) if generated.numel() else 0
    else:
        longest = history.shape[1]  # the tail's length is on the device: take it all
    if longest <= 0:
        return None
    ids = to_device(history[:, history.shape[1] - longest :], device)
    columns = torch.arange(longest, device=device)
    usable = (columns >= (longest - to_device(generated, device))[:, None]) & (ids < width)
    fill = torch.where(usable, ids, -1).amax(dim=1, keepdim=True)
    return torch.where(usable, ids, fill.clamp(min=0)), usable, fill >= 0


def _presence_penalty(logits: torch.Tensor, batch: Batch, penalty: DeviceCopies) -> torch.Tensor:
    found = _output_tokens(batch, logits.shape[-1], logits.device)
    if found is None:
        return logits
    index, _, has_any = found
    seen = logits.gather(1, index)
    amount = compute_precision(penalty, logits)[:, None]
    penalized = (seen.to(amount.dtype) - amount).to(seen.dtype)
    return logits.scatter_(1, index, torch.where(has_any, penalized, seen))


def _frequency_penalty(logits: torch.Tensor, batch: Batch, penalty: DeviceCopies) -> torch.Tensor:
    found = _output_tokens(batch, logits.shape[-1], logits.device)
    if found is None:
        return logits
    index, usable, has_any = found
    # A (B, V + 1) table as vLLM builds it (unusable positions count in the extra column):
    # one scatter, far cheaper than sorting the history on CPU.
    width = logits.shape[-1]
    table = torch.zeros(index.shape[0], width + 1, dtype=torch.int32, device=index.device)
    counted = torch.where(usable, index, width)
    counts = table.scatter_add_(1, counted, torch.ones_like(counted, dtype=torch.int32))
    counts = counts.gather(1, index)
    seen = logits.gather(1, index)
    rate = compute_precision(penalty, logits)[:, None]
    penalized = (seen.to(rate.dtype) - rate * counts.to(rate.dtype)).to(seen.dtype)
    return logits.scatter_(1, index, torch.where(has_any, penalized, seen))


class _OutputTokenPenalty(FastPaths):
    """What PresencePenalty and FrequencyPenalty share: one finite ``penalty`` per row,
    applied to generated tokens by the subclass's ``_rows`` function."""

    needs_sequences = True
    _rows: Callable[..., torch.Tensor]
    _kind: ClassVar[OutputPenaltyKind]

    def __init__(self, penalty: float) -> None:
        self.penalty = finite_float("penalty", penalty)
        self._penalties = row_values([self.penalty])  # built once, not on every call

    def config(self) -> dict[str, Any]:
        return {"penalty": self.penalty}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return type(self)._rows(logits, batch, self._penalties)

    def fused_form(self) -> OutputPenalty:
        return OutputPenalty(self._kind, self._penalties)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor:
        penalties = row_values([p.penalty for p in processors])
        return _RowwiseWithSequences(
            cls._rows, fused=OutputPenalty(cls._kind, penalties), penalty=penalties
        )


class PresencePenalty(_OutputTokenPenalty):
    """Subtract ``penalty`` once from every token the sequence has generated so far.

    OpenAI's ``presence_penalty``: only tokens generated after the prompt count, so the
    prompt is never penalized. Arithmetic as vLLM's: the penalty is rounded to float32
    (float64 for float64 logits) and subtracted in that precision.

    Oracles: vLLM ``apply_penalties`` (identical); llama.cpp ``penalties`` sampler and
    mlx-lm ``make_presence_penalty`` when they are given the generated tokens only and
    their window covers them (llama.cpp's server and mlx-lm also count prompt tokens
    inside their last-n window; see ``conformance_tests/test_oracles_penalties.py``).

    Args:
        penalty: any finite number (OpenAI accepts -2 to 2); > 0 discourages repeating
            a token, < 0 encourages it, 0 is a no-op.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.penalties import PresencePenalty
        >>> pipeline = Pipeline([PresencePenalty(0.5)])
        >>> pipeline(torch.zeros(1, 3), torch.tensor([[0]]))  # the prompt: not penalized
        tensor([[0., 0., 0.]])
        >>> pipeline(torch.zeros(1, 3), torch.tensor([[0, 1, 1]]))  # generated 1, 1
        tensor([[ 0.0000, -0.5000,  0.0000]])
    """

    spec_name = "presence_penalty"
    _rows = staticmethod(_presence_penalty)
    _kind = OutputPenaltyKind.PRESENCE


class FrequencyPenalty(_OutputTokenPenalty):
    """Subtract ``penalty`` times the number of times each token was generated so far.

    OpenAI's ``frequency_penalty``: only tokens generated after the prompt count. As in
    vLLM, ``penalty * count`` is computed in float32 (float64 for float64 logits) and
    subtracted in that precision.

    Oracles: vLLM ``apply_penalties`` (identical); llama.cpp ``penalties`` sampler
    (identical when given the generated tokens only); mlx-lm ``make_frequency_penalty``
    (it subtracts ``penalty`` once per occurrence, rounding each time: equal on values
    that round exactly, within float32 rounding otherwise).

    Args:
        penalty: any finite number (OpenAI accepts -2 to 2); 0 is a no-op.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.penalties import FrequencyPenalty
        >>> pipeline = Pipeline([FrequencyPenalty(0.5)])
        >>> pipeline(torch.zeros(1, 3), torch.tensor([[1]]))  # the prompt: not penalized
        tensor([[0., 0., 0.]])
        >>> pipeline(torch.zeros(1, 3), torch.tensor([[1, 2, 0, 2]]))  # generated 2, 0, 2
        tensor([[-0.5000,  0.0000, -1.0000]])
    """

    spec_name = "frequency_penalty"
    _rows = staticmethod(_frequency_penalty)
    _kind = OutputPenaltyKind.FREQUENCY
