"""Grammar cursors on shared matcher lines: every cursor's mask equals the mask of a
fresh matcher fed its tokens, whatever the order of branching, drafts and rollbacks;
one sequence needs no copies; a rejected draft costs a copy and a rollback, not a replay
from the start."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

llguidance = pytest.importorskip("llguidance")

from anylogits import Regex, Vocabulary  # noqa: E402
from anylogits.processors.structured.engine import (  # noqa: E402
    COMPILED,
    LLGuidanceEngine,
    executor_threads,
)
from anylogits.processors.structured.mask import pack_bits  # noqa: E402
from anylogits.processors.structured.state import GrammarCursor, fill_bitmask  # noqa: E402

PIECES = [b"a", b"b", b"c", b"ab", b"bc"]
EOS = len(PIECES)
VOCAB = Vocabulary(tokens=(*PIECES, b"<eos>"), eos_token_ids=frozenset({EOS}))
PATTERN = "(ab|a)+c?"
WORDS = 1


class CountingEngine(LLGuidanceEngine):
    """llguidance, counting the calls that cost: copies, consumes and rollbacks."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = self.consumed = 0
        self.rolled_back: list[int] = []

    def copy(self, matcher: Any) -> Any:
        self.copies += 1
        return super().copy(matcher)

    def consume(self, matcher: Any, token_id: int) -> bool:
        self.consumed += 1
        return super().consume(matcher, token_id)

    def rollback(self, matcher: Any, count: int) -> None:
        self.rolled_back.append(count)
        super().rollback(matcher, count)


ENDED = pack_bits(torch.arange(32) == EOS)


def fresh_mask(engine: LLGuidanceEngine, grammar: str, tokens: list[int]) -> list[int]:
    """The oracle: a new matcher fed ``tokens`` one by one, as a sequence would be."""
    matcher = engine.start(grammar, VOCAB)
    for token in tokens:
        if not matcher.try_consume_tokens([token]):
            return ENDED.tolist()
    bitmask = torch.zeros(1, WORDS, dtype=torch.int32)
    engine.fill([(matcher, 0)], bitmask)
    return bitmask[0].tolist()


def masks(engine: LLGuidanceEngine, cursors: list[GrammarCursor]) -> list[list[int]]:
    bitmask = torch.full((len(cursors), WORDS), 7, dtype=torch.int32)
    fill_bitmask(engine, cursors, bitmask, ENDED)
    return bitmask.tolist()


ADVANCE = st.tuples(st.just("advance"), st.integers(0, 10**6), st.integers(0, EOS))
FILL = st.tuples(st.just("fill"), st.lists(st.integers(0, 10**6), min_size=1, max_size=8))


@pytest.mark.parametrize("threads", [1, 2], ids=["rows-in-this-thread", "llguidance-pool"])
@settings(max_examples=200, deadline=None)
@given(operations=st.lists(st.one_of(ADVANCE, ADVANCE, FILL), max_size=60))
def test_every_cursor_masks_like_a_fresh_matcher(
    threads: int, operations: list[tuple[Any, ...]]
) -> None:
    # A random tree of sequences (beams, drafts, tokens the grammar refuses, padding
    # after EOS) whose masks are asked for in random batches along the way, the rows
    # filled one by one here or by llguidance's pool.
    engine = LLGuidanceEngine(threads)
    grammar = Regex(PATTERN).grammar
    cursors = [GrammarCursor.start(engine, engine.start(grammar, VOCAB))]
    paths: list[list[int]] = [[]]
    for operation in [*operations, ("fill", list(range(len(operations) + 1)))]:
        if operation[0] == "advance":
            _, parent, token = operation
            parent %= len(cursors)
            cursors.append(cursors[parent].advance(token))
            paths.append([*paths[parent], token])
            continue
        rows = [pick % len(cursors) for pick in operation[1]]
        expected = [fresh_mask(engine, grammar, paths[row]) for row in rows]
        assert masks(engine, [cursors[row] for row in rows]) == expected


def test_one_sequence_is_matched_in_place_without_copies() -> None:
    engine = CountingEngine()
    cursor = GrammarCursor.start(engine, engine.start(Regex("a{20}").grammar, VOCAB))
    for _ in range(20):
        cursor = cursor.advance(0)
        masks(engine, [cursor])
    assert engine.copies == 0 and engine.rolled_back == [] and engine.consumed == 20


def test_rejected_drafts_are_rolled_back_not_replayed() -> None:
    engine = CountingEngine()
    grammar = Regex("[ab]{30}").grammar
    committed = GrammarCursor.start(engine, engine.start(grammar, VOCAB))
    for _ in range(20):
        committed = committed.advance(0)
    masks(engine, [committed])
    # Verification of three draft tokens: the rows of positions 20..23 in one call.
    drafts = [committed]
    for token in (0, 0, 0):
        drafts.append(drafts[-1].advance(token))
    engine.consumed = 0
    assert masks(engine, drafts) == [fresh_mask(engine, grammar, [0] * n) for n in range(20, 24)]
    assert engine.consumed == 3
    # One draft accepted, then the target model's token replaces the second one.
    engine.consumed = 0
    accepted = committed.advance(0).advance(1)
    assert masks(engine, [accepted]) == [fresh_mask(engine, grammar, [0] * 21 + [1])]
    assert engine.copies == 1 and engine.rolled_back == [2] and engine.consumed == 1


