"""9. Per-step cost at the largest configuration the limits allow, against a typical one.

A client of a shared server chooses list sizes, string lengths and windows; the limits
(``anylogits.core.limits``) bound them. Each ratio is the per-step time of a processor
configured at its limits over the same processor configured as people use it, measured
in one run on the tiny model's 128k vocabulary, one decoding step per call (the history
grows by one token, so stateful processors advance as in generation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from anylogits import (
    DRY,
    BadWords,
    ForceSequence,
    LogitsProcessor,
    MultipleChoice,
    NoRepeatNGram,
    Pipeline,
    SequenceBias,
    StopStrings,
    TopK,
    TriggerPhrase,
)
from anylogits.core.limits import limits

from .common import best_times, peaked_logits

HISTORY = 512  # tokens before the first timed step


def _vocabulary() -> Any:
    try:
        import transformers
    except ImportError as error:
        raise NotImplementedError(f"needs transformers: {error}") from None
    from anylogits.core.vocab import hf_vocabulary
    from anylogits.testing.tiny_model import build_tiny_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(build_tiny_model())
    return tokenizer, hf_vocabulary(tokenizer)


def _ids(count: int, length: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2_000, (count, length), generator=generator).tolist()


def _dry_worst_breakers() -> list[str]:
    """Breakers whose every beginning ends some token (runs of spaces), each with its own
    rest: the most multi-token forms, each matched every step."""
    size = limits().sequence_breakers
    return [" " * 30 + f"{i:x}" * 10 for i in range(size)]


def _configurations() -> dict[
    str, tuple[Callable[[], LogitsProcessor], Callable[[], LogitsProcessor]]
]:
    """name -> (typical, at the limits)."""
    current = limits()
    text = "x" * (current.text_chars - 8)
    return {
        "dry": (lambda: DRY(0.8), lambda: DRY(0.8, sequence_breakers=_dry_worst_breakers())),
        "bad_words": (
            lambda: BadWords([" damn", " hell", [1, 2, 3]]),
            lambda: BadWords(_ids(current.items, current.sequence_tokens, 3)),
        ),
        "sequence_bias": (
            lambda: SequenceBias([[[1, 2], 2.0], [[5], -1.0]]),
            lambda: SequenceBias(
                [[ids, 1.0] for ids in _ids(current.items, current.sequence_tokens, 4)]
            ),
        ),
        "stop_strings": (
            lambda: StopStrings(["\n\n", "###"]),
            lambda: StopStrings([f"{i} {text}" for i in range(current.items)]),
        ),
        "force_sequence": (
            lambda: ForceSequence([3, 5, 7]),
            lambda: ForceSequence(_ids(1, current.sequence_tokens, 5)[0]),
        ),
        "trigger_phrase": (
            lambda: TriggerPhrase([5], [4, 6], trigger_after=True),
            lambda: TriggerPhrase(
                _ids(1, current.sequence_tokens, 6)[0],
                _ids(1, current.sequence_tokens, 7)[0],
                trigger_after=True,
            ),
        ),
        "multiple_choice": (
            lambda: MultipleChoice(["1", "2", "3", "4"]),
            lambda: MultipleChoice(list(range(current.items))),
        ),
        "no_repeat_ngram": (lambda: NoRepeatNGram(3), lambda: NoRepeatNGram(current.ngram_size)),
        "processors": (
            lambda: TopK(50),
            lambda: Pipeline([TopK(50 + i) for i in range(current.processors)]),
        ),
    }


CONFIGURATIONS = _configurations()


class _Steps:
    """Calls of one pipeline, each one decoding step further than the last."""

    def __init__(self, pipeline: Pipeline, logits: torch.Tensor, history: torch.Tensor) -> None:
        self.pipeline, self.logits, self.history = pipeline, logits, history
        self.length = HISTORY

    def argument(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.length >= self.history.shape[1]:
            self.pipeline.reset()
            self.length = HISTORY
        self.length += 1
        return self.logits.clone(), self.history[:, : self.length]

    def call(self, argument: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.pipeline(*argument)


class CostAtLimits:
    """time per step at the limits / time per step as typically configured."""

    params = (sorted(CONFIGURATIONS), [1, 8])
    param_names = ["processor", "batch"]
    timeout = 600

    def setup(self, processor: str, batch: int) -> None:
        self.tokenizer, vocab = _vocabulary()  # the vocabulary holds its tokenizer weakly
        typical, largest = CONFIGURATIONS[processor]
        logits = peaked_logits(batch, vocab.size)
        generator = torch.Generator().manual_seed(2)
        history = torch.randint(0, 2_000, (batch, HISTORY + 4_000), generator=generator)
        self.steps = {
            name: _Steps(Pipeline([make()], vocab), logits, history)
            for name, make in (("typical", typical), ("largest", largest))
        }

    def _time(self, name: str) -> None:
        steps = self.steps[name]
        steps.call(steps.argument())

    def time_typical(self, processor: str, batch: int) -> None:
        self._time("typical")

    def time_at_limits(self, processor: str, batch: int) -> None:
        self._time("largest")

    def track_at_limits_over_typical(self, processor: str, batch: int) -> float:
        typical, largest = (self.steps[name] for name in ("typical", "largest"))
        at_limits, usual = best_times(
            (largest.call, largest.argument), (typical.call, typical.argument)
        )
        return at_limits / usual

    track_at_limits_over_typical.unit = "ratio"

    def track_ms_per_step_at_limits(self, processor: str, batch: int) -> float:
        steps = self.steps["largest"]
        (seconds,) = best_times((steps.call, steps.argument))
        return seconds * 1e3

    track_ms_per_step_at_limits.unit = "ms"
