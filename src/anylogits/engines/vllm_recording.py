"""The anylogits vLLM processor class, counting the batch updates vLLM sends it (imports
vLLM: imported only when a vLLM engine is built)."""

from __future__ import annotations

from typing import Any

from anylogits.adapters.vllm import AnyLogits


class RecordingAnyLogits(AnyLogits):
    """:class:`AnyLogits` that counts the batch updates vLLM sends (the engine runs
    in-process), so that a mixed-batch test can show that rows did move."""

    added = 0
    removed = 0
    moved = 0

    def update_state(self, batch_update: Any) -> None:
        if batch_update is not None:
            cls = type(self)
            cls.added += len(batch_update.added)
            cls.removed += len(batch_update.removed)
            cls.moved += len(batch_update.moved)
        super().update_state(batch_update)
