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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.pipeline.processors)!r})"
