"""Truncation that adapts to each row's distribution: keep the tokens whose information
content is near the row's entropy (:class:`TypicalP`), above a fixed or entropy-scaled
probability floor (:class:`EpsilonCutoff`, :class:`EtaCutoff`), within ``n`` standard
deviations of the top logit (:class:`TopNSigma`), or within an entropy budget
(:class:`TopH`); set the others to ``-inf``. Oracles: transformers' warpers, and
llama.cpp's top-n-sigma sampler for :class:`TopNSigma`.

Parameters reach the row functions as per-row tensors, so a processor and the
:meth:`stack` of several processors run the same code and give bit-identical rows. They
are :class:`~anylogits.core.transfer.DeviceCopies`: made on the host once, copied to the
logits' device on the first call only (a copy per call would block the host).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.fast_paths import FastPaths, RowwiseProcessor
from anylogits.core.processor import LogitsProcessor
from anylogits.core.sync import host_sync_allowed
from anylogits.core.transfer import DeviceCopies
from anylogits.processors._checks import int_at_least, positive_float, probability
from anylogits.processors._ops import (
    compute_precision,
    keep_only,
    mass_dtype,
    probabilities,
    row_ints,
    row_values,
    top_logits,
)
from anylogits.processors.truncation import with_top_tokens

if TYPE_CHECKING:
    from typing_extensions import Self


class TypicalP(FastPaths):
    """Locally typical sampling: keep the tokens whose information ``-log p`` is closest to
    the entropy of the row, until they hold ``mass`` of the probability.

    Tokens are ranked by ``|-log p - H|``; a token is kept while the probability of the
    tokens ranked strictly before it is below ``mass`` (tokens tied in rank are kept or
    dropped together). The most likely token can be dropped, so this is not
    argmax-invariant. Exact without sorting the whole vocabulary when the typical set is
    small: ranks are taken in growing ``torch.topk`` chunks, as :class:`TopP` does.

    Oracle: transformers ``TypicalLogitsWarper``. Ranks are computed as it computes them
    (in the logits' dtype), the mass in float32 (float64 for float64 logits). Identical
    kept sets except where a tie in rank splits the ``min_tokens_to_keep`` protected
    tokens (ours protects the whole tie) or where the mass ranked before a token lies
    within float rounding of ``mass``. ``mass=1.0`` keeps every token (transformers
    rejects it; llama.cpp treats ``>= 1`` as off).

    Args:
        mass: probability mass of the typical set, in (0, 1].
        min_tokens_to_keep: always keep at least this many of the most typical tokens, >= 1.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.adaptive_truncation import TypicalP
        >>> logits = torch.tensor([[0.4, 0.2, 0.2, 0.2]]).log()
        >>> Pipeline([TypicalP(0.5)])(logits).isinf().tolist()
        [[True, False, False, False]]
    """

    spec_name = "typical_p"
    first_chunk = 64

    def __init__(self, mass: float, min_tokens_to_keep: int = 1) -> None:
        self.mass = probability("mass", mass)
        self.min_tokens_to_keep = int_at_least("min_tokens_to_keep", min_tokens_to_keep, 1)
        self._parameters = _typical_parameters([self.mass], [self.min_tokens_to_keep])

    def config(self) -> dict[str, Any]:
        return {"mass": self.mass, "min_tokens_to_keep": self.min_tokens_to_keep}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if self.mass >= 1.0:
            return logits
        return _typical_rows(logits, batch, **self._parameters, first_chunk=self.first_chunk)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor:
        if all(p.mass >= 1.0 for p in processors):
            return RowwiseProcessor(_unchanged, row_local=True)
        parameters = _typical_parameters(
            [p.mass for p in processors], [p.min_tokens_to_keep for p in processors]
        )
        return RowwiseProcessor(_typical_rows, **parameters, first_chunk=cls.first_chunk)


def _unchanged(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    return logits


def _typical_rows(
    logits: torch.Tensor,
    batch: Batch,
    targets: DeviceCopies,
    off: DeviceCopies,
    min_keep: int,
    min_keeps: DeviceCopies,
    first_chunk: int,
) -> torch.Tensor:
    # The ranking in the logits' dtype, op for op as transformers computes it: half
    # dtypes round many ranks into ties, and ties are kept together.
    log_probs = torch.log_softmax(logits, dim=-1)
    entropy = -(log_probs * log_probs.exp()).nansum(-1, keepdim=True)
    ranks = ((-log_probs) - entropy).abs()
    weights = torch.softmax(logits, dim=-1, dtype=mass_dtype(logits))
    device = logits.device
    row_targets = targets.on(device, weights.dtype)[:, None]
    row_keeps = min_keeps.on(device)
    threshold = _rank_threshold(ranks, weights, row_targets, min_keep, row_keeps, first_chunk)
    threshold = torch.where(off.on(device)[:, None], torch.inf, threshold)
    return keep_only(logits, ranks <= threshold)


def _typical_parameters(masses: list[float], min_keeps: list[int]) -> dict[str, Any]:
    """:func:`_typical_rows`' per-row parameters, made once: a row whose ``mass`` is 1
    is off and needs no mass (target 0 is reached at once, then it keeps all)."""
    host = torch.tensor(masses, dtype=torch.float64)
    off = host >= 1.0
    return {
        "targets": DeviceCopies(torch.where(off, 0.0, host)),
        "off": DeviceCopies(off),
        "min_keep": max(min_keeps),
        "min_keeps": row_ints(min_keeps),
    }


def _rank_threshold(
    ranks: torch.Tensor,
    weights: torch.Tensor,
    targets: torch.Tensor,
    min_keep: int,
    min_keeps: torch.Tensor,
    first_chunk: int,
) -> torch.Tensor:
    """``(B, 1)``: per row, the rank of the first token (in ascending rank order) at which
    the running weight reaches its target, and at least the ``min_keeps``-th smallest
    rank (``min_keep`` is their maximum). Keeping ``ranks <= threshold`` keeps whole ties.

    Ranks are taken in ascending chunks with ``torch.topk``, growing the chunk only while
    some row has not reached its target (on the CPU; an accelerator, which must not read
    the tensors to decide, sorts at once); a full sort once the chunk would pass 1/8 of
    the row.
    """
    width = ranks.shape[-1]
    k = min(width, max(first_chunk, min_keep)) if host_sync_allowed(ranks) else width
    while True:
        if k > width // 8:
            k = width
            values, order = torch.sort(ranks, dim=-1)
        else:
            values, order = torch.topk(ranks, k, dim=-1, largest=False)
        mass = weights.gather(-1, order).cumsum(dim=-1)
        if k == width or bool((mass[:, -1:] >= targets).all()):
            break
        k *= 8
    last = (mass < targets).sum(dim=-1, keepdim=True).clamp(max=k - 1)
    protected = (min_keeps.clamp(max=k) - 1).expand(values.shape[0])
    return torch.maximum(values.gather(-1, last), values.gather(-1, protected[:, None]))


def _epsilon_rows(
    logits: torch.Tensor,
    batch: Batch,
    epsilons: DeviceCopies,
    min_keep: int,
    min_keeps: DeviceCopies | None = None,
) -> torch.Tensor:
    probs = probabilities(logits)
    # Cast through the tensor, as a Python float compared with the probabilities is.
    floor = epsilons.on(probs.device, probs.dtype)[:, None]
    return keep_only(logits, with_top_tokens(logits, probs >= floor, min_keep, min_keeps))


def _eta_rows(
    logits: torch.Tensor,
    batch: Batch,
    epsilons: DeviceCopies,
    min_keep: int,
    min_keeps: DeviceCopies | None = None,
) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    entropy, _ = _categorical_entropy(logits)
    # The oracle keeps epsilon as a 0-dim float32 tensor: its square root is taken in
    # float32, and both are cast to the logits' dtype before meeting the entropy.
    epsilons32 = epsilons.on(logits.device, torch.float32)
    scaled = epsilons32.sqrt().to(logits.dtype)[:, None] * torch.exp(-entropy)
    eta = torch.minimum(epsilons32.to(logits.dtype)[:, None], scaled)
    return keep_only(logits, with_top_tokens(logits, probs >= eta, min_keep, min_keeps))


class _ProbabilityFloor(FastPaths):
    """What EpsilonCutoff and EtaCutoff share: an ``epsilon`` and ``min_tokens_to_keep``
    per row, applied by the subclass's ``_rows`` function."""

    argmax_invariant = True
    _rows: Callable[..., torch.Tensor]

    def __init__(self, epsilon: float, min_tokens_to_keep: int = 1) -> None:
        self.epsilon = probability("epsilon", epsilon)
        self.min_tokens_to_keep = int_at_least("min_tokens_to_keep", min_tokens_to_keep, 1)
        self._epsilons = row_values([self.epsilon])

    def config(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "min_tokens_to_keep": self.min_tokens_to_keep}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return type(self)._rows(logits, batch, self._epsilons, self.min_tokens_to_keep)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor:
        min_keeps = [p.min_tokens_to_keep for p in processors]
        return RowwiseProcessor(
            cls._rows,
            row_local=cls.row_local,
            keeps_order=cls.keeps_order,
            epsilons=row_values([p.epsilon for p in processors]),
            min_keep=max(min_keeps),
            min_keeps=row_ints(min_keeps),
        )


class EpsilonCutoff(_ProbabilityFloor):
    """Epsilon sampling: keep tokens whose probability is at least ``epsilon``.

    Oracle: transformers ``EpsilonLogitsWarper`` (identical kept sets except within a
    few float32 ulps of ``epsilon``; probabilities as :class:`MinP` computes them). The
    ``min_tokens_to_keep`` most likely tokens are always kept, with every token tied
    with the last of them.

    Args:
        epsilon: absolute probability floor, in (0, 1].
        min_tokens_to_keep: always keep at least this many tokens, >= 1.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.adaptive_truncation import EpsilonCutoff
        >>> logits = torch.tensor([[0.6, 0.3, 0.08, 0.02]]).log()
        >>> Pipeline([EpsilonCutoff(0.05)])(logits).isinf().tolist()
        [[False, False, False, True]]
    """

    spec_name = "epsilon_cutoff"
    row_local = True
    keeps_order = True
    _rows = staticmethod(_epsilon_rows)


class EtaCutoff(_ProbabilityFloor):
    """Eta sampling: keep tokens whose probability is at least
    ``eta = min(epsilon, sqrt(epsilon) * exp(-H))``, ``H`` the entropy of the row.

    Oracle: transformers ``EtaLogitsWarper`` (identical; like the oracle, ``epsilon`` is
    held in float32 and the entropy is computed in the logits' dtype). The
    ``min_tokens_to_keep`` most likely tokens are always kept, with ties.

    Args:
        epsilon: in (0, 1]; the paper suggests 3e-4 to 4e-3.
        min_tokens_to_keep: always keep at least this many tokens, >= 1.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.adaptive_truncation import EtaCutoff
        >>> logits = torch.tensor([[0.6, 0.3, 0.08, 0.02]]).log()
        >>> Pipeline([EtaCutoff(0.1)])(logits).isinf().tolist()
        [[False, False, True, True]]
    """

    spec_name = "eta_cutoff"
    _rows = staticmethod(_eta_rows)


def _categorical_entropy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, 1)`` entropy and ``(B, V)`` probabilities of each row, as
    ``torch.distributions.Categorical(logits=...)`` computes them (normalized logits
    clamped to the dtype's lowest value, so ``-inf`` adds zero)."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = normalized.softmax(dim=-1)
    lowest = torch.finfo(logits.dtype).min
    return -(normalized.clamp(min=lowest) * probs).sum(-1, keepdim=True), probs


class TopNSigma(FastPaths):
    """Top-nσ: keep tokens whose logit is at least ``max - n * σ``, σ the standard
    deviation of the row's finite logits.

    σ is the population standard deviation (divided by the count) over the logits that
    are not ``-inf``, computed in float32 (float64 for float64 logits), as llama.cpp's
    ``llama_sampler_init_top_n_sigma`` computes it. The set does not change under
    temperature (max and σ scale together), so it may run before or after it.

    Oracle: llama.cpp's top-n-sigma sampler. Identical kept sets except for tokens whose
    logit lies within float rounding of the threshold (llama.cpp sums sequentially in
    float32). transformers has no top-n-sigma warper. Unlike llama.cpp, ``n <= 0`` is
    rejected rather than meaning "off".

    Args:
        n: how many standard deviations below the maximum to keep, > 0.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.adaptive_truncation import TopNSigma
        >>> Pipeline([TopNSigma(1.0)])(torch.tensor([[3.0, 2.0, 0.0, -1.0]]))
        tensor([[3., 2., -inf, -inf]])
    """

    spec_name = "top_n_sigma"
    argmax_invariant = True

    def __init__(self, n: float) -> None:
        self.n = positive_float("n", n)
        self._ns = row_values([self.n])

    def config(self) -> dict[str, Any]:
        return {"n": self.n}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return _top_n_sigma_rows(logits, batch, self._ns)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor:
        return RowwiseProcessor(_top_n_sigma_rows, ns=row_values([p.n for p in processors]))


def _top_n_sigma_rows(logits: torch.Tensor, batch: Batch, ns: DeviceCopies) -> torch.Tensor:
    values = logits.to(mass_dtype(logits))
    finite = values != float("-inf")
    count = finite.sum(dim=-1, keepdim=True)
    mean = torch.where(finite, values, 0.0).sum(dim=-1, keepdim=True) / count
    deviation = torch.where(finite, values - mean, 0.0)
    sigma = (deviation.square().sum(dim=-1, keepdim=True) / count).sqrt()
    threshold = (
        values.amax(dim=-1, keepdim=True) - ns.on(values.device, values.dtype)[:, None] * sigma
    )
    return keep_only(logits, values >= threshold)


class TopH(FastPaths):
    """Top-H: among the ``considered`` (100) most likely tokens, renormalized, keep the
    likeliest ones while their cumulative entropy ``sum(-p log p)`` stays within
    ``top_h`` times the entropy of those candidates (the first is always kept).

    Oracle: transformers ``TopHLogitsWarper`` (same arithmetic, op for op). Ours keeps
    every token tied with the last kept logit, so where the oracle's top-k order cuts a
    tie (at the boundary or at the 100th candidate) we keep the whole tie; otherwise
    identical.

    Args:
        top_h: fraction of the candidates' entropy to keep, in (0, 1].

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.adaptive_truncation import TopH
        >>> logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
        >>> Pipeline([TopH(0.7)])(logits).isinf().tolist()
        [[False, False, True, True]]
    """

    spec_name = "top_h"
    argmax_invariant = True
    considered = 100  # transformers' cap on the tokens it considers

    def __init__(self, top_h: float) -> None:
        self.top_h = probability("top_h", top_h)
        self._top_hs = row_values([self.top_h])

    def config(self) -> dict[str, Any]:
        return {"top_h": self.top_h}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return _top_h_rows(logits, batch, self._top_hs, self.considered)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor:
        top_hs = row_values([p.top_h for p in processors])
        return RowwiseProcessor(_top_h_rows, top_hs=top_hs, considered=cls.considered)


def _top_h_rows(
    logits: torch.Tensor, batch: Batch, top_hs: DeviceCopies, considered: int
) -> torch.Tensor:
    top = top_logits(logits, min(considered, logits.shape[-1]))[0]
    entropy, probs = _categorical_entropy(top)
    # tau = entropy * top_h, rounded as a tensor times a Python float is.
    tau = (entropy.to(mass_dtype(top)) * compute_precision(top_hs, top)[:, None]).to(top.dtype)
    cumulative = (-probs * probs.log()).cumsum(dim=-1)
    # The running entropy never decreases, so the kept candidates are a prefix.
    kept = (cumulative <= tau).sum(dim=-1, keepdim=True).clamp(min=1)
    return keep_only(logits, logits >= top.gather(-1, kept - 1))
