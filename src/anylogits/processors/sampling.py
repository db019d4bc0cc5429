"""Sampling-shape processors: temperature and truncation (top-k, top-p, min-p)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.processor import LogitsProcessor, RowwiseProcessor
from anylogits.processors._checks import int_at_least, positive_float, probability


def keep_only(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Set ``logits`` to ``-inf`` where ``keep`` is False, in place.

    ``torch.where`` into the same tensor: a boolean ``masked_fill_`` is several times
    slower on CPU for scattered masks.
    """
    minus_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.where(keep, logits, minus_inf, out=logits)


class Temperature(LogitsProcessor):
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

    def __init__(self, temperature: float) -> None:
        self.temperature = positive_float("temperature", temperature)

    def config(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return logits.div_(self.temperature)

    @classmethod
    def stack(cls, processors: Sequence[LogitsProcessor]) -> LogitsProcessor:
        temperatures = [p.temperature for p in processors]  # type: ignore[attr-defined]
        return RowwiseProcessor(divide_rows, divisors=row_values(temperatures))


class TopK(LogitsProcessor):
    """Keep the ``top_k`` highest logits of each row (ties with the k-th are kept).

    Oracle: transformers ``TopKLogitsWarper`` (identical result).

    Args:
        top_k: number of tokens to keep, >= 1.
        min_tokens_to_keep: lower bound on ``top_k``, >= 1.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, TopK
        >>> Pipeline([TopK(2)])(torch.tensor([[1.0, 3.0, 2.0, 0.0]]))
        tensor([[-inf, 3., 2., -inf]])
    """

    spec_name = "top_k"
    argmax_invariant = True

    def __init__(self, top_k: int, min_tokens_to_keep: int = 1) -> None:
        self.top_k = int_at_least("top_k", top_k, 1)
        self.min_tokens_to_keep = int_at_least("min_tokens_to_keep", min_tokens_to_keep, 1)

    def config(self) -> dict[str, Any]:
        return {"top_k": self.top_k, "min_tokens_to_keep": self.min_tokens_to_keep}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        k = min(max(self.top_k, self.min_tokens_to_keep), logits.shape[-1])
        kth_value = torch.topk(logits, k, dim=-1).values[:, -1:]
        return keep_only(logits, logits >= kth_value)

    @classmethod
    def stack(cls, processors: Sequence[LogitsProcessor]) -> LogitsProcessor:
        ks = [max(p.top_k, p.min_tokens_to_keep) for p in processors]  # type: ignore[attr-defined]
        return RowwiseProcessor(_top_k_rows, ks=torch.tensor(ks))


class TopP(LogitsProcessor):
    """Nucleus sampling: keep the smallest set of most likely tokens whose probability
    reaches ``top_p``.

    Exact without sorting the whole vocabulary when the nucleus is small: probabilities
    are taken in descending chunks with ``torch.topk``, growing the chunk only while some
    row has not reached ``top_p`` (and sorting everything once the chunk would pass 1/8
    of the vocabulary). Tokens tied with the last kept one are kept too, so the result does not
    depend on sort order.

    Oracle: transformers ``TopPLogitsWarper``. Identical kept sets, except where the
    oracle's unstable sort splits a tie at the boundary, or where its ascending float32
    cumsum and this descending one round to different sides of ``1 - top_p``.

    Args:
        top_p: probability mass to keep, in (0, 1].
        min_tokens_to_keep: always keep at least this many tokens, >= 1.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, TopP
        >>> logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
        >>> Pipeline([TopP(0.7)])(logits).isinf().tolist()
        [[False, False, True]]
    """

    spec_name = "top_p"
    argmax_invariant = True
    first_chunk = 64

    def __init__(self, top_p: float, min_tokens_to_keep: int = 1) -> None:
        self.top_p = probability("top_p", top_p)
        self.min_tokens_to_keep = int_at_least("min_tokens_to_keep", min_tokens_to_keep, 1)

    def config(self) -> dict[str, Any]:
        return {"top_p": self.top_p, "min_tokens_to_keep": self.min_tokens_to_keep}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if self.top_p >= 1.0:
            # The float32 mass can round to 1.0 before the last tokens: keep them all.
            return logits
        width = logits.shape[-1]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        k = min(width, max(self.first_chunk, self.min_tokens_to_keep))
        while True:
            if k > width // 8:
                # A large nucleus: one full sort beats a chain of ever larger top-k's.
                k = width
                values = torch.sort(probs, dim=-1, descending=True).values
            else:
                values = torch.topk(probs, k, dim=-1).values
            mass = values.cumsum(dim=-1)
            if k == width or bool((mass[:, -1] >= self.top_p).all()):
                break
            k *= 8
        # Rank r is kept while the mass of the r - 1 likelier tokens is below top_p.
        kept = (1 + (mass < self.top_p).sum(dim=-1)).clamp(max=k)
        kept = kept.clamp(min=min(self.min_tokens_to_keep, k))
        threshold = values.gather(-1, (kept - 1)[:, None])
        return keep_only(logits, probs >= threshold)


class MinP(LogitsProcessor):
    """Keep tokens whose probability is at least ``min_p`` times the top token's.

    Oracle: transformers ``MinPLogitsWarper`` (identical; probabilities are computed in
    the logits' dtype as the oracle does).

    Args:
        min_p: relative probability floor, in [0, 1].
        min_tokens_to_keep: always keep at least this many tokens, >= 1.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, MinP
        >>> logits = torch.tensor([[0.6, 0.3, 0.1]]).log()
        >>> Pipeline([MinP(0.4)])(logits).isinf().tolist()
        [[False, False, True]]
    """

    spec_name = "min_p"
    argmax_invariant = True

    def __init__(self, min_p: float, min_tokens_to_keep: int = 1) -> None:
        self.min_p = probability("min_p", min_p, allow_zero=True)
        self.min_tokens_to_keep = int_at_least("min_tokens_to_keep", min_tokens_to_keep, 1)

    def config(self) -> dict[str, Any]:
        return {"min_p": self.min_p, "min_tokens_to_keep": self.min_tokens_to_keep}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return _min_p(logits, self.min_p, self.min_tokens_to_keep)

    @classmethod
    def stack(cls, processors: Sequence[LogitsProcessor]) -> LogitsProcessor | None:
        keep = {p.min_tokens_to_keep for p in processors}  # type: ignore[attr-defined]
        if len(keep) > 1:
            return None
        min_ps = row_values([p.min_p for p in processors])  # type: ignore[attr-defined]
        return RowwiseProcessor(_min_p_rows, min_ps=min_ps, min_tokens_to_keep=keep.pop())


def _min_p(
    logits: torch.Tensor, min_p: float | torch.Tensor, min_tokens_to_keep: int
) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    top = probs.amax(dim=-1, keepdim=True)
    if isinstance(min_p, torch.Tensor):
        # Rounded to the probabilities' dtype, as a Python float factor would be.
        threshold = (opmath(min_p, logits) * top.to(min_p.dtype)[:, 0]).to(probs.dtype)[:, None]
    else:
        threshold = min_p * top
    keep = probs >= threshold
    if min_tokens_to_keep > 1:
        k = min(min_tokens_to_keep, logits.shape[-1])
        keep.scatter_(-1, torch.topk(logits, k, dim=-1).indices, True)
    return keep_only(logits, keep)


def _min_p_rows(
    logits: torch.Tensor, batch: Batch, min_ps: torch.Tensor, min_tokens_to_keep: int
) -> torch.Tensor:
    return _min_p(logits, min_ps, min_tokens_to_keep)


def _top_k_rows(logits: torch.Tensor, batch: Batch, ks: torch.Tensor) -> torch.Tensor:
    ks = ks.clamp(max=logits.shape[-1]).to(logits.device)
    values = torch.topk(logits, int(ks.max()), dim=-1).values
    return keep_only(logits, logits >= values.gather(1, (ks - 1)[:, None]))


def row_values(values: Sequence[float]) -> torch.Tensor:
    """Per-row Python floats as a float64 tensor (see :func:`opmath`)."""
    return torch.tensor(values, dtype=torch.float64)


def opmath(values: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per-row floats in the precision torch computes ``logits`` op a Python float in:
    float64 for float64 logits, float32 otherwise (half types compute in float32)."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return values.to(device=logits.device, dtype=dtype)


def divide_rows(logits: torch.Tensor, batch: Batch, divisors: torch.Tensor) -> torch.Tensor:
    """Row ``i`` divided by ``divisors[i]``, bit for bit as ``row.div_(float)``."""
    divisors = opmath(divisors, logits)[:, None]
    if logits.dtype == divisors.dtype:
        return logits.div_(divisors)
    return logits.copy_(logits.to(divisors.dtype) / divisors)
