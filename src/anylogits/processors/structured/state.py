"""Per-sequence grammar state: cursors on shared, append-only token lines.

A tracker (or vLLM's request table) keeps one state per token prefix it has seen: every
beam, every draft position, every committed token. A matcher copy per prefix would cost
a copy and a slower consume per token and row. Instead, prefixes that extend one
another share one matcher, and a :class:`GrammarCursor` says how deep into that shared
history a state is. The matcher is moved to a cursor's depth only when a mask is
needed: forward by consuming the line's tokens, backward with the matcher's own
rollback (this is how rejected draft tokens are undone). A cursor that leaves its line
(a second beam, the token that replaced a rejected draft) starts a new line from a copy
rolled back to the branch point. Lines only ever grow, so every cursor stays valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from anylogits.processors.structured.engine import GrammarEngine


class MatcherLine:
    """One matcher and the tokens it may be moved along."""

    __slots__ = ("end", "engine", "first_row", "matcher", "position", "tokens")

    def __init__(
        self,
        engine: GrammarEngine,
        matcher: Any,
        tokens: list[int],
        first_row: torch.Tensor | None = None,
    ) -> None:
        self.engine = engine
        self.matcher = matcher
        self.tokens = tokens
        # The mask at depth 0, known from compiling: not computed again per sequence.
        self.first_row = first_row
        self.position = 0  # the matcher has consumed tokens[:position]
        # tokens[end] was refused: the prefix left the grammar there, or the matcher had
        # stopped (a finished row's padding). Either way the sequence is over.
        self.end: int | None = None

    def matcher_at(self, depth: int) -> Any | None:
        """The matcher after ``tokens[:depth]``; ``None`` once that prefix is over."""
        if self.end is not None and depth > self.end:
            return None
        engine, matcher = self.engine, self.matcher
        while self.position < depth:
            if not engine.consume(matcher, self.tokens[self.position]):
                self.end = self.position
                return None
            self.position += 1
        if self.position > depth:
            engine.rollback(matcher, self.position - depth)
            self.position = depth
        return matcher

    def branch(self, depth: int) -> MatcherLine:
        """A new line holding ``tokens[:depth]``, from a copy of this line's matcher."""
        line = MatcherLine(
            self.engine, self.engine.copy(self.matcher), self.tokens[:depth], self.first_row
        )
        line.position = self.position
        if self.end is not None and self.end < depth:
            line.end = self.end
        if line.position > depth:
            self.engine.rollback(line.matcher, line.position - depth)
            line.position = depth
        return line


class GrammarCursor:
    """An immutable grammar state: the first ``depth`` tokens of ``line``."""

    __slots__ = ("depth", "line")

    def __init__(self, line: MatcherLine, depth: int) -> None:
        self.line = line
        self.depth = depth

    @classmethod
    def start(
        cls, engine: GrammarEngine, matcher: Any, first_row: torch.Tensor | None = None
    ) -> GrammarCursor:
        """The state before any token; ``first_row``: the matcher's first mask, if known."""
        return cls(MatcherLine(engine, matcher, [], first_row), 0)

    def advance(self, token_id: int) -> GrammarCursor:
        line, depth = self.line, self.depth
        if depth == len(line.tokens):
            line.tokens.append(token_id)
        elif line.tokens[depth] != token_id:
            line = line.branch(depth)
            line.tokens.append(token_id)
        return GrammarCursor(line, depth + 1)

    def matcher(self) -> Any | None:
        """The matcher in this state (moved there); ``None`` if it left the grammar."""
        return self.line.matcher_at(self.depth)


