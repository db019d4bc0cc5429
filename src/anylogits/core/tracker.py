"""Map rows to sequences by their token prefix, so state survives any row shuffling.

Rows are not sequences: beam search reorders and duplicates rows every step,
speculative decoding appends draft tokens and then drops the rejected ones, engines
move rows around, and a user may resume a sequence in a later call. The tracker keys
every sequence it has seen by a hash of its whole token prefix, so it needs nothing but
the tokens a backend already passes.

Per call the hashing is a vectorized torch reduction over ``(B, L)``; the Python work is
``O(B)`` dict lookups, independent of the sequence length. Only a row whose parent
(the same tokens minus the last one) is unknown takes the slower path: one prefix-hash
cumsum over that row and a probe per distinct known length. Rows on an accelerator are
hashed there: only the hashes and the new token come back to the host, not the history.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from anylogits.core.processor import StatefulLogitsProcessor
from anylogits.core.transfer import to_device

# Weights stay below 2**23 and token ids below 2**21, so a row of up to 2**19 tokens sums
# below 2**63: exact int64 arithmetic, no overflow, no modulus.
_WEIGHT_BITS = 23
_MAX_TOKEN_ID = 1 << 21
_MAX_LENGTH = 1 << 19
# A call of at most this many tokens (a new short prompt) is hashed in Python ints.
_HASHED_IN_PYTHON = 256
_ONE_ID = struct.Struct("=q")  # one int64 token id in the host's byte order


@dataclass(slots=True)
class SequenceNode:
    """One known token prefix: its length, prompt length and processor states."""

    length: int
    prompt_length: int
    states: tuple[Any, ...]
    last_seen: int = 0


def root_node(
    processors: Sequence[StatefulLogitsProcessor[Any]], prompt_ids: torch.Tensor
) -> SequenceNode:
    """The node of a new sequence whose prompt is the 1-D ``prompt_ids``."""
    length = prompt_ids.shape[0]
    return SequenceNode(length, length, tuple(p.init_state(prompt_ids) for p in processors))


# A parent node and one more token -> its child (the parent left intact).
Child = Callable[[SequenceNode, int], SequenceNode]


def child_maker(processors: Sequence[StatefulLogitsProcessor[Any]]) -> Child:
    """The :data:`Child` function of ``processors``, chosen once for them: the tracker
    and engines that know their rows (slots) call it per row and token."""
    if len(processors) == 1 and not processors[0].mutable_state:
        # One immutable state (a grammar's cursor, a penalty's counts), the usual case:
        # no loop over the processors.
        advance = processors[0].advance

        def child(parent: SequenceNode, token_id: int) -> SequenceNode:
            state = advance(parent.states[0], token_id)
            return SequenceNode(parent.length + 1, parent.prompt_length, (state,))

        return child

    def child_of_each(parent: SequenceNode, token_id: int) -> SequenceNode:
        states = tuple(
            [
                processor.advance(
                    processor.fork(state) if processor.mutable_state else state, token_id
                )
                for processor, state in zip(processors, parent.states, strict=True)
            ]
        )
        return SequenceNode(parent.length + 1, parent.prompt_length, states)

    return child_of_each


def descendant_node(child: Child, node: SequenceNode, token_ids: Iterable[int]) -> SequenceNode:
    """The node after ``token_ids`` are appended to ``node``, one at a time, by
    ``child`` (a pipeline's :attr:`~anylogits.core.pipeline.Pipeline.child`); ``node``
    is left intact."""
    for token_id in token_ids:
        node = child(node, token_id)
    return node


def _token_bytes(ids: torch.Tensor) -> bytes:
    """The row-major bytes of the int64 CPU ``ids``: one copy, which the next call
    compares with its own prefix by ``memcmp``. At one row this is a quarter of what
    ``torch.equal`` on a slice, ``select().tolist()`` and ``clone()`` cost (~2 against
    ~10 us per token, dispatch overhead), and as fast at 4k tokens."""
    count = ids.numel()
    if not count:
        return b""
    if not ids.is_contiguous():  # contiguous() dispatches even when it returns ids
        ids = ids.contiguous()
    return ctypes.string_at(ids.data_ptr(), 8 * count)


def _rows_extend(tokens: bytes, last_tokens: bytes, batch: int, previous: int) -> bool:
    """Whether each of ``batch`` rows of ``tokens`` (``previous + 1`` tokens each) starts
    with the same row of ``last_tokens`` (``previous`` tokens each)."""
    width, kept = 8 * (previous + 1), 8 * previous
    return all(
        tokens[row * width : row * width + kept] == last_tokens[row * kept : (row + 1) * kept]
        for row in range(batch)
    )


def _check_width(width: int) -> None:
    if width == 0:
        raise ValueError("token_ids has no columns: a sequence needs at least one token")


def _check_token_range(low: int, high: int) -> None:
    """Raise unless the smallest and largest ids of a call can be hashed exactly."""
    if low < 0 or high >= _MAX_TOKEN_ID:
        raise ValueError(f"token ids must lie in [0, {_MAX_TOKEN_ID}) to be tracked")


class _HashWeights:
    """The two rows of position weights of one seed, drawn on demand and shared by every
    tracker of that seed: a tracker is built per hook, and drawing and listing the first
    columns would cost ~0.1 ms of every request's first mask. Columns are only ever
    appended, so the hashes a tracker has stored stay valid when another grows them."""

    def __init__(self, seed: int) -> None:
        self._generator = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()
        self.tensor = torch.empty(2, 0, dtype=torch.int64)
        self.columns: list[tuple[int, int]] = []  # the same, as Python ints
        self._on_devices: dict[torch.device, torch.Tensor] = {}

    def at_least(self, width: int) -> torch.Tensor:
        """The weights, with at least ``width`` (at most ``_MAX_LENGTH``) columns."""
        with self._lock:
            known = self.tensor.shape[1]
            if known < width:
                # Never past _MAX_LENGTH: a wider call must come to
                # SequenceTracker._position_weights, and be refused there.
                size = min(max(width, 2 * known, 256), _MAX_LENGTH)
                extra = torch.randint(
                    0, 1 << _WEIGHT_BITS, (2, size - known), generator=self._generator
                )
                # Columns first: a reader that finds too few takes the lock and waits.
                self.columns = self.columns + [tuple(column) for column in extra.T.tolist()]
                self.tensor = torch.cat([self.tensor, extra], 1)
            return self.tensor

    def on_device(self, width: int, device: torch.device) -> torch.Tensor:
        """The first ``width`` columns on ``device``: a constant there, copied again
        (without blocking) only when the weights grow, geometrically."""
        copy = self._on_devices.get(device)
        if copy is None or copy.shape[1] < width:
            host = self.at_least(width)
            with self._lock:
                copy = self._on_devices[device] = to_device(host, device)
        return copy[:, :width]


_HASH_WEIGHTS: dict[int, _HashWeights] = {}
_HASH_WEIGHTS_LOCK = threading.Lock()


def _hash_weights(seed: int) -> _HashWeights:
    with _HASH_WEIGHTS_LOCK:
        weights = _HASH_WEIGHTS.get(seed)
        if weights is None:
            weights = _HASH_WEIGHTS[seed] = _HashWeights(seed)
        return weights


class SequenceTracker:
    """Find, for each row, the sequence state its token prefix implies.

    Args:
        processors: the stateful processors whose states are tracked, in order.
        max_idle_calls: a prefix not seen for this many calls is freed. It bounds memory
            (finished sequences and dead beams disappear) and sets how far back a
            rollback can reach.
        seed: seed of the hash weights.
    """

    def __init__(
        self,
        processors: Sequence[StatefulLogitsProcessor[Any]],
        *,
        max_idle_calls: int = 64,
        seed: int = 0x5EED,
    ) -> None:
        if max_idle_calls < 1:
            raise ValueError(f"max_idle_calls must be >= 1, got {max_idle_calls}")
        self.processors = tuple(processors)
        self.max_idle_calls = max_idle_calls
        self._child = child_maker(self.processors)
        self._weights = _hash_weights(seed)
        self._nodes: dict[tuple[int, int, int], SequenceNode] = {}
        self._length_counts: Counter[int] = Counter()
        self._touched: deque[tuple[int, list[tuple[int, int, int]]]] = deque()
        self._clock = 0
        # The previous full-width call: its tokens (our own copy), hashes and nodes. A
        # call that only appends one column to it is recognised by one comparison pass,
        # with no hashing at all.
        self._last_tokens = b""
        self._last_width = 0
        self._last_hashes: list[tuple[int, int]] = []
        self._last_nodes: list[SequenceNode] = []
        # The nodes of calls that only extended the one before, not yet in `_nodes`:
        # (clock, width, hashes, nodes) per call. While every call extends the last, as
        # in decoding, no row is keyed or indexed, and an expired call is dropped whole;
        # the first call that needs a lookup (a beam reordered, a rollback) registers
        # them all first.
        self._unregistered: deque[tuple[int, int, list[tuple[int, int]], list[SequenceNode]]] = (
            deque()
        )

    def __len__(self) -> int:
        self._register()
        return len(self._nodes)

    def reset(self) -> None:
        """Forget every sequence."""
        self._nodes.clear()
        self._length_counts.clear()
        self._touched.clear()
        self._unregistered.clear()
        self._last_width = 0
        self._last_nodes = []

    def locate(
        self, token_ids: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> list[SequenceNode]:
        """The node of each row of the right-aligned ``(B, L)`` history.

        Args:
            token_ids: int tensor ``(B, L)``; row ``b`` is its last ``lengths[b]`` columns.
            lengths: ``(B,)`` real tokens per row; ``None`` when every row fills ``L``.
        """
        self._clock += 1
        if not token_ids.is_cpu and lengths is None:
            return self._locate_on_device(token_ids)
        ids = token_ids
        if ids.dtype is not torch.int64 or not ids.is_cpu:
            ids = ids.to(device="cpu", dtype=torch.int64)
        if lengths is None:
            extended = self._extend_last_call(ids)
            if extended is not None:
                self._expire()
                return extended
        self._register()
        batch, width = ids.shape
        _check_width(width)
        weights = self._position_weights(width)
        if lengths is None:
            row_lengths = [width] * batch
            # Broadcast over the rows; made when hashed in torch or replayed (a new
            # prompt's first call needs neither).
            row_weights = None
        else:
            lengths = lengths.to(device="cpu", dtype=torch.int64)
            row_lengths = lengths.tolist()
            positions = torch.arange(width) - (width - lengths)[:, None]
            row_weights = weights[:, positions.clamp(min=0)] * (positions >= 0)
        if lengths is None and batch * width <= _HASHED_IN_PYTHON:
            full_keys, parent_keys, last_tokens = self._python_hashes(ids)
        else:
            if batch:
                low, high = torch.aminmax(ids)
                _check_token_range(int(low), int(high))
            if row_weights is None:
                row_weights = weights[:, :width].unsqueeze(1)
            # Two independent hashes, each one exact int64 dot product per row.
            full = torch.stack([(ids * row_weights[0]).sum(1), (ids * row_weights[1]).sum(1)], 1)
            last = ids[:, -1]
            parent = full - last[:, None] * row_weights[:, :, -1].T
            full_keys = full.tolist()
            parent_keys = parent.tolist()
            last_tokens = last.tolist()

        nodes = self._nodes_of(
            row_lengths,
            full_keys,
            parent_keys,
            last_tokens,
            lambda row, length: (
                ids[row, width - length :],
                lambda: (
                    weights[:, width - length : width]
                    if row_weights is None
                    else row_weights[:, min(row, row_weights.shape[1] - 1), -length:]
                ),
            ),
        )
        if lengths is None:
            hashes = [(key[0], key[1]) for key in full_keys]
            self._remember(_token_bytes(ids), width, hashes, nodes)
        else:
            self._last_width = 0
        self._expire()
        return nodes

    def _nodes_of(
        self,
        row_lengths: Sequence[int],
        full_keys: Sequence[Sequence[int]],
        parent_keys: Sequence[Sequence[int]],
        last_tokens: Sequence[int],
        row_of: Callable[[int, int], tuple[torch.Tensor, Callable[[], torch.Tensor]]],
    ) -> list[SequenceNode]:
        """Each row's node: known, the child of a known parent, or replayed from the
        longest known prefix of the row's host ids and weights (``row_of(row, length)``)."""
        nodes: list[SequenceNode] = []
        for row, length in enumerate(row_lengths):
            if length == 0:
                raise ValueError(f"row {row} has no tokens: a sequence needs at least one")
            (first, second), (parent_first, parent_second) = full_keys[row], parent_keys[row]
            key = (length, first, second)
            node = self._nodes.get(key)
            if node is None:
                parent_key = (length - 1, parent_first, parent_second)
                ancestor = self._nodes.get(parent_key)
                if ancestor is not None:
                    self._touch(parent_key, ancestor)
                    node = self._child(ancestor, last_tokens[row])
                else:
                    node = self._from_longest_known_prefix(*row_of(row, length))
            self._touch(key, node)
            nodes.append(node)
        return nodes

    def _locate_on_device(self, token_ids: torch.Tensor) -> list[SequenceNode]:
        """:meth:`locate` for full rows on an accelerator (transformers' ``input_ids``):
        each row is hashed there (the same exact int64 dot products as on the host) and
        only ``(B, 5)`` comes back (two hashes, the last token, the smallest and largest
        id): O(B) a step, not the O(B·L) history. The history itself is read only on a
        step where a row's parent is unknown (a new prompt, accepted draft tokens, a
        resumed sequence)."""
        batch, width = token_ids.shape
        _check_width(width)
        self._position_weights(width)
        self._register()
        ids = token_ids if token_ids.dtype is torch.int64 else token_ids.to(torch.int64)
        weights = self._weights.on_device(width, ids.device)
        hashes = (ids.unsqueeze(1) * weights).sum(2)
        low, high = ids.aminmax(dim=1)
        rows = torch.cat([hashes, ids[:, -1:], low[:, None], high[:, None]], 1).tolist()
        if rows:
            _check_token_range(min(row[3] for row in rows), max(row[4] for row in rows))
        first_weight, second_weight = self._column(width - 1)
        full_keys = [row[:2] for row in rows]
        parent_keys = [
            (first - last * first_weight, second - last * second_weight)
            for first, second, last, _, _ in rows
        ]
        host_ids: list[torch.Tensor] = []

        def row_of(row: int, length: int) -> tuple[torch.Tensor, Callable[[], torch.Tensor]]:
            if not host_ids:
                host_ids.append(ids.cpu())
            return host_ids[0][row], lambda: self._weights.at_least(width)[:, :width]

        nodes = self._nodes_of(
            [width] * batch, full_keys, parent_keys, [row[2] for row in rows], row_of
        )
        self._last_width = 0  # the host fast path compares host bytes this call has not
        self._expire()
        return nodes

    def _extend_last_call(self, ids: torch.Tensor) -> list[SequenceNode] | None:
        """The nodes of a call whose every row is the same row of the last call plus one
        token (``None`` if it is not such a call): O(B) work, in Python ints (a handful
        of tokens; torch ops cost more than they save here), and the new nodes left
        unregistered (:meth:`_register`). This is the per-token cost of every tracked
        call, so it is written out in one function."""
        batch, width = ids.shape
        previous = self._last_width
        if width != previous + 1 or previous == 0 or batch != len(self._last_nodes):
            return None
        tokens = _token_bytes(ids)
        if batch == 1:
            return self._extend_one_row(tokens, width)
        if not _rows_extend(tokens, self._last_tokens, batch, previous):
            return None
        last = memoryview(tokens).cast("q")[previous::width].tolist()
        _check_token_range(min(last), max(last))
        first_weight, second_weight = self._column(width - 1)
        parents = self._last_nodes
        hashes = [
            (first + token_id * first_weight, second + token_id * second_weight)
            for (first, second), token_id in zip(self._last_hashes, last, strict=True)
        ]
        if width in self._length_counts:
            # A prefix this long is registered (a rollback, then the same tokens again):
            # a row that reaches it again takes its node.
            known = self._nodes
            nodes = [
                known.get((width, first, second)) or self._child(parent, token_id)
                for parent, (first, second), token_id in zip(parents, hashes, last, strict=True)
            ]
        else:
            nodes = list(map(self._child, parents, last))
        self._unregistered.append((self._clock, width, hashes, nodes))
        self._remember(tokens, width, hashes, nodes)
        return nodes

    def _extend_one_row(self, tokens: bytes, width: int) -> list[SequenceNode] | None:
        """:meth:`_extend_last_call` for one row (one sequence's decoding step, the most
        frequent call): the same work without the per-row lists."""
        if not tokens.startswith(self._last_tokens):
            return None
        (token_id,) = _ONE_ID.unpack_from(tokens, 8 * width - 8)
        _check_token_range(token_id, token_id)
        first_weight, second_weight = self._column(width - 1)
        ((first, second),) = self._last_hashes
        first += token_id * first_weight
        second += token_id * second_weight
        node = None
        if width in self._length_counts:  # a rollback, then the same tokens again
            node = self._nodes.get((width, first, second))
        if node is None:
            node = self._child(self._last_nodes[0], token_id)
        hashes, nodes = [(first, second)], [node]
        self._unregistered.append((self._clock, width, hashes, nodes))
        self._remember(tokens, width, hashes, nodes)
        return nodes

    def _column(self, index: int) -> tuple[int, int]:
        """The two weights of position ``index``, drawn if not yet."""
        columns = self._weights.columns
        if index >= len(columns):
            self._position_weights(index + 1)
            columns = self._weights.columns
        return columns[index]

    def _register(self) -> None:
        """Key the nodes of the calls :meth:`_extend_last_call` left unregistered, each
        as seen at its own call (they expire as if registered then)."""
        if not self._unregistered:
            return
        known, counts, touched = self._nodes, self._length_counts, self._touched
        for clock, width, hashes, nodes in self._unregistered:
            # Later than every call touched so far: the calls since the last lookup.
            keys: list[tuple[int, int, int]] = []
            touched.append((clock, keys))
            for (first, second), node in zip(hashes, nodes, strict=True):
                key = (width, first, second)
                if key not in known:
                    known[key] = node
                    counts[width] += 1
                node.last_seen = clock
                keys.append(key)
        self._unregistered.clear()

    def _remember(
        self, tokens: bytes, width: int, hashes: list[tuple[int, int]], nodes: list[SequenceNode]
    ) -> None:
        # A copy (bytes): the caller may reuse its buffer (llama-cpp-python slices a
        # growing one).
        self._last_tokens = tokens
        self._last_width = width
        self._last_hashes = hashes
        self._last_nodes = nodes

    def _python_hashes(self, ids: torch.Tensor) -> tuple[list[Any], list[Any], list[int]]:
        """The hashes of a few full rows, of each row's parent and the last tokens, in
        Python ints (exact, so equal to the int64 ones): one host read instead of ten
        torch ops, a quarter of a new prompt's first call."""
        rows = ids.tolist()
        columns = self._weights.columns
        last_first, last_second = columns[len(rows[0]) - 1] if rows else (0, 0)
        full, parent, last = [], [], []
        for row in rows:
            _check_token_range(min(row), max(row))
            first = second = 0
            # At least as many columns as the row has tokens: zip stops at the row.
            for token_id, (first_weight, second_weight) in zip(row, columns, strict=False):
                first += token_id * first_weight
                second += token_id * second_weight
            token_id = row[-1]
            full.append([first, second])
            parent.append([first - token_id * last_first, second - token_id * last_second])
            last.append(token_id)
        return full, parent, last

    def _from_longest_known_prefix(
        self, row_ids: torch.Tensor, row_weights: Callable[[], torch.Tensor]
    ) -> SequenceNode:
        """Replay from the longest known prefix (draft tokens, resume) or start afresh;
        ``row_weights()``: the ``(2, length)`` weights of the row's positions."""
        length = row_ids.shape[0]
        if not any(known < length for known in self._length_counts):
            return root_node(self.processors, row_ids)  # a new prompt: nothing to hash
        prefix_hashes = (row_ids * row_weights()).cumsum(1).T.tolist()
        start: SequenceNode | None = None
        for known_length in sorted(self._length_counts, reverse=True):
            if known_length >= length:
                continue
            key = (known_length, *prefix_hashes[known_length - 1])
            start = self._nodes.get(key)
            if start is not None:
                self._touch(key, start)
                break
        if start is None:
            return root_node(self.processors, row_ids)
        node = start
        tokens = row_ids[start.length :].tolist()
        for offset, token_id in enumerate(tokens[:-1]):
            node = self._child(node, token_id)
            # Intermediate prefixes are stored so that a rollback onto them is a lookup.
            self._touch((node.length, *prefix_hashes[start.length + offset]), node)
        return self._child(node, tokens[-1])

    def _position_weights(self, width: int) -> torch.Tensor:
        if width > _MAX_LENGTH:
            raise ValueError(f"sequences longer than {_MAX_LENGTH} tokens cannot be tracked")
        return self._weights.at_least(width)

    def _touch(self, key: tuple[int, int, int], node: SequenceNode) -> None:
        if key not in self._nodes:
            self._length_counts[key[0]] += 1
            self._nodes[key] = node
        node.last_seen = self._clock
        touched = self._touched
        # Only calls that touch a key have an entry (plain decoding steps touch none).
        if not touched or touched[-1][0] != self._clock:
            touched.append((self._clock, []))
        touched[-1][1].append(key)

    def _expire(self) -> None:
        horizon = self._clock - self.max_idle_calls
        unregistered = self._unregistered
        while unregistered and unregistered[0][0] <= horizon:
            unregistered.popleft()  # never keyed: nothing to delete
        while self._touched and self._touched[0][0] <= horizon:
            _, keys = self._touched.popleft()
            for key in keys:
                node = self._nodes.get(key)
                if node is not None and node.last_seen <= horizon:
                    del self._nodes[key]
                    self._length_counts[key[0]] -= 1
                    if not self._length_counts[key[0]]:
                        del self._length_counts[key[0]]
