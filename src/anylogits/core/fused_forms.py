"""Fused forms: what a processor declares so that a kernel may apply it.

On a CUDA device with kernels on, the launch plan (:mod:`anylogits.core.launch_plan`)
replaces a run of processors by one kernel launch. It knows a processor only through
the value its :meth:`~anylogits.core.fast_paths.FastPaths.fused_form` returns: which
kernel applies it and with what per-row parameters. A processor returns ``None`` (the
default) where no kernel applies it exactly as its :meth:`process` does.

Parameters are one value for every row (a Python number) or a
:class:`~anylogits.core.transfer.DeviceCopies` of one per row (a processor stacked from
vLLM's grouped rows by :meth:`~anylogits.core.fast_paths.FastPaths.stack`).

A user's processor may declare a form too, when its :meth:`process` gives exactly the
kernel's result (the catalogue's processors are held to it by ``tests/test_kernels.py``):

    >>> from anylogits.core.fast_paths import FastPaths
    >>> from anylogits.core.fused_forms import Truncation, TruncationKind
    >>> class MyTopK(FastPaths):
    ...     def __init__(self, k: int) -> None:
    ...         self.k = k
    ...
    ...     def process(self, logits, batch):
    ...         kth = logits.topk(self.k, dim=-1).values[:, -1:]
    ...         return logits.masked_fill_(logits < kth, float("-inf"))
    ...
    ...     def fused_form(self):
    ...         return Truncation(TruncationKind.TOP_K, self.k)
    >>> MyTopK(5).fused_form()
    Truncation(kind=<TruncationKind.TOP_K: 'top_k'>, value=5)

A subclass inherits its base's form: one that changes what :meth:`process` does must
override :meth:`fused_form` too (returning ``None`` keeps it off the kernels).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anylogits.core.transfer import DeviceCopies

if TYPE_CHECKING:
    import torch

RowValues = int | float | DeviceCopies
"""One value for every row, or a :class:`DeviceCopies` of one per row."""


class TruncationKind(enum.Enum):
    """A step of :func:`anylogits.kernels.truncation.truncate`."""

    TOP_K = "top_k"  # keep each row's ``value`` highest logits and their ties
    TOP_P = "top_p"  # keep the nucleus of mass ``value`` (ties with its last token kept)
    MIN_P = "min_p"  # keep tokens at least ``value`` times as likely as the top one
    TEMPERATURE = "temperature"  # divide the row by ``value``


@dataclass(frozen=True)
class Truncation:
    """Applied by the truncation kernel: ``kind`` with its parameter ``value`` (an
    int64 ``k`` for top-k, else float32). A run of these, each kind once, at least one
    not a temperature, a temperature only first or last, is one launch."""

    kind: TruncationKind
    value: RowValues


@dataclass(frozen=True)
class RepetitionPenaltyForm:
    """Applied by the repetition-penalty kernel (rows whose whole history is on the
    logits' device): CTRL's ``penalty`` over the last ``context_size`` tokens (``None``:
    all), one value for every row."""

    penalty: float
    context_size: int | None


class OutputPenaltyKind(enum.Enum):
    """OpenAI's penalties on generated tokens."""

    PRESENCE = "presence"  # ``penalty`` subtracted once from every generated token
    FREQUENCY = "frequency"  # ``penalty`` times the token's count subtracted


@dataclass(frozen=True)
class OutputPenalty:
    """Applied by the output-penalties kernel: ``kind`` with ``penalties`` (float64 on
    the host, one element for every row or one per row). A presence and a frequency
    penalty in a row, either order, are one launch."""

    kind: OutputPenaltyKind
    penalties: DeviceCopies


class TokenListKind(enum.Enum):
    """What the sparse kernel does at a list's ids."""

    BIAS = "bias"  # adds the id's value
    BANS = "bans"  # sets the logit to ``-inf``


@dataclass(frozen=True)
class TokenLists:
    """Applied by the sparse kernel: per row, a list of ids (and a value per id for a
    bias) in CSR form. A bias and a ban list in a row, either order, are one launch.

    Attributes:
        kind: a bias or bans.
        ids: the ids of every row one after another (int64) on the logits' device,
            given the logits; raises ``ValueError`` for an id past the row.
        offsets: int64 on the host: row ``r``'s ids are ``ids[offsets[r]:offsets[r + 1]]``;
            two offsets (``0`` and the list's length) for one list every row shares.
        values: a bias's values, one per id, float64 on the host (``None`` for bans).
    """

    kind: TokenListKind
    ids: Callable[[torch.Tensor], torch.Tensor]
    offsets: DeviceCopies
    values: DeviceCopies | None = None


FusedForm = Truncation | RepetitionPenaltyForm | OutputPenalty | TokenLists
"""What :meth:`~anylogits.core.fast_paths.FastPaths.fused_form` returns."""