def fill_bitmask(
    engine: GrammarEngine,
    cursors: Sequence[GrammarCursor],
    bitmask: torch.Tensor,
    ended_row: torch.Tensor,
) -> None:
    """Write each cursor's allowed tokens into its row of ``bitmask``.

    A line's matcher can be at one depth at a time, so the distinct depths of each line
    (draft positions of one request) are filled in rounds, shallowest first, every
    line's matcher in one engine call within a round. Rows in the same state are filled once
    and copied; rows whose sequence is over (a refused token, or the grammar's per-token
    budget run out) get ``ended_row`` (EOS only).
    """
    if len(cursors) == 1:
        # One sequence's step, the most frequent call.
        matcher = _matcher_or_written(cursors[0].line, cursors[0].depth, bitmask, 0, ended_row)
        if matcher is not None and engine.fill_row(matcher, bitmask, 0):
            bitmask[0] = ended_row
        return
    if len({id(cursor.line) for cursor in cursors}) == len(cursors):
        # Every row on its own line (a decoding step of several sequences): one round.
        _fill_own_lines(engine, cursors, bitmask, ended_row)
        return
    rounds = _rounds(cursors)
    copies: list[tuple[int, int]] = []
    for work in rounds:
        filled = []
        for line, depth, rows in work:
            matcher = _matcher_or_written(line, depth, bitmask, rows[0], ended_row)
            if matcher is not None:
                filled.append((matcher, rows[0]))
            if len(rows) > 1:
                copies.extend((row, rows[0]) for row in rows[1:])
        for row in engine.fill(filled, bitmask):
            bitmask[row] = ended_row
    if copies:
        targets, sources = zip(*copies, strict=True)
        bitmask[list(targets)] = bitmask[list(sources)]


def _fill_own_lines(
    engine: GrammarEngine,
    cursors: Sequence[GrammarCursor],
    bitmask: torch.Tensor,
    ended_row: torch.Tensor,
) -> None:
    """:func:`fill_bitmask` of cursors on distinct lines, in one engine call. A line one
    token behind its cursor (every row of a decoding step) consumes that token here,
    without :meth:`MatcherLine.matcher_at`'s loop: at B=32 the calls per row were ~10%
    of a step's Python."""
    consume = engine.consume
    filled = []
    for row, cursor in enumerate(cursors):
        line, depth = cursor.line, cursor.depth
        position = line.position
        if (
            position + 1 == depth
            and line.end is None
            and consume(line.matcher, line.tokens[position])
        ):
            line.position = depth
            filled.append((line.matcher, row))
            continue
        matcher = _matcher_or_written(line, depth, bitmask, row, ended_row)
        if matcher is not None:
            filled.append((matcher, row))
    for row in engine.fill(filled, bitmask):
        bitmask[row] = ended_row


def _matcher_or_written(
    line: MatcherLine, depth: int, bitmask: torch.Tensor, row: int, ended_row: torch.Tensor
) -> Any | None:
    """The matcher to fill ``row`` from, or ``None`` where the row is written here: the
    first mask, known from compiling, or ``ended_row`` once the sequence is over."""
    if depth == 0 and line.first_row is not None:
        bitmask[row] = line.first_row
        return None
    matcher = line.matcher_at(depth)
    if matcher is None:
        bitmask[row] = ended_row
    return matcher


def _rounds(cursors: Sequence[GrammarCursor]) -> list[list[tuple[MatcherLine, int, list[int]]]]:
    """Round ``k`` holds the ``k``-th shallowest depth of every line, with its rows."""
    lines: dict[int, tuple[MatcherLine, dict[int, list[int]]]] = {}
    for row, cursor in enumerate(cursors):
        entry = lines.get(id(cursor.line))
        if entry is None:
            entry = lines[id(cursor.line)] = (cursor.line, {})
        entry[1].setdefault(cursor.depth, []).append(row)
    rounds: list[list[tuple[MatcherLine, int, list[int]]]] = []
    for line, rows_by_depth in lines.values():
        for index, depth in enumerate(sorted(rows_by_depth)):
            if index == len(rounds):
                rounds.append([])
            rounds[index].append((line, depth, rows_by_depth[depth]))
    return rounds
