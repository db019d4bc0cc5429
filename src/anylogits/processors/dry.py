"""DRY ("don't repeat yourself"): penalize a token that would extend a repeat of an
earlier part of the sequence, exponentially in the repeat's length, with sequence
breakers resolved on the vocabulary's bytes.

Oracle: llama.cpp's ``dry`` sampler.
"""

from __future__ import annotations

import bisect
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.cache import LeastRecentlyUsed
from anylogits.core.fast_paths import FastPaths, RowwiseProcessor
from anylogits.core.processor import LogitsProcessor
from anylogits.core.sync import host_sync_allowed
from anylogits.core.transfer import DeviceCopies, to_device
from anylogits.core.vocab import Vocabulary
from anylogits.processors._checks import finite_float, int_at_least, nonempty_strings
from anylogits.processors._ops import compute_precision, in_sorted, row_ints, row_values

if TYPE_CHECKING:
    from typing_extensions import Self

# llama.cpp's limits on sequence breakers (llama_sampler_init_dry): the text is cut to 40
# bytes and the tokens that follow a breaker's first token to 20.
MAX_BREAKER_BYTES = 40
MAX_BREAKER_TAIL = 20
# llama.cpp caps the exponent so that base ** exponent stays below float32's maximum.
_FLOAT_MAX_LOG = 88.7228391


class DRY(FastPaths):
    """DRY ("don't repeat yourself"): penalize a token that would extend a repeat of an
    earlier part of the sequence, exponentially in the repeat's length.

    For every earlier position ``j`` whose last ``n`` tokens equal the last ``n`` tokens
    of the sequence (``n`` as long as possible), the token after ``j`` would make the
    repeat ``n + 1`` long. If ``n >= allowed_length`` that token loses
    ``multiplier * base ** (n - allowed_length)`` (the largest such penalty when several
    repeats lead to it). A repeat may not reach back across a sequence breaker: ``n`` is
    at most the number of tokens after the latest breaker, and a token that is itself a
    one-token breaker is never penalized. Only the last ``penalty_last_n`` tokens of the
    history (prompt included, as llama.cpp's server and koboldcpp count it) are searched.

    Sequence breakers are strings, mapped to token ids with the bound vocabulary exactly
    as llama.cpp does (``get_overlapping_token_sequences``), on the tokens' bytes:

    * each breaker is cut to its first 40 UTF-8 bytes;
    * a token whose bytes contain the breaker is a one-token breaker;
    * a token whose bytes end with the beginning of the breaker (``b"x\\n"`` for the
      breaker ``"\\n\\n###"``) starts a multi-token breaker: that token followed by the
      tokenization of the breaker's rest (``vocab.encode("\\n###")``, cut to 20 tokens).
      A rest that does not start on a UTF-8 character boundary is skipped (it is not
      text to tokenize).

    llama.cpp matches a breaker against the detokenized piece, which drops the leading
    space of SentencePiece pieces and, for BPE vocabularies, a space before ``?!.,``;
    the two mappings differ only for breakers that contain such a space.

    The search is vectorized over the batch and the history: every position's repeat
    length comes from block ranks built by doubling: about ``log2(longest repeat)``
    rounds, each one ``torch.unique`` of the searched history (none while no repeat of
    two tokens or more exists). Multi-token breakers are found with one rolling hash
    per tail length (at most 20), however many breakers there are. Python loops never
    run over rows, history, breakers or vocabulary. On an accelerator nothing is read
    back to the host: every round runs (a sort instead of ``torch.unique``) and breakers
    are compared at every position, with the same result.

    Arithmetic as llama.cpp's: ``multiplier`` and ``base`` are rounded to float32 (kept
    float64 for float64 logits), ``multiplier * base ** exponent`` is computed in double
    and rounded to float32 once, the exponent is capped at
    ``int(88.7228391 / log(base))`` so the power stays finite, and the penalty is
    subtracted in float32 (then rounded to half types).

    Oracle: llama.cpp's ``dry`` sampler (``llama_sampler_init_dry``) fed the same tokens
    with ``llama_sampler_accept``: identical on float32 logits.

    Args:
        multiplier: the penalty for a repeat of exactly ``allowed_length`` tokens, >= 0
            (0 disables it, as in llama.cpp).
        base: growth per extra repeated token, >= 1.
        allowed_length: longest repeat that is not penalized, >= 0.
        sequence_breakers: strings that end a repeat (llama.cpp's defaults). Breakers
            need the model's vocabulary; pass ``()`` for none.
        penalty_last_n: how many of the last tokens to search; -1 searches the whole
            history, 0 disables the penalty (llama.cpp).

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, Vocabulary
        >>> from anylogits.processors.dry import DRY
        >>> vocab = Vocabulary((b"a", b"b", b"c", b"\\n"))
        >>> history = torch.tensor([[0, 1, 2, 0, 1]])  # "abcab": "c" would repeat "abc"
        >>> Pipeline([DRY(0.8)], vocab)(torch.zeros(1, 4), history)
        tensor([[ 0.0000,  0.0000, -0.8000,  0.0000]])
    """

    spec_name = "dry"

    def __init__(
        self,
        multiplier: float,
        base: float = 1.75,
        allowed_length: int = 2,
        sequence_breakers: Sequence[str] = ("\n", ":", '"', "*"),
        penalty_last_n: int = -1,
    ) -> None:
        self.multiplier = finite_float("multiplier", multiplier, minimum=0.0)
        self.base = finite_float("base", base, minimum=1.0)
        self.allowed_length = int_at_least("allowed_length", allowed_length, 0)
        self.sequence_breakers = nonempty_strings(
            "sequence_breakers", sequence_breakers, "sequence_breakers"
        )
        self.penalty_last_n = int_at_least("penalty_last_n", penalty_last_n, -1, limit="window")
        self._table: BreakerTable | None = None
        self._parameters = _dry_parameters([self])

    def config(self) -> dict[str, Any]:
        return {
            "multiplier": self.multiplier,
            "base": self.base,
            "allowed_length": self.allowed_length,
            "sequence_breakers": list(self.sequence_breakers),
            "penalty_last_n": self.penalty_last_n,
        }

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        if vocab is not None and self.sequence_breakers:
            self._table = breaker_table(vocab, self.sequence_breakers)
        else:
            self._table = None

    def breakers(self) -> BreakerTable:
        """The sequence breakers as token ids of the bound vocabulary."""
        if not self.sequence_breakers:
            return _NO_BREAKERS
        if self._table is None:
            raise ValueError(
                "DRY needs the model's vocabulary to find its sequence_breakers: build the "
                "hook with the model's tokenizer, or pass sequence_breakers=()"
            )
        return self._table

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return _dry_rows(logits, batch, owner=self, **self._parameters)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor | None:
        first = processors[0]
        rows = list(processors)
        if any(
            p.sequence_breakers != first.sequence_breakers or p.vocab is not first.vocab
            for p in rows
        ):
            return None
        return RowwiseProcessor(_dry_rows, owner=first, **_dry_parameters(rows))


