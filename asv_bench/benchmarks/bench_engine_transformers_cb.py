"""Issue 49, end to end on transformers' continuous batching: requests sampled with
anylogits' Temperature + TopK + TopP (``add_request(..., anylogits=...)``, the manager's
own warpers off) against the same requests with transformers' own per-request temperature,
top-k and top-p (``per_request_processors=True``), :data:`CONCURRENT` requests in flight.

Models (:data:`common.MODELS`): ``tiny`` (random weights, the 128k llama-bpe vocabulary: the
processors' cost stands out) and ``real`` (SmolLM2-135M-Instruct, 49,152 tokens). Every
request has its own parameters (three sets, round robin), EOS off so each makes exactly
:data:`NEW_TOKENS` tokens. Both sides run in this process, one torch thread, each a running
manager of its own, interleaved; the best of :data:`ROUNDS` batches counts. Reported:
seconds per generated token, ours over theirs (target <= 1.05), and theirs in ms.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from . import common

NEW_TOKENS = 24
ROUNDS = 3
CONCURRENT = [8, 32]
# Each request's own (temperature, top_k, top_p): three sets, round robin.
PER_REQUEST = [(0.7, 40, 0.9), (1.0, 20, 0.95), (0.5, 50, 0.8)]


class ContinuousBatchingVsNative:
    """Per-token time of concurrent sampled requests: anylogits' per-request processors over
    transformers' own per-request temperature / top-k / top-p."""

    params = (common.MODELS, CONCURRENT)
    param_names = ["model", "concurrent"]
    timeout = 1800

    def setup(self, model: str, concurrent: int) -> None:
        self.model, self.tokenizer, ids = common.transformers_model(model)
        from transformers import ContinuousBatchingConfig, GenerationConfig

        from anylogits.adapters.transformers_cb import for_continuous_batching

        self.prompt = ids
        self.concurrent = concurrent
        common_config = {"eos_token_id": -1, "max_new_tokens": NEW_TOKENS}  # EOS off

        def batching(per_request: bool) -> Any:
            return ContinuousBatchingConfig(
                num_blocks=max(64, concurrent * 2),
                max_batch_tokens=max(512, concurrent * len(ids)),
                per_request_processors=per_request,
            )

        # Ours: the manager samples without warpers; each request names its processors.
        ours = GenerationConfig(
            do_sample=True, temperature=1.0, top_k=None, top_p=1.0, **common_config
        )
        self.ours = self.model.init_continuous_batching(
            generation_config=ours, continuous_batching_config=batching(False)
        )
        for_continuous_batching(self.ours, tokenizer=self.tokenizer)
        # Theirs: non-neutral defaults make the warpers whose per-request versions run.
        theirs = GenerationConfig(
            do_sample=True, temperature=0.5, top_k=10, top_p=0.5, **common_config
        )
        self.theirs = self.model.init_continuous_batching(
            generation_config=theirs, continuous_batching_config=batching(True)
        )
        self.ours.start()
        self.theirs.start()

    def teardown(self, model: str, concurrent: int) -> None:
        for manager in (self.ours, self.theirs):
            manager.stop(block=True, timeout=10)

    def _requests(self, manager: Any, ours: bool) -> float:
        """Seconds per generated token of one batch of concurrent requests."""
        from anylogits import Temperature, TopK, TopP, to_specs
        from anylogits.engines.continuous_batching import results

        torch.manual_seed(0)
        start = time.perf_counter()
        ids = []
        for index in range(self.concurrent):
            temperature, top_k, top_p = PER_REQUEST[index % len(PER_REQUEST)]
            if ours:
                specs = to_specs([Temperature(temperature), TopK(top_k), TopP(top_p)])
                arguments: dict[str, Any] = {"anylogits": specs}
            else:
                arguments = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
            ids.append(manager.add_request(self.prompt, max_new_tokens=NEW_TOKENS, **arguments))
        outputs = results(manager, ids)
        seconds = time.perf_counter() - start
        made = sum(len(output.generated_tokens) for output in outputs.values())
        if made != NEW_TOKENS * self.concurrent:
            raise RuntimeError(f"{made} tokens: the per-token times are not comparable")
        return seconds / made

    def _per_token(self) -> tuple[float, float]:
        best = [float("inf"), float("inf")]
        sides = ((self.ours, True), (self.theirs, False))
        for manager, ours in sides:  # warm-up
            self._requests(manager, ours)
        for _ in range(ROUNDS):
            for index, (manager, ours) in enumerate(sides):
                best[index] = min(best[index], self._requests(manager, ours))
        return best[0], best[1]

    def track_ours_over_native(self, model: str, concurrent: int) -> float:
        """Target (issue 49): <= 1.05."""
        ours, theirs = self._per_token()
        return ours / theirs

    track_ours_over_native.unit = "ratio"

    def track_native_ms_per_token(self, model: str, concurrent: int) -> float:
        return self._per_token()[1] * 1e3

    track_native_ms_per_token.unit = "ms"
