"""Processors that break the contract in the ways :func:`~anylogits.testing.check_processor`
must catch: each runs, and each gives wrong results once rows fork, move or roll back."""

from __future__ import annotations

from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor


def _boost(logits: torch.Tensor, targets: list[int], bias: float) -> torch.Tensor:
    rows = torch.arange(logits.shape[0])
    logits[rows, torch.tensor(targets) % logits.shape[-1]] += bias
    return logits


class MutatesState(StatefulLogitsProcessor[list[int]]):
    """Boosts a token chosen by the generated tokens, whose list ``advance`` appends to in
    place: forked beams then share one list, and a rollback keeps rejected tokens."""

    spec_name = "testing.broken.mutates_state"

    def config(self) -> dict[str, Any]:
        return {}

    def init_state(self, prompt_ids: torch.Tensor) -> list[int]:
        return []

    def advance(self, state: list[int], token_id: int) -> list[int]:
        state.append(token_id)  # the bug: the state given is edited
        return state

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        targets = [sum(state) * 7 + len(state) for state in batch.states(self)]
        return _boost(logits, targets, 4.0)


class KeysStateByRow(LogitsProcessor):
    """Keeps a running hash of each row's tokens in a dict keyed by row index: right
    while every sequence keeps its row, wrong once rows are reordered."""

    spec_name = "testing.broken.keys_state_by_row"
    needs_sequences = True

    def __init__(self) -> None:
        self.hashes: dict[int, int] = {}  # the bug: row index -> state

    def config(self) -> dict[str, Any]:
        return {}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        last = batch.token_ids[:, -1].tolist()
        for row, token_id in enumerate(last):
            self.hashes[row] = (self.hashes.get(row, 0) * 31 + token_id + 1) % 1_000_003
        return _boost(logits, [self.hashes[row] for row in range(len(last))], 4.0)


class IgnoresRows(LogitsProcessor):
    """Boosts the token after row 0's last token in every row: reads only the first row's
    history."""

    spec_name = "testing.broken.ignores_rows"

    def config(self) -> dict[str, Any]:
        return {}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        first = int(batch.token_ids[0, -1])  # the bug: row 0 stands for every row
        return _boost(logits, [first + 1] * logits.shape[0], 4.0)


BROKEN = {
    "mutates its state in advance": MutatesState,
    "keys state by row index": KeysStateByRow,
    "ignores the batch's other rows": IgnoresRows,
}