def _dry_parameters(rows: Sequence[DRY]) -> dict[str, Any]:
    """:func:`_dry_rows`' parameters for ``rows`` (one processor per row, or one for
    every row), made once with what follows from them alone."""
    multipliers = row_values([p.multiplier for p in rows])
    bases = row_values([p.base for p in rows])
    last_ns = [p.penalty_last_n for p in rows]
    return {
        "multipliers": multipliers,
        "penalizing": DeviceCopies(multipliers.host > 0),
        "bases": bases,
        "max_exponents": DeviceCopies(_max_exponents(bases.host)),
        "allowed_lengths": row_ints([p.allowed_length for p in rows]),
        "last_ns": row_ints(last_ns),
        "widest": _widest_window(last_ns),
    }


def _widest_window(last_ns: list[int]) -> int | None:
    """The most tokens any row searches, when every row caps it (``None``: whole rows)."""
    return None if min(last_ns) < 0 else max(last_ns)


@dataclass(eq=False)
class BreakerTable:
    """Sequence breakers as token ids of one vocabulary.

    Attributes:
        vocab_size: ids ``>= vocab_size`` are never breakers.
        single: ids whose text contains a breaker.
        tails: for each rest of a breaker (as token ids), the ids whose text ends with the
            breaker's beginning.
    """

    vocab_size: int
    single: frozenset[int]
    tails: dict[tuple[int, ...], frozenset[int]]
    _on_device: dict[torch.device, Any] = field(default_factory=dict, repr=False)

    def for_device(self, device: torch.device) -> tuple[torch.Tensor, _TailForms]:
        """``(single id mask, the multi-token forms)`` on ``device``."""
        cached = self._on_device.get(device)
        if cached is None:
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            mask[sorted(self.single)] = True
            cached = (to_device(mask, device), _TailForms(self.tails, device))
            self._on_device[device] = cached
        return cached


