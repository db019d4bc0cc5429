"""Truncation: keep a set of tokens per row and set the others to ``-inf``.

By rank (:class:`TopK`), probability mass (:class:`TopP`) or relative probability
(:class:`MinP`); the cutoffs that adapt to each row's distribution (typicality, entropy,
spread) are in :mod:`~anylogits.processors.adaptive_truncation`. Oracles: transformers'
warpers.

Parameters reach the row functions as per-row tensors, so a processor and the
:meth:`stack` of several processors run the same code and give bit-identical rows. They
are :class:`~anylogits.core.transfer.DeviceCopies`: made on the host once, copied to the
logits' device on the first call only (a copy per call would block the host).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from anylogits.core.batch import Batch
from anylogits.core.fast_paths import Candidates, FastPaths, RowwiseProcessor
from anylogits.core.fused_forms import Truncation, TruncationKind
from anylogits.core.processor import LogitsProcessor
from anylogits.core.sync import host_sync_allowed
from anylogits.core.transfer import DeviceCopies
from anylogits.processors._checks import int_at_least, probability
from anylogits.processors._ops import (
    compute_precision,
    keep_only,
    mass_dtype,
    probabilities,
    row_ints,
    row_total,
    row_values,
    shifted_exp,
    sorted_descending,
    top_logits,
)

if TYPE_CHECKING:
    from typing_extensions import Self


class TopK(FastPaths):
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
    row_local = True
    keeps_order = True

    def __init__(self, top_k: int, min_tokens_to_keep: int = 1) -> None:
        self.top_k = int_at_least("top_k", top_k, 1)
        self.min_tokens_to_keep = int_at_least("min_tokens_to_keep", min_tokens_to_keep, 1)

    def config(self) -> dict[str, Any]:
        return {"top_k": self.top_k, "min_tokens_to_keep": self.min_tokens_to_keep}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return _top_k_rows(logits, batch, max(self.top_k, self.min_tokens_to_keep))

    def process_into(self, logits: torch.Tensor, batch: Batch, out: torch.Tensor) -> torch.Tensor:
        return _top_k_rows(logits, batch, max(self.top_k, self.min_tokens_to_keep), out=out)

    def candidates(self, logits: torch.Tensor, batch: Batch) -> Candidates | None:
        return _top_k_candidates(logits, batch, max(self.top_k, self.min_tokens_to_keep))

    def fused_form(self) -> Truncation:
        return Truncation(TruncationKind.TOP_K, max(self.top_k, self.min_tokens_to_keep))

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor:
        ks = [max(p.top_k, p.min_tokens_to_keep) for p in processors]
        row_ks = row_ints(ks)
        return RowwiseProcessor(
            _top_k_rows,
            row_local=True,
            keeps_order=True,
            candidates=_top_k_candidates,
            fused=Truncation(TruncationKind.TOP_K, row_ks),
            k_max=max(ks),
            ks=row_ks,
        )


def _top_k_rows(
    logits: torch.Tensor,
    batch: Batch,
    k_max: int,
    ks: DeviceCopies | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Row ``i`` keeps its ``ks[i]`` (all: ``k_max``) highest logits and their ties;
    into ``out`` when given (``logits`` left as they are)."""
    if not host_sync_allowed(logits):
        # An accelerator: the k-th logit alone (whether a row's candidates are exact is
        # a host read, and the candidates are never used there): topk, compare, where.
        return keep_only(logits, logits >= _kth_logit(logits, k_max, ks), out)
    if out is not None:
        logits = out.copy_(logits)
    top = _top_k(logits, k_max, ks)
    candidates = top.candidates
    # No tie at the k-th logit: the kept set is the top-k, so one index write replaces
    # a full-width comparison and `where`.
    if candidates is not None and bool(candidates.exact.all()):
        return candidates.write(logits)
    return keep_only(logits, logits >= top.kth)


