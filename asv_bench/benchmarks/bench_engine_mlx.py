"""Issue 17, end to end on MLX: per-token generation time with anylogits processors
against mlx-lm's own sampler and logits-processor parameters doing the same job.

mlx-lm's ``generate_step`` (CPU), 64 new tokens per run from the same prompt, sampled
(not greedy), ``mx.random.seed(0)`` before every run; a run is timed whole (prompt
included) / 64. Models (:data:`common.MODELS`): ``tiny``, the tiny model's Hugging Face
folder (random weights, the real 128k llama-bpe vocabulary), from :data:`PROMPT`;
``real``, SmolLM2-135M-Instruct's float32 folder (49,152 tokens), from
:data:`common.CHAT_MESSAGE` in its chat template. ``generate_step`` does not stop at the
end-of-text token: every run makes 64 tokens.
Ours: ``for_mlx(*processors)`` as ``logits_processors`` and ``make_sampler(temp=1.0)``
(no truncation, no temperature), so mlx-lm only draws from our logits. Native:
``make_logits_processors`` and ``make_sampler`` with the job's parameters. Runs of both
sides are interleaved in one process, torch on one thread.

Jobs: ``chain`` (:data:`anylogits.engines.native.CHAIN`) and ``repetition`` (RepetitionPenalty 1.3
alone against ``make_logits_processors(repetition_penalty=1.3)``, both sampled at
temperature 1.0 without truncation). mlx-lm's penalty looks at the last 20 tokens
(its default ``repetition_context_size``), ours at the whole history, as the job is
written; the cost of either is a gather and a scatter of a few dozen logits.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from anylogits.engines.native import ENGINE_JOBS, mlx_parameters

from . import common
from .backends import require_backend

NEW_TOKENS = 64
PROMPT = "Once upon a time, in a land far away, there lived"
# Interleaved samples of each side: mlx-lm's CPU forward of the real model takes ~0.2 s
# a token on one core, 15 samples of both sides would outlast asv's timeout.
REPEAT = {"tiny": 15, "real": 5}


Times = dict[str, tuple[float, float]]


class _Run:
    """One model loaded in mlx-lm, its prompt, and both sides of a job timed on it."""

    def __init__(self, model: str) -> None:
        import mlx.core as mx
        import mlx_lm

        folder = common.model_folder(model)
        self.model, self.tokenizer = mlx_lm.load(str(folder))
        ids = self.tokenizer.encode(PROMPT) if model == "tiny" else common.chat_ids(folder)
        self.prompt = mx.array(ids)
        self.repeat = REPEAT[model]

    def ms_per_token(self, job: str) -> tuple[float, float]:
        """Best ``(ours, native)`` milliseconds per generated token."""
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        from anylogits import for_mlx

        processors, arguments = ENGINE_JOBS[job]
        native_processors, native_sampler = mlx_parameters(arguments, sample=True)
        plain_sampler = make_sampler(**mlx_parameters({}, sample=True)[1])
        sampler = make_sampler(**native_sampler)

        def run_ours(hooks: Any) -> None:
            self._generate(hooks, plain_sampler)

        def run_native(hooks: Any) -> None:
            self._generate(hooks, sampler)

        ours_seconds, native_seconds = common.best_times(
            (run_ours, lambda: for_mlx(*processors(), tokenizer=self.tokenizer)),
            (run_native, lambda: make_logits_processors(**native_processors)),
            repeat=self.repeat,
            max_number=2,
        )
        return ours_seconds * 1e3 / NEW_TOKENS, native_seconds * 1e3 / NEW_TOKENS

    def _generate(self, hooks: Any, sampler: Any) -> None:
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        mx.random.seed(0)
        steps = generate_step(
            self.prompt, self.model, max_tokens=NEW_TOKENS, sampler=sampler, logits_processors=hooks
        )
        tokens = [token for token, _ in islice(steps, NEW_TOKENS)]
        assert len(tokens) == NEW_TOKENS


def measure(models: tuple[str, ...] = tuple(common.MODELS)) -> Times:
    """``{"model,job": (ours, native)}`` best milliseconds per generated token."""
    times = {}
    for model in models:
        run = _Run(model)
        for job in ENGINE_JOBS:
            times[f"{model},{job}"] = run.ms_per_token(job)
    return times


class EngineVsNativeMlx:
    """Per-token generation time, anylogits processors / mlx-lm's native parameters.

    The real model's forward takes mlx-lm's CPU backend ~0.2 s a token, so
    ``setup_cache`` measures every model and job once and the ``track_*`` methods read
    the result (a ``setup`` per method would measure each three times)."""

    params = (common.MODELS, list(ENGINE_JOBS))
    param_names = ["model", "job"]
    timeout = 1200

    def setup_cache(self) -> Times | None:
        try:
            require_backend("mlx")
        except NotImplementedError:
            return None  # setup skips every combination
        return measure()

    setup_cache.timeout = 3600

    def setup(self, times: Times | None, model: str, job: str) -> None:
        if times is None:
            raise NotImplementedError("mlx-lm is not installed")

    def track_ours_over_native(self, times: Times, model: str, job: str) -> float:
        ours, native = times[f"{model},{job}"]
        return ours / native

    track_ours_over_native.unit = "ratio"

    def track_native_ms_per_token(self, times: Times, model: str, job: str) -> float:
        return times[f"{model},{job}"][1]

    track_native_ms_per_token.unit = "ms"

    def track_ours_ms_per_token(self, times: Times, model: str, job: str) -> float:
        return times[f"{model},{job}"][0]

    track_ours_ms_per_token.unit = "ms"