class _TailForms:
    """The multi-token breakers (a head token, then a fixed tail), laid out to be found
    in a history with a few tensor ops however many there are: tails grouped by length,
    each group matched by a rolling hash of the tokens that follow every position (then
    checked token by token where a hash matches), heads checked as ``(head, tail)`` pair
    keys with one ``isin``."""

    def __init__(self, tails: dict[tuple[int, ...], frozenset[int]], device: torch.device) -> None:
        ordered = list(tails.items())
        self.count = len(ordered)
        self.longest = max((len(tail) for tail, _ in ordered), default=0)
        keys = [
            head * self.count + index for index, (_, heads) in enumerate(ordered) for head in heads
        ]
        self.pair_keys = to_device(torch.tensor(sorted(keys), dtype=torch.int64), device)
        by_length: dict[int, list[int]] = {}
        for index, (tail, _) in enumerate(ordered):
            by_length.setdefault(len(tail), []).append(index)
        # (tail length, its tails' tokens, their hashes, their indices), on the device.
        self.groups: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for length, indices in sorted(by_length.items()):
            tokens = torch.tensor([ordered[i][0] for i in indices], dtype=torch.int64)
            hashes = _rolling_hashes(tokens)[:, -1]
            ids = torch.tensor(indices, dtype=torch.int64)
            self.groups.append(
                (
                    length,
                    to_device(tokens, device),
                    to_device(hashes, device),
                    to_device(ids, device),
                )
            )


_HASH_BASE = 1_000_003
_HASH_MODULUS = 2_147_483_647  # 2**31 - 1: every product stays below 2**62


def _rolling_hashes(tokens: torch.Tensor) -> torch.Tensor:
    """``(..., L)``: entry ``k`` hashes ``tokens[..., :k + 1]`` (ids may be negative)."""
    hashes = torch.empty_like(tokens)
    current = torch.zeros_like(tokens[..., 0])
    for column in range(tokens.shape[-1]):
        current = (current * _HASH_BASE + tokens[..., column] + 1) % _HASH_MODULUS
        hashes[..., column] = current
    return hashes


_NO_BREAKERS = BreakerTable(0, frozenset(), {})
# Resolving breakers reads the whole vocabulary (~0.1 s for 128k tokens), and an engine
# builds one processor per request: resolve once per vocabulary.
_TABLES: weakref.WeakKeyDictionary[Vocabulary, LeastRecentlyUsed[tuple[str, ...], BreakerTable]] = (
    weakref.WeakKeyDictionary()
)


# A server meets endless breaker lists; each table holds a vocabulary-wide mask.
_TABLES_PER_VOCABULARY = 256


def breaker_table(vocab: Vocabulary, breakers: tuple[str, ...]) -> BreakerTable:
    """``breakers`` mapped to token ids of ``vocab`` (see :class:`DRY`), cached (the
    least recently used of more than 256 lists per vocabulary are dropped)."""
    per_vocab = _TABLES.get(vocab)
    if per_vocab is None:
        per_vocab = _TABLES[vocab] = LeastRecentlyUsed(_TABLES_PER_VOCABULARY)
    table = per_vocab.get(breakers)
    if table is None:
        table = per_vocab.put(breakers, _resolve_breakers(vocab, breakers))
    return table


