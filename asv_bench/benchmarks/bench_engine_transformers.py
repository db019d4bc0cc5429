"""Issue 17, end to end on transformers: ``model.generate`` with anylogits processors
against ``generate`` with transformers' own parameters for the same sampling job.

Models (:data:`common.MODELS`): ``tiny`` (random weights, the real 128k llama-bpe
vocabulary, a nearly free forward) from :data:`common.TINY_PROMPT`; ``real`` (SmolLM2-135M-Instruct,
49,152 tokens, float32) from :data:`common.CHAT_MESSAGE` in its chat template. Each
samples :data:`NEW_TOKENS` tokens from one prompt (and from a batch of :data:`BATCH`
copies), EOS switched off so every call makes the same number of tokens. Ours:
``for_transformers(*processors)`` with ``do_sample=True`` and transformers' own warpers
off (``top_k=None, top_p=1.0, temperature=1.0``). Native: ``do_sample=True`` with the
job's parameters. Jobs: "chain" (:data:`anylogits.engines.native.CHAIN`) and "repetition"
(``RepetitionPenalty(1.3)`` against ``repetition_penalty=1.3``). Both sides run in the
same process, interleaved, one torch thread; the best of :data:`ROUNDS` calls counts.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from anylogits.engines.native import ENGINE_JOBS, transformers_parameters

from . import common

NEW_TOKENS = 32
BATCH = 8
ROUNDS = 5


class EngineVsNativeTransformers:
    """Per-token generation time, anylogits processors over transformers' native ones."""

    params = (common.MODELS, list(ENGINE_JOBS))
    param_names = ["model", "job"]
    timeout = 900

    def setup(self, model: str, job: str) -> None:
        self.model, self.tokenizer, ids = common.transformers_model(model)
        # No EOS: every call generates exactly NEW_TOKENS tokens.
        self.model.generation_config.eos_token_id = None
        self.prompt = torch.tensor([ids])
        self.job = job

    def _per_token(self, batch: int) -> tuple[float, float]:
        """Best seconds per generated token: (ours, native)."""
        import transformers

        from anylogits import for_transformers

        processors, arguments = ENGINE_JOBS[self.job]
        native = transformers_parameters(arguments, sample=True)
        hook = for_transformers(*processors(), tokenizer=self.tokenizer)
        prompt = self.prompt.repeat(batch, 1)

        def ours() -> None:
            hook.reset()
            hooks = transformers.LogitsProcessorList([hook])
            self._generate(prompt, hooks, transformers_parameters({}, sample=True))

        def theirs() -> None:
            self._generate(prompt, None, native)

        best = [float("inf"), float("inf")]
        for call in (ours, theirs):  # warm-up: lazily built tensors, caches
            call()
        for _ in range(ROUNDS):
            for index, call in enumerate((ours, theirs)):
                start = time.perf_counter()
                call()
                best[index] = min(best[index], (time.perf_counter() - start) / NEW_TOKENS)
        return best[0], best[1]

    def _generate(self, prompt: torch.Tensor, hooks: Any, options: dict[str, Any]) -> None:
        torch.manual_seed(0)
        with torch.no_grad():
            output = self.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                pad_token_id=self.tokenizer.eos_token_id,
                max_new_tokens=NEW_TOKENS,
                logits_processor=hooks,
                **options,
            )
        if output.shape[1] != prompt.shape[1] + NEW_TOKENS:
            raise RuntimeError("generate stopped early: the per-token times are not comparable")

    def track_ours_over_native(self, model: str, job: str) -> float:
        """Target (issue 17): <= 1.0. One prompt."""
        ours, native = self._per_token(1)
        return ours / native

    track_ours_over_native.unit = "ratio"

    def track_native_ms_per_token(self, model: str, job: str) -> float:
        return self._per_token(1)[1] * 1e3

    track_native_ms_per_token.unit = "ms"

    def track_ours_over_native_batch(self, model: str, job: str) -> float:
        """The same with a batch of :data:`BATCH` prompts."""
        ours, native = self._per_token(BATCH)
        return ours / native

    track_ours_over_native_batch.unit = "ratio"