def _kth_logit(logits: torch.Tensor, k_max: int, ks: DeviceCopies | None) -> torch.Tensor:
    """``(B, 1)``: each row's ``ks[row]``-th (all: ``k_max``-th) highest logit."""
    k_max = min(k_max, logits.shape[-1])
    values = torch.topk(logits, k_max, dim=-1).values
    if ks is None:
        return values[:, k_max - 1 :]
    return values.gather(-1, ks.on(logits.device).clamp(max=k_max)[:, None] - 1)


def _top_k_candidates(
    logits: torch.Tensor, batch: Batch, k_max: int, ks: DeviceCopies | None = None
) -> Candidates | None:
    return _top_k(logits, k_max, ks).candidates


class _TopK(NamedTuple):
    kth: torch.Tensor  # (B, 1): the k-th highest logit of each row
    candidates: Candidates | None  # None when k is the whole row


def _top_k(logits: torch.Tensor, k_max: int, ks: DeviceCopies | None) -> _TopK:
    """One ``topk`` of ``k_max + 1`` logits per row: the k-th logit, and the kept set as
    candidates, exact in rows whose next logit is below the k-th (no tie spills over)."""
    width = logits.shape[-1]
    k_max = min(k_max, width)
    values, columns = top_logits(logits, min(k_max + 1, width))
    if ks is None:
        kth = values[:, k_max - 1 : k_max]
        following = values[:, k_max : k_max + 1]
    else:
        ranks = ks.on(logits.device).clamp(max=k_max)[:, None]
        kth = values.gather(-1, ranks - 1)
        following = values.gather(-1, ranks.clamp(max=values.shape[-1] - 1))
    if k_max == width:
        return _TopK(kth, None)
    # A row is exact unless the next logit ties the k-th; if that is -inf (clamped to
    # the lowest float here), every finite logit is among the candidates. A row with NaN
    # (ranked first by topk, dropped by the full path; `minimum` propagates it) is not
    # exact, nor is a row of -inf only (no finite logit: the full path keeps it whole).
    bound = torch.minimum(kth.clamp(min=torch.finfo(kth.dtype).min), values[:, :1])
    exact = (following < bound).squeeze(-1)
    kept = values[:, :k_max]
    if ks is not None:  # rows with a smaller k drop their candidates below their k-th
        kept = torch.where(kept >= kth, kept, float("-inf"))
    return _TopK(kth, Candidates(kept, columns[:, :k_max], exact, descending=True))


