"""4. vLLM: one engine step of per-request processors, ours against vLLM's own wrapper.

vLLM's ``AdapterLogitsProcessor`` turns per-request processors into a batch-level one
with a Python loop over rows; the logits-processor peers are used that way. Ours groups
rows by their specs and runs each group in one call. Both run the *same* torch
processor, so the difference is the batching alone.

Implementations, per step at V=128k:
- ``none``: our class registered, no request has processors (must cost ~nothing);
- ``shared``: every request carries the same specs (one group);
- ``distinct``: every request has its own parameters (one group per row, worst case);
- ``vllm_adapter``: vLLM's ``AdapterLogitsProcessor`` over the same processor per row.
"""

from __future__ import annotations

from typing import Any

import torch

from anylogits import LogitBias, Pipeline, RepetitionPenalty, to_specs

from .backends import require_backend
from .common import best_times, history, peaked_logits

VOCAB = 128_256
GENERATED = 64
IMPLEMENTATIONS = ["none", "shared", "distinct", "vllm_adapter"]


def _processor(name: str, row: int, distinct: bool) -> Any:
    scale = 1.0 + (row * 0.01 if distinct else 0.0)
    if name == "logit_bias":
        return LogitBias({11: 2.0 * scale, 22: -1.5, 33: 0.5})
    return RepetitionPenalty(1.3 * scale)


def _adapter_class(name: str) -> type:
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class PerRowAnyLogits(AdapterLogitsProcessor):
        """vLLM's wrapper around one per-request callable per row."""

        def is_argmax_invariant(self) -> bool:
            return False

        def new_req_logits_processor(self, params: Any) -> Any:
            row = params.extra_args["row"]
            pipeline = Pipeline([_processor(name, row, distinct=False)])

            def process(prompt_ids: list[int], output_ids: list[int], logits: Any) -> Any:
                ids = torch.tensor([prompt_ids + output_ids])
                pipeline(logits[None], ids)  # edits the row in place, as a careful user would
                return logits

            return process

    return PerRowAnyLogits


class VllmStep:
    """Per-step seconds of ``update_state(None)`` + ``apply(logits)`` on a stable batch."""

    params = (["logit_bias", "repetition_penalty"], IMPLEMENTATIONS, [1, 32, 64])
    param_names = ["processor", "implementation", "batch"]
    timeout = 600

    def setup(self, processor: str, implementation: str, batch: int) -> None:
        require_backend("vllm")
        from vllm import SamplingParams
        from vllm.config import VllmConfig
        from vllm.v1.sample.logits_processor import BatchUpdate

        from anylogits.adapters.vllm import AnyLogitsV1Runner

        ids = history(batch, 256, VOCAB).tolist()
        self.logits = peaked_logits(batch, VOCAB)
        cls = _adapter_class(processor) if implementation == "vllm_adapter" else AnyLogitsV1Runner
        self.engine = cls(VllmConfig(), torch.device("cpu"), False)
        added = []
        for row in range(batch):
            if implementation == "none":
                extra: dict[str, Any] = {}
            elif implementation == "vllm_adapter":
                extra = {"row": row}
            else:
                specs = to_specs([_processor(processor, row, implementation == "distinct")])
                extra = {"anylogits": specs}
            prompt, output = ids[row][:-GENERATED], ids[row][-GENERATED:]
            added.append((row, SamplingParams(extra_args=extra), prompt, output))
        self.engine.update_state(BatchUpdate(batch, [], added, []))

    def step(self, logits: torch.Tensor) -> None:
        self.engine.update_state(None)
        self.engine.apply(logits)

    def time_step(self, processor: str, implementation: str, batch: int) -> None:
        self.step(self.logits)

    def track_step_us(self, processor: str, implementation: str, batch: int) -> float:
        (seconds,) = best_times((self.step, self.logits.clone))
        return seconds * 1e6

    track_step_us.unit = "us"


class VllmOverAdapter:
    """ours / vLLM's ``AdapterLogitsProcessor`` per step, same run (< 1: ours is faster)."""

    params = (["logit_bias", "repetition_penalty"], ["shared", "distinct"], [1, 32, 64])
    param_names = ["processor", "implementation", "batch"]
    timeout = 600

    def setup(self, processor: str, implementation: str, batch: int) -> None:
        self.ours = VllmStep()
        self.ours.setup(processor, implementation, batch)
        self.peer = VllmStep()
        self.peer.setup(processor, "vllm_adapter", batch)

    def track_ours_over_adapter(self, processor: str, implementation: str, batch: int) -> float:
        ours, peer = best_times(
            (self.ours.step, self.ours.logits.clone), (self.peer.step, self.peer.logits.clone)
        )
        return ours / peer

    track_ours_over_adapter.unit = "ratio"
