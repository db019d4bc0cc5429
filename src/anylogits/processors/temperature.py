"""Temperature: scale every logit of a row by one divisor.

Oracle: transformers ``TemperatureLogitsWarper``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.fast_paths import FastPaths, RowwiseProcessor
from anylogits.core.fused_forms import Truncation, TruncationKind
from anylogits.core.processor import LogitsProcessor
from anylogits.processors._checks import positive_float
from anylogits.processors._ops import divide_rows, row_values

if TYPE_CHECKING:
    from typing_extensions import Self


class Temperature(FastPaths):
    """Divide logits by ``temperature`` (< 1 sharpens, > 1 flattens the distribution).

    Oracle: transformers ``TemperatureLogitsWarper`` (identical float arithmetic).

    Args:
        temperature: strictly positive divisor.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, Temperature
        >>> Pipeline([Temperature(2.0)])(torch.tensor([[2.0, -4.0]]))
        tensor([[ 1., -2.]])
    """

    spec_name = "temperature"
    argmax_invariant = True
    row_local = True
    keeps_order = True  # a division by a positive number is monotone

    def __init__(self, temperature: float) -> None:
        self.temperature = positive_float("temperature", temperature)

    def config(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return logits.div_(self.temperature)

    def process_into(self, logits: torch.Tensor, batch: Batch, out: torch.Tensor) -> torch.Tensor:
        return torch.div(logits, self.temperature, out=out)

    def fused_form(self) -> Truncation:
        return Truncation(TruncationKind.TEMPERATURE, self.temperature)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor:
        divisors = row_values([p.temperature for p in processors])
        return RowwiseProcessor(
            divide_rows,
            row_local=True,
            keeps_order=True,
            fused=Truncation(TruncationKind.TEMPERATURE, divisors),
            divisors=divisors,
        )
