"""Green-list watermark (Kirchenbauer et al., 2023), seeded as transformers seeds it.

The previous token(s) seed a ``torch.Generator``; ``torch.randperm(V)`` drawn from it
names the green tokens (its first ``int(V * greenlist_ratio)`` entries). A torch
generator takes one seed, so one permutation is drawn per distinct seed: that is the
only per-seed Python work, and greenlists are cached by seed (the previous token in
the default scheme, so a long generation soon draws none at all).

Permutations are always drawn on the CPU, wherever the logits live: a watermark must
be detectable on any machine, and a CUDA generator (Philox) seeded alike draws other
permutations than the CPU one (Mersenne Twister).

Oracle: transformers ``WatermarkLogitsProcessor``; its detector is
:mod:`anylogits.processors.watermark_detection`.
"""

from __future__ import annotations

from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.processor import LogitsProcessor
from anylogits.core.sync import host_sync_allowed
from anylogits.core.transfer import to_device
from anylogits.processors._checks import finite_float, int_at_least
from anylogits.processors._greenlist import (
    GREENLISTS,
    check_greenlist_ratio,
    check_hashing_key,
    check_seeding_scheme,
    greenlist_size,
    lefthash_seed,
    selfhash_seeds,
)

# transformers' selfhash scores its 40 likeliest tokens.
SELFHASH_CANDIDATES = 40


