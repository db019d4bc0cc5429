"""PersistentBatch: the neutral slot-indexed request batch, fed by any engine (torch only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from anylogits import LogitBias, Pipeline, RepetitionPenalty, Vocabulary, to_specs
from anylogits.core import row_groups
from anylogits.core.pending import PendingLogits
from anylogits.core.persistent_batch import PersistentBatch
from anylogits.core.row_groups import STACK_CACHE
from test_support.grammar_fills import counted_fills

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


def test_rows_named_by_slot_follow_their_requests_and_reuse_the_layout() -> None:
    slots = PersistentBatch(VOCAB)
    slots.put(0, to_specs([LogitBias({1: 5.0})]), prompt_ids=[1])
    slots.put(4, to_specs([LogitBias({2: 5.0})]), prompt_ids=[1])

    def biased(row_slots: list[int]) -> list[int | None]:
        out = slots.process(torch.zeros(3, 8), row_slots)
        return [int(row.argmax()) if row.any() else None for row in out]

    assert biased([0, 9, 4]) == [1, None, 2]
    layout = slots._layout
    assert layout is not None
    assert biased([0, 9, 4]) == [1, None, 2]
    assert slots._layout is layout, "the same slots, step after step, built their layout again"
    assert biased([4, 0, 9]) == [2, 1, None]
    assert biased([0, 9, 4]) == [1, None, 2]
    slots.remove(0)
    assert biased([0, 9, 4]) == [None, None, 2]


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


def _grammar_requests() -> tuple[Vocabulary, list[tuple[Any, str]], list[list[int]]]:
    """A vocabulary of JSON pieces, requests of three schemas and a regex with the text
    each walks, and those texts' tokens."""
    pytest.importorskip("llguidance")
    from anylogits import JSONSchema, Regex
    from anylogits.processors.structured.engine import _VocabularyTokenizer

    pieces = [*'abc0123456789{}[]":, ', "ab", '{"', '":', "12"]
    vocab = Vocabulary(
        tokens=(*(piece.encode() for piece in pieces), b"<eos>"),
        eos_token_ids=frozenset({len(pieces)}),
        special_token_ids=frozenset({len(pieces)}),
    )

    def schema(key: str, kind: str) -> JSONSchema:
        return JSONSchema(
            {"type": "object", "properties": {key: {"type": kind}}, "required": [key]}
        )

    requests = [
        (schema("a", "integer"), '{"a": 12}'),
        (schema("b", "string"), '{"b": "abc"}'),
        (Regex("[0-9]{2}c"), "12c"),
        (schema("c", "integer"), '{"c": 3}'),
    ]
    spell = _VocabularyTokenizer(vocab)
    return vocab, requests, [spell(text) for _, text in requests]


def _walk_requests(
    vocab: Vocabulary,
    requests: list[tuple[Any, str]],
    paths: list[list[int]],
    process: Callable[[PersistentBatch, torch.Tensor], torch.Tensor],
    check: Callable[[int, torch.Tensor, list[torch.Tensor]], None],
) -> None:
    """Every request in its slot, walked along its path: ``process`` runs each step,
    ``check(step, processed, alone)`` sees each row's result beside its processor's alone."""
    slots = PersistentBatch(vocab)
    feeds = [PushedTokens() for _ in requests]
    for slot, ((processor, _), feed) in enumerate(zip(requests, feeds, strict=True)):
        assert slots.put(slot, to_specs([processor]), prompt_ids=[0], output=feed)
    oracles = [Pipeline([processor], vocab) for processor, _ in requests]
    generator = torch.Generator().manual_seed(0)
    for step in range(max(map(len, paths)) + 1):
        logits = torch.randn(len(requests), vocab.size, generator=generator)
        alone = [
            oracle(logits[row : row + 1].clone(), torch.tensor([[0, *path[:step]]]))
            for row, (oracle, path) in enumerate(zip(oracles, paths, strict=True))
        ]
        check(step, process(slots, logits.clone()), alone)
        for feed, path in zip(feeds, paths, strict=True):
            if step < len(path):
                feed.pending = [path[step]]


def test_grammars_of_many_requests_fill_and_apply_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests with different schemas (one group each) stack into one call: every row
    gets the mask its own processor alone gives, from one fill of the batch."""
    vocab, requests, paths = _grammar_requests()
    fills = counted_fills(monkeypatch)

    def process(slots: PersistentBatch, logits: torch.Tensor) -> torch.Tensor:
        fills.clear()
        return slots.process(logits)

    def check(step: int, out: torch.Tensor, alone: list[torch.Tensor]) -> None:
        # The three JSON schemas in one fill, the regex in its own.
        assert sorted(fills) == [1, 3], fills
        for row, expected in enumerate(alone):
            assert torch.equal(out[row : row + 1], expected), (step, row)

    _walk_requests(vocab, requests, paths, process, check)


def test_pending_logits_are_waited_for_once_every_mask_is_filled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given logits still being computed (MLX), the masks are filled first, so they
    overlap the model's forward; each row still gets what its processor alone gives."""
    vocab, requests, paths = _grammar_requests()
    fills = counted_fills(monkeypatch)
    filled_at_wait: list[list[int]] = []

    def process(slots: PersistentBatch, logits: torch.Tensor) -> torch.Tensor:
        fills.clear()

        def wait() -> torch.Tensor:
            filled_at_wait.append(sorted(fills))
            return logits

        return slots.process(PendingLogits(len(requests), logits.device, wait), [0, 1, 2, 3])

    def check(step: int, out: torch.Tensor, alone: list[torch.Tensor]) -> None:
        assert filled_at_wait.pop() == [1, 3] == sorted(fills), step  # none after the wait
        for row, expected in enumerate(alone):
            assert torch.equal(out[row : row + 1], expected), (step, row)

    _walk_requests(vocab, requests, paths, process, check)