@pytest.mark.parametrize("threads", [1, 2], ids=["rows-in-this-thread", "llguidance-pool"])
def test_a_forbidden_token_ends_only_the_sequences_that_took_it(threads: int) -> None:
    engine = LLGuidanceEngine(threads)
    start = GrammarCursor.start(engine, engine.start(Regex("a+").grammar, VOCAB))
    good, bad = start.advance(0), start.advance(2)
    assert masks(engine, [bad.advance(0), good.advance(0)]) == [
        ENDED.tolist(),
        fresh_mask(engine, Regex("a+").grammar, [0, 0]),
    ]


def test_one_sequence_that_took_a_forbidden_token_is_ended() -> None:
    engine = LLGuidanceEngine()
    start = GrammarCursor.start(engine, engine.start(Regex("a+").grammar, VOCAB))
    assert masks(engine, [start.advance(2)]) == [ENDED.tolist()]
    assert masks(engine, [start.advance(0)]) == [fresh_mask(engine, Regex("a+").grammar, [0])]


def test_rows_are_filled_in_this_thread_where_llguidance_pool_would_have_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pool of one thread parallelizes nothing and costs a hand-off per call: it is
    # never made; with more threads, several rows go to it in one call.
    made: list[int] = []
    pool = llguidance.LLExecutor
    monkeypatch.setattr(
        llguidance, "LLExecutor", lambda threads: made.append(threads) or pool(threads)
    )
    grammar = Regex("a+b").grammar
    for threads, pools in ((1, []), (3, [3])):
        engine = LLGuidanceEngine(threads)
        start = GrammarCursor.start(engine, engine.start(grammar, VOCAB))
        first = start.advance(0)
        rows = [first, first.advance(0), first.advance(1), start.advance(1)]
        assert masks(engine, rows) == [
            fresh_mask(engine, grammar, [0]),
            fresh_mask(engine, grammar, [0, 0]),
            fresh_mask(engine, grammar, [0, 1]),
            ENDED.tolist(),
        ]
        assert made == pools
        made.clear()


@pytest.mark.parametrize(
    ("cpus", "threads"), [(1, 1), (2, 1), (3, 2), (5, 4), (16, 12), (40, 32), (128, 32)]
)
def test_the_pool_has_as_many_threads_as_llguidance_gives_its_own(
    monkeypatch: pytest.MonkeyPatch, cpus: int, threads: int
) -> None:
    # llguidance's LLExecutor(): 80% of the CPUs the process may use, 1 to 32.
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert executor_threads() == threads


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_the_pool_size_must_be_a_positive_int(threads: Any) -> None:
    with pytest.raises(ValueError, match=f"positive int or None, got {re.escape(repr(threads))}"):
        LLGuidanceEngine(threads)


@pytest.mark.parametrize(
    "bitmask",
    [
        torch.zeros(2, WORDS, dtype=torch.int64),
        torch.zeros(4, WORDS, dtype=torch.int32)[::2],
    ],
    ids=["int64", "strided"],
)
def test_llguidance_never_writes_through_a_bitmask_of_another_layout(
    bitmask: torch.Tensor,
) -> None:
    # llguidance writes a mask through the tensor's address: one row or several, a tensor
    # of another layout is refused before it writes anything.
    engine = LLGuidanceEngine()
    matchers = [engine.start(Regex("a+").grammar, VOCAB) for _ in range(2)]
    with pytest.raises(ValueError, match="contiguous int32 CPU tensor"):
        engine.fill_row(matchers[0], bitmask, 1)
    with pytest.raises(ValueError, match="contiguous int32 CPU tensor"):
        engine.fill([(matchers[0], 0), (matchers[1], 1)], bitmask)


def test_the_first_sequence_takes_the_copy_made_while_compiling() -> None:
    engine = LLGuidanceEngine()
    grammar = Regex("(ab)+c").grammar
    COMPILED.clear()
    compiled = engine._compiled(grammar, VOCAB)
    [spare] = compiled.spare
    first, second = engine.start(grammar, VOCAB), engine.start(grammar, VOCAB)
    # No copy for the first sequence: a request's first mask is one copy cheaper. The
    # template that every sequence copies is never a sequence's own.
    assert first is spare and second is not spare
    assert compiled.template not in (first, second)
    # Each its own: the first's tokens leave the second before any token.
    assert first.try_consume_tokens([3, 2]) == 2  # "ab", "c"
    assert second.try_consume_tokens([2]) == 0 and second.try_consume_tokens([3]) == 1


def test_a_row_packed_from_ids_equals_the_packed_bool_row() -> None:
    from anylogits.processors.structured.mask import pack_ids

    ids = [0, 31, 32, 63, 95, 200]  # bit 31 of a word is the int32 sign bit
    allowed = torch.zeros(96, dtype=torch.bool)
    allowed[[i for i in ids if i < 96]] = True
    assert torch.equal(pack_ids(ids, 3), pack_bits(allowed))
