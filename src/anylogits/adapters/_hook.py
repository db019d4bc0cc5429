"""What every backend's hook has in common: the pipeline it runs."""

from __future__ import annotations

from typing import Any

from anylogits.core.pipeline import Pipeline


class PipelineHook:
    """A backend's hook around an anylogits :class:`~anylogits.Pipeline`.

    Args:
        pipeline: the processors to run.
        tokenizer: the tokenizer the pipeline's vocabulary came from, kept alive here:
            the cached vocabulary holds it weakly, and structured processors tokenize
            forced text with it during generation.
    """

    def __init__(self, pipeline: Pipeline, tokenizer: Any = None) -> None:
        self.pipeline = pipeline
        self.tokenizer = tokenizer

    def reset(self) -> None:
        """Forget tracked sequences before reusing this hook for unrelated prompts."""
        self.pipeline.reset()

    def release(self) -> None:
        """Let go of the pipeline (its processors and every sequence's state) once the hook
        has run its last call. A hook can outlive its generation in garbage that only a
        later cycle collection frees (llama-cpp-python's sampler chains are reference
        cycles); released, it holds nothing heavy there. A released hook must not run."""
        self.pipeline = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if self.pipeline is None:
            return f"{type(self).__name__}(released)"
        return f"{type(self).__name__}({list(self.pipeline.processors)!r})"
