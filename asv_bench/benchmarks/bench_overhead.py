"""1. Adapter overhead per call: each backend's hook against the bare pipeline."""

from __future__ import annotations

from anylogits import LogitBias, Pipeline

from .backends import BACKEND_NAMES, require_backend
from .common import VOCAB_SIZES, best_times, history, peaked_logits


def _bias() -> LogitBias:
    return LogitBias({1: 1.0, 2: -1.0, 3: 0.5})


class AdapterOverhead:
    """A cheap processor (LogitBias on 3 tokens), so that the adapter's own cost shows.

    Baseline: ``Pipeline([...])(logits, ids)`` on a torch tensor it may edit, i.e. the
    processor called directly. Target (issue #3): hook <= 1.10 x baseline + 10 us at
    V=128k, B=1.
    """

    params = (BACKEND_NAMES, VOCAB_SIZES, [1, 8, 64])
    param_names = ["backend", "vocab", "batch"]
    timeout = 300

    def setup(self, backend: str, vocab: int, batch: int) -> None:
        self.harness = require_backend(backend)
        if self.harness.max_batch is not None and batch > self.harness.max_batch:
            raise NotImplementedError(f"{backend} hooks see one sequence per call")
        self.hook = self.harness.hook([_bias()])
        self.direct = Pipeline([_bias()])
        self.ids = history(batch, 64, vocab)
        self.logits = peaked_logits(batch, vocab)
        self.native = self.harness.native_arguments(self.ids, self.logits)
        self.owned = self.logits.clone()

    def time_hook(self, backend: str, vocab: int, batch: int) -> None:
        self.harness.invoke(self.hook, self.native)

    def time_direct(self, backend: str, vocab: int, batch: int) -> None:
        self.direct(self.owned, self.ids)

    def track_hook_over_direct(self, backend: str, vocab: int, batch: int) -> float:
        hook, direct = best_times(
            (lambda native: self.harness.invoke(self.hook, native), lambda: self.native),
            (lambda owned: self.direct(owned, self.ids), self.logits.clone),
        )
        self.extra_us = (hook - direct) * 1e6
        return hook / direct

    track_hook_over_direct.unit = "ratio"

    def track_overhead_us(self, backend: str, vocab: int, batch: int) -> float:
        self.track_hook_over_direct(backend, vocab, batch)
        return self.extra_us

    track_overhead_us.unit = "us"
