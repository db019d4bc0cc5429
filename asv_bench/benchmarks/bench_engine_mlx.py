"""Issue 17, end to end on MLX: per-token generation time with anylogits processors
against mlx-lm's own sampler and logits-processor parameters doing the same job.

mlx-lm's ``generate_step`` (CPU) on the tiny model's Hugging Face folder (real 128k
llama-bpe vocabulary), 64 new tokens per run from the same prompt, sampled (not greedy),
``mx.random.seed(0)`` before every run; a run is timed whole (prompt included) / 64.
Ours: ``for_mlx(*processors)`` as ``logits_processors`` and ``make_sampler(temp=1.0)``
(no truncation, no temperature), so mlx-lm only draws from our logits. Native:
``make_logits_processors`` and ``make_sampler`` with the job's parameters. Runs of both
sides are interleaved in one process, torch on one thread.

Jobs: ``chain`` (:data:`anylogits.testing.native.CHAIN`) and ``repetition`` (RepetitionPenalty 1.3
alone against ``make_logits_processors(repetition_penalty=1.3)``, both sampled at
temperature 1.0 without truncation). mlx-lm's penalty looks at the last 20 tokens
(its default ``repetition_context_size``), ours at the whole history, as the job is
written; the cost of either is a gather and a scatter of a few dozen logits.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from anylogits.testing.native import ENGINE_JOBS, mlx_parameters

from . import common
from .backends import require_backend

NEW_TOKENS = 64
PROMPT = "Once upon a time, in a land far away, there lived"


class EngineVsNativeMlx:
    """Per-token generation time, anylogits processors / mlx-lm's native parameters."""

    params = (list(ENGINE_JOBS),)
    param_names = ["job"]
    timeout = 600

    def setup(self, job: str) -> None:
        require_backend("mlx")
        import mlx.core as mx
        import mlx_lm
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        from anylogits import for_mlx
        from anylogits.testing.tiny_model import build_tiny_model

        self.model, tokenizer = mlx_lm.load(str(build_tiny_model()))
        self.prompt = mx.array(tokenizer.encode(PROMPT))
        processors, arguments = ENGINE_JOBS[job]
        native_processors, native_sampler = mlx_parameters(arguments, sample=True)
        plain_sampler = make_sampler(**mlx_parameters({}, sample=True)[1])
        sampler = make_sampler(**native_sampler)

        def run_ours(hooks: Any) -> None:
            self._generate(hooks, plain_sampler)

        def run_native(hooks: Any) -> None:
            self._generate(hooks, sampler)

        ours_seconds, native_seconds = common.best_times(
            (run_ours, lambda: for_mlx(*processors(), tokenizer=tokenizer)),
            (run_native, lambda: make_logits_processors(**native_processors)),
            repeat=15,
            max_number=2,
        )
        self.ours_ms = ours_seconds * 1e3 / NEW_TOKENS
        self.native_ms = native_seconds * 1e3 / NEW_TOKENS

    def _generate(self, hooks: Any, sampler: Any) -> None:
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        mx.random.seed(0)
        steps = generate_step(
            self.prompt, self.model, max_tokens=NEW_TOKENS, sampler=sampler, logits_processors=hooks
        )
        tokens = [token for token, _ in islice(steps, NEW_TOKENS)]
        assert len(tokens) == NEW_TOKENS

    def track_ours_over_native(self, job: str) -> float:
        return self.ours_ms / self.native_ms

    track_ours_over_native.unit = "ratio"

    def track_native_ms_per_token(self, job: str) -> float:
        return self.native_ms

    track_native_ms_per_token.unit = "ms"

    def track_ours_ms_per_token(self, job: str) -> float:
        return self.ours_ms

    track_ours_ms_per_token.unit = "ms"