class _PieceIndex:
    """One vocabulary's token bytes, indexed for breaker lookups: every piece in one
    string (to find those that contain a needle, by ``bytes.find`` in C) and the reversed
    pieces sorted (those that end with a given prefix form one run, found by bisection).
    Built once per vocabulary, so resolving one breaker reads only the pieces it matches
    rather than the whole vocabulary in Python."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self.joined = b"".join(pieces)
        self.starts = list(itertools.accumulate((len(piece) for piece in pieces), initial=0))
        backwards = [piece[::-1] for piece in pieces]
        self.reversed_ids = sorted(range(len(pieces)), key=backwards.__getitem__)
        self.reversed_pieces = [backwards[token_id] for token_id in self.reversed_ids]

    def containing(self, needle: bytes) -> set[int]:
        """Ids of the pieces that contain ``needle``."""
        found: set[int] = set()
        position = self.joined.find(needle)
        while position != -1:
            token_id = bisect.bisect_right(self.starts, position) - 1
            if position + len(needle) <= self.starts[token_id + 1]:
                found.add(token_id)
                position = self.joined.find(needle, position + 1)
            else:  # the match runs into the next piece: go on from that piece
                position = self.joined.find(needle, self.starts[token_id + 1])
        return found

    def ending_with(self, suffix: bytes) -> list[int]:
        """Ids of the pieces that end with ``suffix`` (non-empty)."""
        key = suffix[::-1]
        low = bisect.bisect_left(self.reversed_pieces, key)
        high = low
        pieces = self.reversed_pieces
        while high < len(pieces) and pieces[high].startswith(key):
            high += 1
        return self.reversed_ids[low:high]


_PIECE_INDEXES: weakref.WeakKeyDictionary[Vocabulary, _PieceIndex] = weakref.WeakKeyDictionary()


def _resolve_breakers(vocab: Vocabulary, breakers: tuple[str, ...]) -> BreakerTable:
    index = _PIECE_INDEXES.get(vocab)
    if index is None:
        index = _PIECE_INDEXES[vocab] = _PieceIndex(vocab.tokens)
    single: set[int] = set()
    tails: dict[tuple[int, ...], set[int]] = {}
    rests: dict[bytes, tuple[int, ...] | None] = {}
    for breaker in breakers:
        needle = breaker.encode("utf-8")[:MAX_BREAKER_BYTES]
        containing = index.containing(needle)
        single |= containing
        # A piece that ends with the first k bytes of the breaker (and does not contain
        # all of it) starts a multi-token breaker whose rest is the other bytes.
        for k in range(1, len(needle)):
            heads = [t for t in index.ending_with(needle[:k]) if t not in containing]
            if not heads:
                continue
            rest = needle[k:]
            if rest not in rests:
                rests[rest] = _tokenize_rest(vocab, breaker, rest)
            tail = rests[rest]
            if tail == ():
                single.update(heads)  # llama.cpp: an empty tail is a one-token breaker
            elif tail is not None:
                tails.setdefault(tail, set()).update(heads)
    return BreakerTable(
        vocab.size,
        frozenset(single),
        {tail: frozenset(heads) for tail, heads in tails.items()},
    )


def _tokenize_rest(vocab: Vocabulary, breaker: str, rest: bytes) -> tuple[int, ...] | None:
    try:
        text = rest.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if vocab.encode is None:
        raise ValueError(
            f"DRY sequence breaker {breaker!r} can start inside a token, so its rest "
            f"{text!r} must be tokenized, but the vocabulary has no tokenizer: build the "
            "hook with the model's tokenizer"
        )
    return tuple(vocab.encode(text))[:MAX_BREAKER_TAIL]


def _lookup(mask: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``mask[ids]``, False for ids outside the mask (sentinels, padded logits)."""
    size = mask.shape[0]
    if size == 0:
        return torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    return mask[ids.clamp(0, size - 1)] & (ids >= 0) & (ids < size)


