"""2. Each processor against its fastest native oracle; 3. batch scaling."""

from __future__ import annotations

from anylogits import Pipeline

from .backends import require_backend
from .catalogue import HISTORY, ONE_ROW_ORACLES, ORACLES, PROCESSORS
from .common import best_times, history, peaked_logits

PROCESSOR_NAMES = sorted(PROCESSORS)


class ProcessorVsOracle:
    """ours / oracle per call on the same logits and history (< 1: ours is faster).

    Ours is the processor called directly on a tensor it may edit; the oracle is called
    the way its backend calls it.
    """

    params = (PROCESSOR_NAMES, list(ORACLES), [32_000, 128_256, 151_936], [1, 8])
    param_names = ["processor", "oracle", "vocab", "batch"]
    timeout = 600

    def setup(self, processor: str, oracle: str, vocab: int, batch: int) -> None:
        require_backend(oracle)
        if oracle in ONE_ROW_ORACLES and batch > 1:
            raise NotImplementedError(f"{oracle}'s samplers take one row per call")
        self.ours = Pipeline([PROCESSORS[processor]()])
        self.oracle = ORACLES[oracle](processor)
        self.ids = history(batch, HISTORY, vocab)
        self.logits = peaked_logits(batch, vocab)
        self.owned = self.logits.clone()

    def time_ours(self, processor: str, oracle: str, vocab: int, batch: int) -> None:
        self.ours(self.owned, self.ids)

    def time_oracle(self, processor: str, oracle: str, vocab: int, batch: int) -> None:
        self.oracle(self.ids, self.logits)

    def track_ours_over_oracle(self, processor: str, oracle: str, vocab: int, batch: int) -> float:
        ours, native = best_times(
            (lambda owned: self.ours(owned, self.ids), self.logits.clone),
            (lambda logits: self.oracle(self.ids, logits), lambda: self.logits),
        )
        return ours / native

    track_ours_over_oracle.unit = "ratio"


IMPLEMENTATIONS = ["anylogits", *ORACLES]


class BatchScaling:
    """time(B=64) / time(B=1) at V=128k: a per-row Python loop costs ~64x.

    Target (issue #3): <= 8x for penalties and sampling-shape processors.
    """

    params = (PROCESSOR_NAMES, IMPLEMENTATIONS)
    param_names = ["processor", "implementation"]
    timeout = 600
    vocab = 128_256

    def setup(self, processor: str, implementation: str) -> None:
        if implementation == "anylogits":
            pipeline = Pipeline([PROCESSORS[processor]()])
            self.run = lambda ids, logits: pipeline(logits, ids)
            self.copies = True  # ours edits in place: give each call its own copy
        else:
            require_backend(implementation)
            if implementation in ONE_ROW_ORACLES:
                raise NotImplementedError(f"{implementation}'s samplers take one row per call")
            self.run = ORACLES[implementation](processor)
            self.copies = False
        self.inputs = {
            batch: (history(batch, HISTORY, self.vocab), peaked_logits(batch, self.vocab))
            for batch in (1, 64)
        }

    def _call(self, batch: int):
        ids, logits = self.inputs[batch]
        make = logits.clone if self.copies else (lambda: logits)
        return (lambda argument: self.run(ids, argument)), make

    def track_b64_over_b1(self, processor: str, implementation: str) -> float:
        one, sixty_four = best_times(self._call(1), self._call(64))
        return sixty_four / one

    track_b64_over_b1.unit = "ratio"