class TopP(FastPaths):
    """Nucleus sampling: keep the smallest set of most likely tokens whose probability
    reaches ``top_p``.

    Exact without sorting the whole vocabulary when the nucleus is small: the logits are
    taken in descending chunks with ``torch.topk``, growing the chunk only while some
    row has not reached ``top_p``, and sorted whole at once when the top probability
    shows that the nucleus is large (on the CPU with numpy's SIMD sort when numpy is
    installed). Tokens as likely as the last kept one are kept too, so the result does
    not depend on sort order. Probabilities are float32, with bits that depend only on
    the row's finite logits (see :func:`~anylogits.processors._ops.row_total`), so a
    pipeline may run it on a truncation's candidates.

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
    row_local = True
    keeps_order = True
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
        return _top_p(logits, self.top_p, self.min_tokens_to_keep, self.first_chunk)

    def process_into(self, logits: torch.Tensor, batch: Batch, out: torch.Tensor) -> torch.Tensor:
        if self.top_p >= 1.0:
            return out.copy_(logits)
        if not host_sync_allowed(logits):
            return _top_p_sorted(logits, self.top_p, self.min_tokens_to_keep, out=out)
        return self.process(out.copy_(logits), batch)

    def process_descending(self, values: torch.Tensor, batch: Batch) -> torch.Tensor:
        if self.top_p >= 1.0:
            return values
        return _top_p(values, self.top_p, self.min_tokens_to_keep, self.first_chunk, True)

    def fused_form(self) -> Truncation | None:
        # The kernel keeps no minimum number of tokens.
        if self.min_tokens_to_keep != 1:
            return None
        return Truncation(TruncationKind.TOP_P, self.top_p)


def _top_p(
    logits: torch.Tensor, top_p: float, min_keep: int, first_chunk: int, descending: bool = False
) -> torch.Tensor:
    """Keep the tokens whose float32 probability reaches that of the last token of the
    nucleus (so ties in probability are kept together).

    Probabilities are :func:`probabilities`' (their bits depend only on the row's finite
    logits), taken for the descending logits of a ``topk`` chunk: probability is
    monotone in the logit, so the kept set is every logit down to the lowest one in the
    chunk whose probability reaches the threshold, provided the chunk ends below the
    threshold. The chunk grows until it does in every row (on the CPU); an accelerator,
    which must not read the tensors to decide, sorts the whole row at once. Rows already
    in ``descending`` order are their own sort: chunks are their first columns.
    """
    if not host_sync_allowed(logits):
        return _top_p_sorted(logits, top_p, min_keep, descending)
    width = logits.shape[-1]
    k = min(width, max(first_chunk, min_keep))
    total = None
    if k <= width // 8 and host_sync_allowed(logits):
        maxima = logits[:, :1] if descending else logits.amax(dim=-1, keepdim=True)
        total = row_total(shifted_exp(logits, maxima, torch.float32))
        # No token is likelier than the first (1 / total): the nucleus holds at least
        # top_p * total tokens. Far beyond a first chunk, sort at once.
        needed = max(k, int((top_p * total).nan_to_num().max()))
        k = min(width, needed if needed <= width // 32 else width)
    else:  # an accelerator, or a short row: sort it whole
        k = width
    while True:
        if k > width // 8:
            k = width
            values = logits if descending else sorted_descending(logits)
        else:
            values = logits[:, :k] if descending else top_logits(logits, k)[0]
        weights = shifted_exp(values, values[:, :1], torch.float32)
        if total is None:  # the whole sorted row: the same exact sum as the row's
            total = row_total(weights)
        probs = weights.div_(total)
        mass = probs.cumsum(dim=-1)
        # Rank r (from 1) is kept while the mass of the r - 1 likelier tokens is below
        # top_p: the last kept rank's index is the count of masses below top_p.
        last = (mass < top_p).sum(dim=-1, keepdim=True).clamp_(min(min_keep, k) - 1, k - 1)
        threshold = probs.gather(-1, last)
        if k == width or bool((~(probs[:, -1:] >= threshold)).all()):
            break
        # Every token after the chunk is at most as likely as its last one: the
        # nucleus needs at least this many; far beyond the chunk, sort at once.
        short = ((top_p - mass[:, -1]) / probs[:, -1]).nan_to_num(posinf=width)
        needed = k + int(short.clamp(min=0, max=width).max())
        k = width if needed > width // 32 else max(8 * k, needed)
    # The last logit whose probability reaches the threshold: keep it and all above.
    # (A row of -inf has NaN probabilities: it keeps its first, -inf, value.)
    last = (probs >= threshold).sum(dim=-1, keepdim=True).sub_(1).clamp_(min=0)
    lowest = values.gather(-1, last)
    return keep_only(logits, logits >= lowest)


def _top_p_sorted(
    logits: torch.Tensor,
    top_p: float,
    min_keep: int,
    descending: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`_top_p` on an accelerator, in eight operations (transformers' own takes
    eight): the row sorted whole, a softmax (there is no candidates path to agree with
    bit for bit, so no exact row sum), the running mass, and every logit down to the
    last one the nucleus needs (its ties with it included). A token within float
    rounding of the boundary may be kept on one branch and not on the other."""
    values = logits if descending else torch.sort(logits, dim=-1, descending=True).values
    mass = values.softmax(dim=-1, dtype=mass_dtype(logits)).cumsum(dim=-1)
    # The last kept rank's index is the count of masses below top_p; counting over all
    # but the last column keeps it in range when rounding leaves the mass below top_p.
    last = (mass[:, :-1] < top_p).sum(dim=-1, keepdim=True)
    if min_keep > 1:
        last = last.clamp_(min=min(min_keep, logits.shape[-1]) - 1)
    return keep_only(logits, logits >= values.gather(-1, last), out)