def _dry_rows(
    logits: torch.Tensor,
    batch: Batch,
    owner: DRY,
    multipliers: DeviceCopies,
    penalizing: DeviceCopies,
    bases: DeviceCopies,
    max_exponents: DeviceCopies,
    allowed_lengths: DeviceCopies,
    last_ns: DeviceCopies,
    widest: int | None = None,
) -> torch.Tensor:
    """DRY with one parameter (or one per row) in ``multipliers`` ... ``last_ns`` (see
    :func:`_dry_parameters`); ``widest`` bounds every row's window when known (see
    :func:`_widest_window`)."""
    device = logits.device
    allowed, row_last_ns = allowed_lengths.on(device), last_ns.on(device)
    lengths = to_device(batch.lengths, device)
    windows = torch.where(row_last_ns < 0, lengths, torch.minimum(lengths, row_last_ns))
    windows = torch.where(penalizing.on(device), windows, 0)
    readable = host_sync_allowed(windows)
    if readable:
        if not bool((windows > allowed).any()):
            return logits
        width = int(windows.max())
    else:
        # The windows are on the device: search as many columns as any row could need.
        history_width = batch.token_ids.shape[1]
        width = history_width if widest is None else min(history_width, widest)
        if width == 0:
            return logits
    ids = to_device(batch.token_ids[:, -width:], device)
    columns = torch.arange(width, device=device)
    inside = columns >= (width - windows)[:, None]
    # A position outside the window holds an id no other position of its row holds, so no
    # repeat and no breaker reaches it.
    tokens = torch.where(inside, ids, -1 - columns)
    single, tails = owner.breakers().for_device(device)
    limits = _repeat_limits(tokens, windows, single, tails)
    if readable and not bool(((windows > allowed) & (limits >= allowed)).any()):
        return logits
    # The repeat each position ends, cut at the latest breaker: a token after position j
    # would extend it by one. Limits never exceed the width.
    longest = int(limits.max()) if readable else width
    repeats = torch.minimum(_suffix_match_lengths(tokens, longest), limits[:, None])
    followers = tokens[:, 1:]
    eligible = inside[:, :-1] & (windows > allowed)[:, None] & (repeats >= allowed[:, None])
    eligible &= (followers < logits.shape[-1]) & ~_lookup(single, followers)
    exponents = (repeats - allowed[:, None]).clamp(min=0)
    exponents = torch.minimum(exponents, max_exponents.on(device)[:, None])
    # As llama.cpp: float32 parameters (float64 for float64 logits), the power and product
    # in double, the penalty rounded once.
    row_multipliers = compute_precision(multipliers, logits).double()[:, None]
    row_bases = compute_precision(bases, logits).double()[:, None]
    penalties = row_multipliers * torch.pow(row_bases, exponents.to(torch.float64))
    index = torch.where(eligible, followers, 0)
    seen = logits.gather(1, index)
    wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
    penalized = (seen.to(wide) - penalties.to(wide)).to(logits.dtype)
    # amin keeps the largest penalty of a token several repeats lead to; +inf is a no-op.
    penalized = torch.where(eligible, penalized, float("inf"))
    return logits.scatter_reduce_(1, index, penalized, reduce="amin")


def _max_exponents(bases: torch.Tensor) -> torch.Tensor:
    """llama.cpp's cap on the exponent, ``int(88.7228391f / logf(base))`` in float32, for
    bases above 1.000001 (no cap below). On the host, as llama.cpp computes it."""
    bases32 = bases.to(torch.float32)
    capped = bases32 > torch.tensor(1.000001, dtype=torch.float32)
    logs = torch.log(torch.where(capped, bases32, 2.0))
    caps = (torch.tensor(_FLOAT_MAX_LOG, dtype=torch.float32) / logs).to(torch.int64)
    return torch.where(capped & (caps > 0), caps, torch.iinfo(torch.int64).max)


def _repeat_limits(
    tokens: torch.Tensor,
    windows: torch.Tensor,
    single: torch.Tensor,
    forms: _TailForms,
) -> torch.Tensor:
    """Per row, how many tokens follow the latest sequence breaker (the whole window when
    there is none): the longest a repeat may be (llama.cpp's ``rep_limit``).

    "Latest" is by the breaker's first token, and among breakers starting there the
    longest one counts, as in llama.cpp's backward scan.
    """
    width = tokens.shape[1]
    columns = torch.arange(width, device=tokens.device)
    ends = torch.where(_lookup(single, tokens), columns, -1)
    if forms.count and width > 1:
        _mark_tail_ends(tokens, forms, ends)
    latest = torch.where(ends >= 0, columns, -1).amax(dim=1)
    end = ends.gather(1, latest.clamp(min=0)[:, None])[:, 0]
    return torch.where(latest >= 0, width - 1 - end, windows)


def _mark_tail_ends(tokens: torch.Tensor, forms: _TailForms, ends: torch.Tensor) -> None:
    """``ends[b, j] = max(ends[b, j], j + len(tail))`` wherever a multi-token breaker
    starts at ``j`` (its head token there, its tail right after)."""
    if not host_sync_allowed(tokens):
        _mark_tail_ends_everywhere(tokens, forms, ends)
        return
    width = tokens.shape[1]
    # following[..., j, k]: the hash of tokens[j + 1 : j + 2 + k]; the history is padded
    # on the right, and no tail can end in the padding (checked below).
    longest = min(forms.longest, width - 1)
    padded = torch.nn.functional.pad(tokens[:, 1:], (0, longest), value=-1)
    following = _rolling_hashes(padded.unfold(1, longest, 1)[:, : width - 1])
    for length, tails, hashes, ids in forms.groups:
        if length >= width:
            break
        starts = width - length
        hits = (following[:, :starts, length - 1, None] == hashes).nonzero()
        if hits.numel() == 0:
            continue
        rows, positions, which = hits.unbind(1)
        offsets = torch.arange(1, length + 1, device=tokens.device)
        exact = (tokens[rows[:, None], positions[:, None] + offsets] == tails[which]).all(1)
        keys = tokens[rows, positions] * forms.count + ids[which]
        found = exact & in_sorted(keys, forms.pair_keys) & (tokens[rows, positions] >= 0)
        rows, positions = rows[found], positions[found]
        ends[rows, positions] = torch.maximum(ends[rows, positions], positions + length)


