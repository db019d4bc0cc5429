"""Detect the green-list watermark of :class:`~anylogits.processors.watermark.Watermark`.

Counts the green tokens of a text and asks how unlikely that count is for text written
without the watermark (a one-sided z-test), as transformers' ``WatermarkDetector`` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from anylogits.core.vocab import Vocabulary
from anylogits.processors._greenlist import (
    GREENLISTS,
    check_watermark_parameters,
    greenlist_size,
    lefthash_seed,
    selfhash_seeds,
)


@dataclass(frozen=True)
class WatermarkDetection:
    """The verdict on one sequence.

    Attributes:
        z_score: standard deviations by which the green count exceeds its expectation
            ``greenlist_ratio * scored_count`` for unwatermarked text.
        p_value: probability of a z-score at least this high without the watermark.
        green_count: scored tokens that were green.
        scored_count: tokens scored (each unique n-gram once with
            ``ignore_repeated_ngrams``).
        prediction: ``z_score > z_threshold``: the text carries the watermark.
    """

    z_score: float
    p_value: float
    green_count: int
    scored_count: int
    prediction: bool

    @property
    def green_fraction(self) -> float:
        return self.green_count / self.scored_count


def detect_watermark(
    tokens: str | Sequence[int] | torch.Tensor,
    *,
    vocab_size: int | None = None,
    tokenizer: Any = None,
    greenlist_ratio: float = 0.25,
    hashing_key: int = 15485863,
    seeding_scheme: str = "lefthash",
    context_width: int = 1,
    ignore_repeated_ngrams: bool = False,
    z_threshold: float = 3.0,
    bos_token_id: int | None = None,
) -> WatermarkDetection:
    """Whether ``tokens`` were generated under ``Watermark`` with these parameters.

    Scores every token after the first ``context_width`` (all of them in ``"selfhash"``
    from the ``context_width``-th on), as transformers' ``WatermarkDetector`` does; leave
    the prompt out, it dilutes the score.

    Oracle: transformers ``WatermarkDetector(...)(ids[None], return_dict=True)`` on CPU:
    identical counts, z-score and p-value.

    Args:
        tokens: token ids (a list or 1-D tensor), or text to encode with ``tokenizer``.
        vocab_size: the logits width the watermark saw (transformers:
            ``model.config.vocab_size``). Defaults to the tokenizer's length, which is
            wrong for models whose logits are padded beyond the tokenizer.
        tokenizer: a Hugging Face tokenizer or an anylogits :class:`Vocabulary`; encodes
            text (without special tokens) and supplies the defaults above.
        greenlist_ratio: as given to :class:`~anylogits.processors.watermark.Watermark`
            (its ``bias`` plays no part in detection).
        hashing_key: as given to ``Watermark``.
        seeding_scheme: as given to ``Watermark``.
        context_width: as given to ``Watermark``.
        ignore_repeated_ngrams: score each distinct n-gram (context + token) once, so
            that repeated text cannot inflate the score.
        z_threshold: the z-score above which ``prediction`` is ``True``.
        bos_token_id: dropped when it is the first id (defaults to the tokenizer's BOS).

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.watermark import Watermark
        >>> watermark = Pipeline([Watermark(bias=8.0)])
        >>> noise = torch.Generator().manual_seed(0)
        >>> ids = [1]
        >>> for _ in range(30):  # greedy decoding of random logits, watermarked
        ...     logits = watermark(torch.randn(1, 100, generator=noise), torch.tensor([ids]))
        ...     ids.append(int(logits.argmax()))
        >>> detect_watermark(ids, vocab_size=100).prediction
        True
        >>> unmarked = torch.randint(100, (31,), generator=noise)
        >>> detect_watermark(unmarked, vocab_size=100).prediction
        False
    """
    ratio, key, scheme, width = check_watermark_parameters(
        greenlist_ratio, hashing_key, seeding_scheme, context_width
    )
    if isinstance(z_threshold, bool) or not isinstance(z_threshold, (int, float)):
        raise ValueError(f"z_threshold must be a number, got {z_threshold!r}")
    ids = _token_ids(tokens, tokenizer)
    vocab_size = _vocab_size(vocab_size, tokenizer)
    if bos_token_id is None and tokenizer is not None:
        bos_token_id = getattr(tokenizer, "bos_token_id", None)
    if bos_token_id is not None and ids.numel() and int(ids[0]) == bos_token_id:
        ids = ids[1:]
    if ids.numel() - width < 1:
        raise ValueError(
            f"tokens must hold more than context_width={width} ids (after a leading BOS) "
            f"to score any, got {ids.numel()}"
        )

    selfhash = scheme == "selfhash"
    ngrams = ids.unfold(0, width + (0 if selfhash else 1), 1)
    unique, counts = torch.unique(ngrams, dim=0, return_counts=True)
    if selfhash:
        seeds = selfhash_seeds(unique, key)
    else:
        seeds = [lefthash_seed(token, key) for token in unique[:, -2].tolist()]
    size = greenlist_size(vocab_size, ratio)
    green = torch.tensor(
        [
            GREENLISTS.contains(seed, target, vocab_size, size)
            for seed, target in zip(seeds, unique[:, -1].tolist(), strict=True)
        ],
        dtype=torch.bool,
    )
    if ignore_repeated_ngrams:
        scored, green_count = len(unique), int(green.sum())
    else:
        scored, green_count = int(counts.sum()), int(counts[green].sum())

    # transformers' float64 formulas, operation for operation.
    z_score = (green_count - ratio * scored) / math.sqrt(scored * ratio * (1 - ratio))
    p_value = 0.5 * float(
        torch.special.erfc(torch.tensor(z_score / math.sqrt(2), dtype=torch.float64))
    )
    return WatermarkDetection(
        z_score=z_score,
        p_value=p_value,
        green_count=green_count,
        scored_count=scored,
        prediction=z_score > z_threshold,
    )


def _token_ids(tokens: str | Sequence[int] | torch.Tensor, tokenizer: Any) -> torch.Tensor:
    if isinstance(tokens, str):
        if tokenizer is None:
            raise ValueError("tokens is text: pass tokenizer=... to encode it")
        if isinstance(tokenizer, Vocabulary):
            if tokenizer.encode is None:
                raise ValueError(
                    "this Vocabulary cannot encode text (it has no encode function); "
                    "pass token ids or a tokenizer"
                )
            encoded = tokenizer.encode(tokens)
        else:
            encoded = tokenizer.encode(tokens, add_special_tokens=False)
        return torch.tensor(list(encoded), dtype=torch.int64)
    ids = torch.as_tensor(tokens)
    if ids.ndim != 1:
        raise ValueError(
            f"tokens must be one sequence (a list or 1-D tensor of ids), got shape "
            f"{tuple(ids.shape)}; call detect_watermark once per sequence"
        )
    if ids.numel() and (ids.is_floating_point() or ids.dtype == torch.bool):
        raise ValueError(f"tokens must be integer token ids, got dtype {ids.dtype}")
    return ids.to(device="cpu", dtype=torch.int64)


def _vocab_size(vocab_size: int | None, tokenizer: Any) -> int:
    if vocab_size is None:
        if tokenizer is None:
            raise ValueError(
                "detect_watermark needs the logits width: pass vocab_size=... "
                "(model.config.vocab_size) or tokenizer=..."
            )
        vocab_size = tokenizer.size if isinstance(tokenizer, Vocabulary) else len(tokenizer)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
    return vocab_size