def test_a_group_that_fails_to_prepare_ends_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grammar whose fill raises before the logits exist ends its own request's rows,
    as it would have after; the other requests are served."""
    vocab, requests, paths = _grammar_requests()
    from anylogits.processors import structured

    original_fill = structured.fill_bitmask
    failing: list[bool] = []

    def fill(engine: Any, cursors: Any, *rest: Any) -> None:
        if failing and len(cursors) == 1:  # the regex's group
            raise RuntimeError("llguidance failed")
        original_fill(engine, cursors, *rest)

    monkeypatch.setattr(structured, "fill_bitmask", fill)
    ended = torch.full((vocab.size,), float("-inf"))
    ended[len(vocab.tokens) - 1] = 0.0

    def process(slots: PersistentBatch, logits: torch.Tensor) -> torch.Tensor:
        failing.append(True)
        try:
            return slots.process(PendingLogits(len(requests), logits.device, lambda: logits))
        finally:
            failing.clear()

    def check(step: int, out: torch.Tensor, alone: list[torch.Tensor]) -> None:
        assert torch.equal(out[2].isfinite(), ended.isfinite()), step
        for row in (0, 1, 3):
            assert torch.equal(out[row : row + 1], alone[row]), (step, row)

    _walk_requests(vocab, requests, paths, process, check)


def test_stacked_mixes_of_requests_that_left_are_not_kept() -> None:
    # Every replaced request makes a new mix of the running ones: kept with the specs'
    # pipelines, they filled that cache (a server's memory) with mixes no step runs again.
    slots = PersistentBatch(VOCAB)
    slots.put(1, to_specs([LogitBias({7: 2.0})]), prompt_ids=[1])
    for index in range(3 * STACK_CACHE):
        slots.put(0, to_specs([LogitBias({index % 7: 1.0 + index})]), prompt_ids=[1])
        out = slots.process(torch.zeros(2, 8))
        assert out[0, index % 7] == 1.0 + index and out[1, 7] == 2.0
    assert len(slots._groups._stacks) == STACK_CACHE


def test_a_stacked_mix_is_found_by_its_requests_keys_not_a_copy_of_them() -> None:
    # A layout built anew (a request joins or leaves) looks its mix up: a key joined from
    # 32 requests' specs (up to 240 KB each) cost ~2.4 ms to build and hash every time.
    slots = PersistentBatch(VOCAB)
    large = {token: 0.5 for token in range(6)}
    for slot in range(3):
        slots.put(slot, to_specs([LogitBias({**large, slot: 1.0 + slot})]), prompt_ids=[1])
    out = slots.process(torch.zeros(3, 8))
    assert [int(row.argmax()) for row in out] == [0, 1, 2]
    (key,) = slots._groups._stacks._entries
    members = sorted(slots._groups._groups._entries)
    assert len(key) == 3 and all(any(part is member for member in members) for part in key)


def test_pipelines_kept_for_specs_are_bounded_by_the_specs_size_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1,024 pipelines of the largest specs a server admits would hold gigabytes.
    monkeypatch.setattr(row_groups, "GROUP_CACHE_CHARS", 200_000)
    slots = PersistentBatch()
    large = {token: 0.5 for token in range(4_000)}  # specs of ~40k characters
    for index in range(30):
        slots.put(0, to_specs([LogitBias({**large, 4_000 + index: 1.0})]), prompt_ids=[1])
        out = slots.process(torch.zeros(1, 4_100))
        assert out[0, 4_000 + index] == 1.0
    kept = slots._groups._groups
    assert 0 < kept.weight <= 200_000 and len(kept) < 30
    # The request that runs keeps its pipeline, kept or not.
    slots.put(0, to_specs([LogitBias({**large, 1: 9.0})]), prompt_ids=[1])
    assert slots.process(torch.zeros(1, 4_100))[0, 1] == 9.0


def test_pipelines_given_per_request_are_let_go_and_never_mistaken_for_another() -> None:
    """A pipeline given for each request (mlx-lm's server) is held while its request runs
    only; the next one often takes the freed one's id, and must get its own mix."""
    slots = PersistentBatch(VOCAB)
    slots.put(1, None, pipeline=Pipeline([LogitBias({7: 2.0})]), prompt_ids=[1])
    ids = set()
    for index in range(40):
        pipeline = Pipeline([LogitBias({index % 7: 1.0})])
        ids.add(id(pipeline))
        slots.put(0, None, pipeline=pipeline, prompt_ids=[1])
        del pipeline
        out = slots.process(torch.zeros(2, 8))
        assert int(out[0].argmax()) == index % 7, index
        assert int(out[1].argmax()) == 7
        slots.remove(0)  # the request leaves: its pipeline is freed
    assert len(ids) < 40, "no pipeline took a freed one's id: the test shows nothing"
    assert len(slots._groups) <= 1 + STACK_CACHE
