"""Issue 17: the sampling chain against its floor, and TopP against transformers.

``PipelineChain``: :func:`anylogits.engines.native.chain_processors` (RepetitionPenalty,
TopK 50, TopP 0.9, MinP 0.05, Temperature) through a :class:`~anylogits.Pipeline`, over the least
work any implementation of that job must do, measured in the same run: the repetition
penalty, one ``torch.topk(x, 50)`` and one write of the survivors into the row. Target:
<= 1.5.

``TopPVsTransformers``: ``TopP(0.9)`` over transformers' ``TopPLogitsWarper(0.9)`` at
V = 128k. Targets: <= 1.0 on flat (``randn``) logits, <= 0.2 on peaked ones.
"""

from __future__ import annotations

import torch

from anylogits import Pipeline, TopP
from anylogits.core.batch import Batch
from anylogits.engines.native import chain_processors

from .backends import require_backend
from .common import VOCAB_SIZES, best_times, history, peaked_logits

HISTORY = 512


class PipelineChain:
    """chain / floor per call on the same peaked logits and history (< 1.5: the target)."""

    params = (VOCAB_SIZES, [1, 32])
    param_names = ["vocab", "batch"]
    timeout = 600

    def setup(self, vocab: int, batch: int) -> None:
        self.pipeline = Pipeline(chain_processors())
        self.penalty = chain_processors()[0]
        self.top_k = self.pipeline.processors[1].top_k  # type: ignore[attr-defined]
        self.ids = history(batch, HISTORY, vocab)
        self.batch = Batch(batch, self.ids)
        self.logits = peaked_logits(batch, vocab)

    def chain(self, logits: torch.Tensor) -> torch.Tensor:
        return self.pipeline(logits, self.ids)

    def floor(self, logits: torch.Tensor) -> torch.Tensor:
        logits = self.penalty.process(logits, self.batch)
        values, columns = torch.topk(logits, self.top_k, dim=-1)
        return logits.fill_(float("-inf")).scatter_(-1, columns, values)

    def time_chain(self, vocab: int, batch: int) -> None:
        self.chain(self.logits.clone())

    def time_floor(self, vocab: int, batch: int) -> None:
        self.floor(self.logits.clone())

    def track_chain_over_floor(self, vocab: int, batch: int) -> float:
        chain, floor = best_times((self.chain, self.logits.clone), (self.floor, self.logits.clone))
        return chain / floor

    track_chain_over_floor.unit = "ratio"


def flat_logits(batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """``randn`` logits: a nucleus of 0.9 holds most of the vocabulary."""
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed))


class TopPVsTransformers:
    """ours / transformers per call, TopP(0.9) at V = 128k (< 1: ours is faster)."""

    params = (["flat", "peaked"], [1, 32])
    param_names = ["logits", "batch"]
    timeout = 600
    vocab = 128_256

    def setup(self, logits: str, batch: int) -> None:
        require_backend("transformers")
        from transformers.generation.logits_process import TopPLogitsWarper

        self.ours = Pipeline([TopP(0.9)])
        self.theirs = TopPLogitsWarper(0.9)
        make = flat_logits if logits == "flat" else peaked_logits
        self.logits = make(batch, self.vocab)
        self.ids = torch.zeros(batch, 1, dtype=torch.int64)

    def time_ours(self, logits: str, batch: int) -> None:
        self.ours(self.logits.clone())

    def time_transformers(self, logits: str, batch: int) -> None:
        self.theirs(self.ids, self.logits)

    def track_ours_over_transformers(self, logits: str, batch: int) -> float:
        ours, theirs = best_times(
            (self.ours, self.logits.clone),
            (lambda scores: self.theirs(self.ids, scores), lambda: self.logits),
        )
        return ours / theirs

    track_ours_over_transformers.unit = "ratio"
