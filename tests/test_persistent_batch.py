"""PersistentBatch: the neutral slot-indexed request batch, fed by any engine (torch only)."""

from __future__ import annotations

import pytest
import torch

from anylogits import LogitBias, Pipeline, RepetitionPenalty, Vocabulary, to_specs
from anylogits.core.persistent_batch import PersistentBatch

VOCAB = Vocabulary(tokens=tuple(bytes([65 + i]) for i in range(8)), eos_token_ids=frozenset({7}))


class PushedTokens:
    """An engine that pushes each step's tokens, and once restarts a request."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.restart = False

    def read(self) -> tuple[bool, list[int]]:
        tokens, self.pending = self.pending, []
        restart, self.restart = self.restart, False
        return restart, tokens


def test_specs_in_any_spelling_and_tokens_from_an_output_feed() -> None:
    slots = PersistentBatch(VOCAB)
    feed = PushedTokens()
    penalty = [RepetitionPenalty(2.0)]
    assert slots.put(3, to_specs(penalty), prompt_ids=[1, 2], output=feed)
    assert not slots.put(0, [], prompt_ids=[1])
    assert not slots.put(1, None, prompt_ids=[1])
    oracle = Pipeline(penalty)
    logits = torch.randn(4, 8)

    def expected(history: list[int]) -> torch.Tensor:
        return oracle(logits[3:4].clone(), torch.tensor([history]))

    assert torch.equal(slots.process(logits.clone())[3:4], expected([1, 2]))
    feed.pending = [5, 6]
    assert torch.equal(slots.process(logits.clone())[3:4], expected([1, 2, 5, 6]))
    feed.pending, feed.restart = [4], True  # the engine dropped its outputs
    assert torch.equal(slots.process(logits.clone())[3:4], expected([1, 2, 4]))
    assert torch.equal(slots.process(logits.clone())[:3], logits[:3])


def test_committed_tokens_read_from_the_engine_per_call() -> None:
    slots = PersistentBatch(VOCAB)
    held = {2: [1, 2, 6]}  # what the engine holds per slot: prompt + committed output
    reads: list[tuple[list[int], list[int]]] = []

    def committed(slot_list: list[int], starts: list[int]) -> list[list[int]]:
        reads.append((slot_list, starts))
        return [held[slot][start:] for slot, start in zip(slot_list, starts, strict=True)]

    specs = to_specs([RepetitionPenalty(2.0), LogitBias({0: 1.0})])
    slots.put(2, specs, prompt_length=2)
    logits = torch.randn(3, 8)
    out = slots.process(logits.clone(), [5, 1, 2], committed=committed)
    oracle = Pipeline([RepetitionPenalty(2.0), LogitBias({0: 1.0})])
    assert torch.equal(out[2:], oracle(logits[2:].clone(), torch.tensor([[1, 2, 6]])))
    assert torch.equal(out[:2], logits[:2])
    assert reads == [([2], [0])]


def test_a_failed_request_ends_and_its_failure_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slots = PersistentBatch(VOCAB)
    assert slots.put(0, None, failure="request.specs[0]: top_k is missing", prompt_ids=[1])
    assert "request.specs[0]" in caplog.text
    expected = torch.full((8,), float("-inf"))
    expected[7] = 0.0
    assert torch.equal(slots.process(torch.zeros(1, 8))[0], expected)