def _mark_tail_ends_everywhere(tokens: torch.Tensor, forms: _TailForms, ends: torch.Tensor) -> None:
    """:func:`_mark_tail_ends` without a host read: every position is compared with
    every tail, token by token (no hash to find the few candidates first)."""
    width = tokens.shape[1]
    for length, tails, _, ids in forms.groups:
        if length >= width:
            break
        starts = width - length
        # following[b, j]: the ``length`` tokens after position j.
        following = tokens[:, 1:].unfold(1, length, 1)
        exact = (following[:, :, None, :] == tails).all(-1)  # (B, starts, tails)
        heads = tokens[:, :starts, None]
        found = exact & in_sorted(heads * forms.count + ids, forms.pair_keys) & (heads >= 0)
        positions = torch.arange(starts, device=tokens.device)
        marked = ends[:, :starts]
        marked.copy_(torch.where(found.any(-1), torch.maximum(marked, positions + length), marked))


def _dense_ranks(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(values, return_inverse=True)``'s inverse and the number of distinct
    values (a 0-d tensor), without reading anything on the host: rank by sorting."""
    flat = values.flatten()
    ordered, order = flat.sort()
    steps = torch.cat([ordered.new_zeros(1), (ordered[1:] != ordered[:-1]).long()]).cumsum(0)
    return torch.empty_like(flat).scatter_(0, order, steps).view_as(values), steps[-1] + 1


def _suffix_match_lengths(tokens: torch.Tensor, longest: int) -> torch.Tensor:
    """``(B, W - 1)``: for each position ``j``, how many tokens ending at ``j`` equal the
    tokens ending at the last position (exact up to ``longest``, at least ``longest``
    beyond).

    ``ranks[d][b, j]`` numbers the block of ``2 ** d`` tokens ending at ``j``: two blocks of
    a row are equal exactly when their numbers are (no hashing). Level 0 is the tokens
    themselves; a block reaching left of column 0 gets a number of its own. Each length is
    then grown greedily, largest block first (binary lifting), comparing one block pair
    per level for all positions at once, so the cost is ``log2`` of the longest repeat in
    rounds, whatever its length. Levels stop early once no block equals the last one
    (where reading that on the host is free: else every level up to ``longest`` is built,
    which finds the same lengths). Positions are only compared within a row, so rows
    share numbers.
    """
    batch_size, width = tokens.shape
    lengths = torch.zeros(batch_size, width - 1, dtype=torch.int64, device=tokens.device)
    if longest <= 0 or width < 2:
        return lengths
    columns = torch.arange(width, device=tokens.device)
    readable = host_sync_allowed(tokens)
    rank = tokens + width  # outside-window sentinels (>= -width) become >= 0
    # Keys below classes ** 2 fit int64 for int32 token ids.
    classes: int | torch.Tensor = int(rank.max()) + 1 if readable else rank.max() + 1
    ranks = [rank]
    while (2 << (len(ranks) - 1)) <= longest and (
        not readable or bool((rank[:, :-1] == rank[:, -1:]).any())
    ):
        span = 1 << (len(ranks) - 1)
        if len(ranks) > 1 and readable:
            renumbered, rank = torch.unique(rank, return_inverse=True)
            classes = renumbered.numel()
        elif len(ranks) > 1:
            rank, classes = _dense_ranks(rank)
        keys = rank[:, :-span] * classes + rank[:, span:]
        crossing = (-1 - columns[:span]).expand(batch_size, span)
        rank = torch.cat([crossing, keys], dim=1)
        ranks.append(rank)
    positions = columns[:-1]
    for level in reversed(range(len(ranks))):
        earlier = positions - lengths
        same = ranks[level].gather(1, earlier.clamp(min=0)) == ranks[level].gather(
            1, width - 1 - lengths
        )
        lengths += torch.where(same & (earlier >= 0), 1 << level, 0)
    return lengths