class Watermark(LogitsProcessor):
    """Add ``bias`` to the logits of a pseudo-random "green" part of the vocabulary.

    The green list is ``int(V * greenlist_ratio)`` tokens of the logits' width ``V``,
    drawn from a generator seeded by the previous token(s), so a detector that knows
    ``hashing_key`` can count green tokens in a text
    (:func:`anylogits.processors.watermark_detection.detect_watermark`).

    * ``"lefthash"``: the seed is ``hashing_key * previous_token`` (Algorithm 2 of the
      paper); ``context_width`` only sets how many tokens a sequence needs before it
      is watermarked.
    * ``"selfhash"``: each of the 40 likeliest next tokens is green when it belongs to
      the green list seeded by itself and the ``context_width - 1`` tokens before it
      (Algorithm 3); only those tokens can be raised.

    Rows holding fewer than ``context_width`` tokens are left unchanged. Put it last in
    a pipeline, as ``generate`` does with its own watermark, so that later processors
    do not undo the bias.

    Oracle: transformers ``WatermarkLogitsProcessor`` (``WatermarkingConfig``) with
    ``vocab_size`` = the logits width, on CPU: identical results, including which of
    several tokens tied at the 40th place selfhash scores. Where transformers differs:
    it skips the whole batch only when its padded width is below ``context_width``
    (and otherwise hashes padding ids), this skips each short row; its selfhash raises
    ``IndexError`` on a row with no green candidate and on vocabularies under 40
    tokens, this leaves such a row unchanged and scores every token of a small
    vocabulary; on CUDA it draws greenlists from a CUDA generator, this from the CPU one.

    Args:
        greenlist_ratio: fraction of the vocabulary that is green, in (0, 1).
        bias: added to green logits (a finite number; larger is easier to detect and
            costs more text quality).
        hashing_key: the secret key, an integer in [0, 2**63).
        seeding_scheme: ``"lefthash"`` or ``"selfhash"``.
        context_width: tokens that seed the green list, >= 1.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.watermark import Watermark
        >>> watermark = Pipeline([Watermark(greenlist_ratio=0.5, bias=4.0)])
        >>> logits = watermark(torch.zeros(2, 10), torch.tensor([[3, 7], [5, 7]]))
        >>> (logits == 4.0).sum(dim=1).tolist()  # half the vocabulary is green
        [5, 5]
        >>> torch.equal(logits[0], logits[1])  # the same previous token, the same greenlist
        True
    """

    spec_name = "watermark"

    def __init__(
        self,
        greenlist_ratio: float = 0.25,
        bias: float = 2.0,
        hashing_key: int = 15485863,
        seeding_scheme: str = "lefthash",
        context_width: int = 1,
    ) -> None:
        self.greenlist_ratio = check_greenlist_ratio(greenlist_ratio)
        self.bias = finite_float("bias", bias)
        self.hashing_key = check_hashing_key(hashing_key)
        self.seeding_scheme = check_seeding_scheme(seeding_scheme)
        self.context_width = int_at_least("context_width", context_width, 1, limit="ngram_size")

    def config(self) -> dict[str, Any]:
        return {
            "greenlist_ratio": self.greenlist_ratio,
            "bias": self.bias,
            "hashing_key": self.hashing_key,
            "seeding_scheme": self.seeding_scheme,
            "context_width": self.context_width,
        }

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        # CPU generators seeded by token values draw the greenlists, so the seeding
        # tokens go to the host; a history the engine holds there is read there.
        on_host = batch.history_on_host
        ids = batch.host_token_ids if on_host else batch.token_ids
        if ids.shape[1] < self.context_width:
            return logits
        long_enough = None
        lengths = to_device(batch.lengths, logits.device)
        if not host_sync_allowed(lengths) or lengths.min() < self.context_width:
            long_enough = (lengths >= self.context_width)[:, None]
        if self.seeding_scheme == "lefthash":
            # History on the device: its last column is the scheme's one device read.
            previous = ids[:, -1] if on_host else ids[:, -1].cpu()
            greenlists = self._lefthash_greenlists(previous, logits.shape[-1])
            columns = to_device(greenlists, logits.device)
            green = long_enough
        else:
            context = ids[:, ids.shape[1] - (self.context_width - 1) :]
            columns, green = self._selfhash_green_candidates(logits, context)
            if long_enough is not None:
                green &= long_enough
        values = logits.gather(1, columns)
        # `values + bias` rounds as transformers' `scores[b, ids] + bias` does.
        raised = values + self.bias
        if green is not None:
            raised = torch.where(green, raised, values)
        return logits.scatter_(1, columns, raised)

    def _lefthash_greenlists(self, previous: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """``(B, G)`` green ids of each row, from its previous token (on the host).

        The one host read of the lefthash scheme: each seed draws from a CPU generator.
        """
        size = greenlist_size(vocab_size, self.greenlist_ratio)
        tokens = previous.tolist()
        greenlists: dict[int, torch.Tensor] = {}
        for token in tokens:
            if token not in greenlists:
                seed = lefthash_seed(token, self.hashing_key)
                greenlists[token] = GREENLISTS.get(seed, vocab_size, size)
        return torch.stack([greenlists[token] for token in tokens])

    def _selfhash_green_candidates(
        self, logits: torch.Tensor, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(B, K)`` likeliest tokens of each row and whether each is green, on the
        logits' device; ``context``: the ``context_width - 1`` tokens before them.

        One device read: the candidates, which rows tie at the K-th place and, when the
        history is on the device, the context come to the host together (a tie costs a
        second read, see :func:`in_transformers_order`).
        """
        vocab_size = logits.shape[-1]
        placed, tied = top_candidates(logits, min(SELFHASH_CANDIDATES, vocab_size))
        k = placed.shape[1]
        context_on_device = context.device.type != "cpu"
        parts = [placed, tied[:, None].to(placed.dtype)]
        if context_on_device:
            parts.append(to_device(context, logits.device))
        read = torch.cat(parts, dim=1).cpu()
        if context_on_device:
            context = read[:, k + 1 :]
        top = read[:, :k]
        candidates = in_transformers_order(logits, top, read[:, k])
        if candidates is not top:
            placed = to_device(candidates, logits.device)
        windows = torch.cat([context[:, None, :].expand(-1, k, -1), candidates[..., None]], dim=-1)
        seeds = selfhash_seeds(windows, self.hashing_key)
        size = greenlist_size(vocab_size, self.greenlist_ratio)
        green = [
            GREENLISTS.contains(seed, token, vocab_size, size)
            for seed, token in zip(seeds, candidates.flatten().tolist(), strict=True)
        ]
        green_mask = torch.tensor(green, dtype=torch.bool).view(candidates.shape)
        return placed, to_device(green_mask, logits.device)


def likeliest_tokens(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``(B, k)`` ids of the ``k`` highest logits of each row, as transformers picks them,
    on the host: :func:`top_candidates`, then :func:`in_transformers_order`."""
    top, tied = top_candidates(logits, k)
    read = torch.cat([top, tied[:, None].to(top.dtype)], dim=1).cpu()
    return in_transformers_order(logits, read[:, :k], read[:, k])


def top_candidates(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, k)`` ids of the ``k`` highest logits of each row, and ``(B,)`` whether a tie
    straddles the k-th place in the row (where transformers' choice among the tied ids
    is its sort's: see :func:`in_transformers_order`), computed where the logits are.
    Ties at ``-inf`` are left to ``topk``: ``-inf + bias`` stays ``-inf`` whichever is
    chosen."""
    rows, width = logits.shape
    if k >= width:
        every = torch.arange(width, device=logits.device).expand(rows, -1)
        return every, torch.zeros(rows, dtype=torch.bool, device=logits.device)
    top = torch.topk(logits, k + 1, dim=-1)
    kth, next_value = top.values[:, k - 1], top.values[:, k]
    return top.indices[:, :k], (kth == next_value) & (kth != float("-inf"))


def in_transformers_order(
    logits: torch.Tensor, candidates: torch.Tensor, tied: torch.Tensor
) -> torch.Tensor:
    """``candidates`` (on the host), with the rows where ``tied`` (host) holds chosen as
    transformers chooses them: the first ``k`` of ``scores[b].sort(descending=True)``, an
    unstable sort whose order among equal values is its own, so those rows (rare) are
    sorted one by one exactly as transformers does and read back (a second read).
    Returns ``candidates`` itself when no row is tied."""
    tied_rows = [row for row, is_tied in enumerate(tied.tolist()) if is_tied]
    if not tied_rows:
        return candidates
    k = candidates.shape[1]
    orders = [logits[row].sort(dim=-1, descending=True).indices[:k] for row in tied_rows]
    resolved = candidates.clone()
    resolved[tied_rows] = torch.stack(orders).cpu()
    return resolved