class MinP(FastPaths):
    """Keep tokens whose probability is at least ``min_p`` times the top token's.

    Oracle: transformers ``MinPLogitsWarper`` (identical kept sets except for a token
    within a few float32 ulps of the threshold: probabilities are rounded to the logits'
    dtype as the oracle rounds them, but their float32 values are an ``exp2`` over an
    exact row sum, whose bits depend only on the row's finite logits, where the oracle's
    softmax sums by SIMD lanes).

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
    row_local = True
    keeps_order = True

    def __init__(self, min_p: float, min_tokens_to_keep: int = 1) -> None:
        self.min_p = probability("min_p", min_p, allow_zero=True)
        self.min_tokens_to_keep = int_at_least("min_tokens_to_keep", min_tokens_to_keep, 1)

    def config(self) -> dict[str, Any]:
        return {"min_p": self.min_p, "min_tokens_to_keep": self.min_tokens_to_keep}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return _min_p(logits, self.min_p, self.min_tokens_to_keep)

    def process_into(self, logits: torch.Tensor, batch: Batch, out: torch.Tensor) -> torch.Tensor:
        return _min_p(logits, self.min_p, self.min_tokens_to_keep, out=out)

    def process_descending(self, values: torch.Tensor, batch: Batch) -> torch.Tensor:
        return _min_p(values, self.min_p, self.min_tokens_to_keep, descending=True)

    def fused_form(self) -> Truncation | None:
        # The kernel keeps no minimum number of tokens.
        if self.min_tokens_to_keep != 1:
            return None
        return Truncation(TruncationKind.MIN_P, self.min_p)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor | None:
        keep = {p.min_tokens_to_keep for p in processors}
        if len(keep) > 1:
            return None
        min_tokens_to_keep = keep.pop()
        min_ps = row_values([p.min_p for p in processors])
        fused = Truncation(TruncationKind.MIN_P, min_ps) if min_tokens_to_keep == 1 else None
        return RowwiseProcessor(
            _min_p_rows,
            row_local=True,
            keeps_order=True,
            descending=_min_p_rows_descending,
            fused=fused,
            min_ps=min_ps,
            min_tokens_to_keep=min_tokens_to_keep,
        )


def _min_p(
    logits: torch.Tensor,
    min_p: float | DeviceCopies,
    min_tokens_to_keep: int,
    descending: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows in ``descending`` order have their maximum (and top probability) first.
    ``out``: where the result goes, ``logits`` left as they are."""
    probs = probabilities(logits, maxima=logits[:, :1] if descending else None)
    top = probs[:, :1] if descending else probs.amax(dim=-1, keepdim=True)
    if isinstance(min_p, DeviceCopies):
        # Rounded to the probabilities' dtype, as a Python float factor would be.
        factors = compute_precision(min_p, logits)
        threshold = (factors * top.to(min_p.host.dtype)[:, 0]).to(probs.dtype)[:, None]
    else:
        threshold = min_p * top
    keep = probs >= threshold
    if min_tokens_to_keep > 1:
        keep = with_top_tokens(logits, keep, min_tokens_to_keep)
    return keep_only(logits, keep, out)


def _min_p_rows(
    logits: torch.Tensor, batch: Batch, min_ps: DeviceCopies, min_tokens_to_keep: int
) -> torch.Tensor:
    return _min_p(logits, min_ps, min_tokens_to_keep)


def _min_p_rows_descending(
    logits: torch.Tensor, batch: Batch, min_ps: DeviceCopies, min_tokens_to_keep: int
) -> torch.Tensor:
    return _min_p(logits, min_ps, min_tokens_to_keep, descending=True)


def with_top_tokens(
    logits: torch.Tensor, keep: torch.Tensor, min_keep: int, min_keeps: DeviceCopies | None = None
) -> torch.Tensor:
    """``keep`` plus, per row, the ``min_keeps[row]`` (all: ``min_keep``, their maximum)
    highest logits and every tie of the last."""
    if min_keep == 1:
        kth = logits.amax(dim=-1, keepdim=True)
    else:
        kth = _top_k(logits, min_keep, min_keeps).kth
    return keep.logical_or_(logits >= kth)
