"""4. Sequence-length scaling: per decoding step at L = 128 ... 16k tokens of history.

Each timed call extends every row by one new token, as decoding does, so the tracker
takes its steady-state path (parent lookup + one advance per row).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from anylogits import LogitsProcessor, NoRepeatNGram, Pipeline, RepetitionPenalty
from test_support.probes import GeneratedHashBias

from .common import best_times, history, peaked_logits

TARGETS: dict[str, Callable[[], LogitsProcessor]] = {
    "tracker": GeneratedHashBias,  # O(1) state: what remains is the tracker's own cost
    "repetition_penalty": lambda: RepetitionPenalty(1.3),
    "no_repeat_ngram": lambda: NoRepeatNGram(3),
}
LENGTHS = [128, 1_024, 4_096, 16_384]
Timed = tuple[Callable[[torch.Tensor], object], Callable[[], torch.Tensor]]
VOCAB = 32_000


class SequenceLengthScaling:
    """Per-step seconds at length L over those at L=128, same run (flat is 1.0).

    Target (issue #3): the tracker flat from L=128 to 16k; history processors at most
    linear, inside vectorized torch.
    """

    params = (sorted(TARGETS), LENGTHS, [1, 8])
    param_names = ["target", "length", "batch"]
    timeout = 600

    def setup(self, target: str, length: int, batch: int) -> None:
        self.target = target
        self.batch = batch

    def _decoder(
        self, length: int
    ) -> tuple[Callable[[torch.Tensor], object], Callable[[], torch.Tensor]]:
        pipeline = Pipeline([TARGETS[self.target]()])
        logits = peaked_logits(self.batch, VOCAB)
        state = {"ids": history(self.batch, length, VOCAB)}
        generator = torch.Generator().manual_seed(length)
        pipeline(logits.clone(), state["ids"])  # the prompt: tracked once, untimed

        def next_step() -> torch.Tensor:
            new = torch.randint(0, 2_000, (self.batch, 1), generator=generator)
            state["ids"] = torch.cat([state["ids"], new], dim=1)
            return state["ids"]

        return (lambda ids: pipeline(logits, ids)), next_step

    def track_step_over_l128(self, target: str, length: int, batch: int) -> float:
        short, long = best_times(self._decoder(128), self._decoder(length))
        return long / short

    track_step_over_l128.unit = "ratio"

    def track_step_us(self, target: str, length: int, batch: int) -> float:
        (step,) = best_times(self._decoder(length))
        return step * 1e6

    track_step_us.unit = "us"
