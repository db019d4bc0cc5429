"""The example plugin, installed: found by name through its entry point, and correct."""

from __future__ import annotations

from importlib.metadata import entry_points

import torch
from anylogits_example_plugin import BanTwoBack

import anylogits


def greedy(processors: list[anylogits.LogitsProcessor], steps: int = 8) -> list[int]:
    """Greedy tokens from logits that always rank token 0 first, then 1, 2, 3."""
    pipeline = anylogits.Pipeline(processors)
    sequence = [9]
    for _ in range(steps):
        logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
        processed = pipeline(logits, torch.tensor([sequence]))
        sequence.append(int(processed.argmax()))
    return sequence[1:]


def test_the_entry_point_is_installed_under_the_spec_name() -> None:
    (entry_point,) = entry_points(group="anylogits.processors", name="ban_two_back")
    assert entry_point.load() is BanTwoBack


def test_a_spec_names_it_by_its_type() -> None:
    processor = anylogits.from_spec({"type": "ban_two_back"})
    assert isinstance(processor, BanTwoBack)
    assert processor.to_spec() == {"type": "ban_two_back"}


def test_the_token_two_steps_back_is_banned() -> None:
    assert greedy([]) == [0] * 8
    assert greedy([BanTwoBack()]) == [0, 0, 1, 1, 0, 0, 1, 1]


def test_advance_returns_a_new_state() -> None:
    processor = BanTwoBack()
    state = processor.init_state(torch.tensor([9]))
    assert processor.advance(state, 5) == (-1, 5)
    assert state == (-1, -1)
