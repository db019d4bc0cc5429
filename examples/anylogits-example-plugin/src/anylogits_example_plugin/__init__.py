"""An example anylogits plugin: one stateful processor, declared under the
``anylogits.processors`` entry-point group in this package's ``pyproject.toml``."""

from __future__ import annotations

from typing import Any

import torch

from anylogits import Batch, StatefulLogitsProcessor
from anylogits.core.transfer import host_tensor_to

# No token yet (the first two steps of a sequence ban nothing).
NO_TOKEN = -1


class BanTwoBack(StatefulLogitsProcessor[tuple[int, int]]):
    """Forbid the token generated two steps back (``A B A`` can never happen).

    The state is the last two generated tokens, ``(two_back, one_back)``: a tuple, so
    :meth:`advance` returns a new value and never changes the one it was given (beam
    search forks a state into several sequences, speculative decoding rolls back to an
    earlier one).
    """

    spec_name = "ban_two_back"

    def config(self) -> dict[str, Any]:
        return {}

    def init_state(self, prompt_ids: torch.Tensor) -> tuple[int, int]:
        return (NO_TOKEN, NO_TOKEN)

    def advance(self, state: tuple[int, int], token_id: int) -> tuple[int, int]:
        return (state[1], token_id)

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        # Host states onto the device without blocking; fixed shapes (no nonzero), so a
        # GPU never waits for this step.
        two_back = host_tensor_to(
            [state[0] for state in batch.states(self)], logits.device, torch.int64
        )[:, None]
        columns = two_back.clamp(min=0)
        banned = torch.where(two_back != NO_TOKEN, float("-inf"), logits.gather(1, columns))
        return logits.scatter_(1, columns, banned)
