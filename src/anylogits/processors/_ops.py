"""Tensor helpers shared by the processor modules: masking, per-row parameters, token
columns, EOS ids and token sequences matched against the history."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.fused_forms import TokenListKind, TokenLists
from anylogits.core.sync import host_sync_allowed
from anylogits.core.transfer import DeviceCopies, to_device
from anylogits.core.vocab import Vocabulary
from anylogits.processors._checks import ids_within, token_id_list


def keep_only(
    logits: torch.Tensor, keep: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Set ``logits`` to ``-inf`` where ``keep`` is False, in place (or into ``out``,
    leaving ``logits`` as they are: one pass, no copy first).

    ``torch.where`` into the same tensor: a boolean ``masked_fill_`` is several times
    slower on CPU for scattered masks.
    """
    return torch.where(keep, logits, minus_inf(logits), out=logits if out is None else out)


def minus_inf(logits: torch.Tensor) -> torch.Tensor:
    """A 0-d ``-inf`` in the logits' dtype and on their device, made once per pair: a new
    0-d tensor costs more than a small ``where``. Filled where it lives: no copy."""
    key = (logits.dtype, logits.device)
    value = _MINUS_INF.get(key)
    if value is None:
        value = _MINUS_INF[key] = torch.full((), float("-inf"), dtype=key[0], device=key[1])
    return value


_MINUS_INF: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def mass_dtype(logits: torch.Tensor) -> torch.dtype:
    """Where probabilities and masses are computed: float64 for float64 logits, else
    float32 (half types too, as ``torch.softmax`` computes them)."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


_LOG2E = 1.4426950408889634
# Sums of probabilities are exact sums of these multiples: see `row_total`.
_FIXED_POINT = 2.0**40


def shifted_exp(logits: torch.Tensor, maxima: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``exp(logits - maxima)`` in ``dtype``, element by element (as ``exp2`` of a
    product: faster than ``exp`` on CPU, within a few ulps of it; measured on the
    benchmarks page, "Measurements behind the code")."""
    if logits.dtype != dtype:
        logits, maxima = logits.to(dtype), maxima.to(dtype)
    return (logits - maxima).mul_(_LOG2E).exp2_()


def row_total(weights: torch.Tensor) -> torch.Tensor:
    """``(B, 1)``: each row's sum of ``weights`` (in [0, 1]), whatever columns hold them.

    A float sum rounds differently when the same values sit in other columns (SIMD lanes
    group them by position), so the candidates of a row and the full row with ``-inf``
    elsewhere would get different normalizers. Here each term is rounded to a multiple of
    ``2**-40`` and summed exactly as int64: the result depends on the values only (a
    term's rounding is at most ``2**-41``; overflow needs 2**23 columns).
    """
    rows = max(1, _BLOCK // weights.shape[-1])
    if weights.shape[0] > rows:  # int64 blocks of <= 8 MB: the allocator reuses them
        return torch.cat([row_total(block) for block in weights.split(rows)])
    fixed = (weights * _FIXED_POINT).round_().sum(-1, keepdim=True, dtype=torch.int64)
    return fixed.to(weights.dtype).div_(_FIXED_POINT)


_BLOCK = 1 << 20


def probabilities(
    logits: torch.Tensor, dtype: torch.dtype | None = None, maxima: torch.Tensor | None = None
) -> torch.Tensor:
    """The softmax of each row, computed in :func:`mass_dtype` and returned in ``dtype``
    (default: the logits' dtype, as ``torch.softmax(logits)``), with bits that depend
    only on the row's finite logits (see :func:`row_total`). ``maxima``: each row's
    maximum, ``(B, 1)``, when the caller has it."""
    dtype = dtype or logits.dtype
    if not host_sync_allowed(logits):
        # An accelerator runs no candidates path to agree with bit for bit: a softmax,
        # one launch where the exact row sum takes eight.
        weights = logits.softmax(dim=-1, dtype=mass_dtype(logits))
        return weights if weights.dtype == dtype else weights.to(dtype)
    if maxima is None:
        maxima = logits.amax(dim=-1, keepdim=True)
    weights = shifted_exp(logits, maxima, mass_dtype(logits))
    weights = weights.div_(row_total(weights))
    return weights if weights.dtype == dtype else weights.to(dtype)


def sorted_descending(values: torch.Tensor) -> torch.Tensor:
    """Each row of ``values`` in descending order (values only, so every correct sort
    gives the same bits; NaN first, as ``torch.sort`` puts it).

    On the CPU numpy's SIMD sort is used when numpy is installed: far faster than
    ``torch.sort`` on a long row (measured on the benchmarks page, "Measurements behind
    the code").
    """
    numpy = _numpy()
    if numpy is None or values.shape[-1] < 1024 or not host_sync_allowed(values):
        return torch.sort(values, dim=-1, descending=True).values
    exact = values.float() if values.dtype in (torch.float16, torch.bfloat16) else values
    ascending = numpy.sort(exact.detach().numpy(), axis=-1)  # NaN last
    return torch.from_numpy(ascending).flip(-1).to(values.dtype)


# Chunks of 64 logits: their maxima pick the chunks that can hold a row's top k.
_TOP_CHUNK = 64


def top_logits(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(logits, k, dim=-1)``: the same values, and columns holding them (equal
    values may come in another order).

    On the CPU a long row is cut into chunks of 64 and ``topk`` runs only on the ``k``
    chunks with the highest maxima (about a third of ``topk``'s time on a 128k row).
    Exact: with ``t`` the k-th highest chunk maximum, every logit above ``t`` lies in a
    chosen chunk, and the chosen maxima are ``k`` logits at least ``t``; so the chosen
    chunks hold the top ``k`` values, and every one of their columns when the k-th value
    is above ``t``.
    """
    rows, width = logits.shape
    chunks = width // _TOP_CHUNK
    if logits.device.type != "cpu" or chunks < 8 * k or logits.stride(-1) != 1:
        return torch.topk(logits, k, dim=-1)
    split = chunks * _TOP_CHUNK
    whole = logits if split == width else logits[:, :split]
    blocks = whole.view(rows, chunks, _TOP_CHUNK)
    chosen = torch.topk(blocks.amax(dim=-1), k, dim=-1).indices
    picked = blocks.gather(1, chosen[:, :, None].expand(rows, k, _TOP_CHUNK)).view(rows, -1)
    columns = _chunk_columns(chunks, logits.device)[chosen].view(rows, -1)
    if split < width:  # the last, shorter chunk is always searched
        picked = torch.cat([picked, logits[:, split:]], dim=-1)
        tail = torch.arange(split, width, device=logits.device).expand(rows, -1)
        columns = torch.cat([columns, tail], dim=-1)
    values, order = torch.topk(picked, k, dim=-1)
    return values, columns.gather(-1, order)


@functools.lru_cache(maxsize=16)
def _chunk_columns(chunks: int, device: torch.device) -> torch.Tensor:
    """``(chunks, 64)``: the columns of each chunk of 64 logits, made once per width."""
    return torch.arange(chunks * _TOP_CHUNK, device=device).view(chunks, _TOP_CHUNK)


@functools.cache
def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # torch runs without numpy: torch.sort then
        return None
    return numpy


def in_sorted(values: torch.Tensor, sorted_keys: torch.Tensor) -> torch.Tensor:
    """``torch.isin(values, sorted_keys)`` for ascending 1-D ``sorted_keys``, with
    fixed-shape operations: on CUDA ``torch.isin`` sorts once the keys outnumber
    ``10 * values.numel() ** 0.145`` (numpy's rule), and that path reads the device.

    Example:
        >>> in_sorted(torch.tensor([[3, 4], [9, 1]]), torch.tensor([1, 3, 7]))
        tensor([[ True, False],
                [False,  True]])
    """
    if sorted_keys.numel() == 0:
        return torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    index = torch.searchsorted(sorted_keys, values.contiguous())
    return sorted_keys[index.clamp_(max=sorted_keys.numel() - 1)] == values


def row_values(values: Sequence[float]) -> DeviceCopies:
    """Per-row Python floats (a processor's parameters) as a float64 host tensor, copied
    to each device once (see :func:`compute_precision`)."""
    return DeviceCopies(torch.tensor(values, dtype=torch.float64))


def row_ints(values: Sequence[int]) -> DeviceCopies:
    """Per-row Python ints (a processor's parameters) as an int64 host tensor, copied to
    each device once."""
    return DeviceCopies(torch.tensor(values, dtype=torch.int64))


def compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """The precision torch computes ``logits`` op a Python float in: float64 for float64
    logits, float32 otherwise (half types compute in float32)."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def compute_precision(values: DeviceCopies, logits: torch.Tensor) -> torch.Tensor:
    """Per-row floats on the logits' device in :func:`compute_dtype` (rounded on the
    host, as the device would round them)."""
    return values.on(logits.device, compute_dtype(logits))


def divide_rows(logits: torch.Tensor, batch: Batch, divisors: DeviceCopies) -> torch.Tensor:
    """Row ``i`` divided by ``divisors[i]``, bit for bit as ``row.div_(float)``."""
    columns = compute_precision(divisors, logits)[:, None]
    if logits.dtype == columns.dtype:
        return logits.div_(columns)
    return logits.copy_(logits.to(columns.dtype) / columns)


def history_within(
    batch: Batch, width: int, last: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``(B, L)`` history with every id usable as a column of ``width`` logits; with
    ``last``, only each row's last ``last`` tokens (``(B, min(L, last))``).

    Padding and ids ``>= width`` (models whose embedding is wider than their LM head) are
    replaced by an id the same row already holds, so gathering / scattering them only
    repeats work done for that id. Also returns which rows hold any usable id (``None``
    when all do, found out only where reading the history is free: see
    :func:`host_sync_allowed`); rows that hold none must be left unchanged.
    """
    ids = batch.token_ids
    if last is not None and ids.shape[1] > last:
        # Right-aligned: every row's last tokens share the last columns.
        ids = ids[:, -last:]
    readable = host_sync_allowed(ids)
    if ids.shape[1] == 0 or (readable and batch.rows_are_full and int(ids.amax()) < width):
        return ids, None
    usable = ids < width
    if not batch.rows_are_full:
        lengths = to_device(batch.lengths, ids.device).clamp(max=ids.shape[1])
        if not readable or lengths.min() < ids.shape[1]:
            columns = torch.arange(ids.shape[1], device=ids.device)
            usable &= columns >= (ids.shape[1] - lengths)[:, None]
    if readable and bool(usable.all()):
        return ids, None
    fill = torch.where(usable, ids, -1).amax(dim=1, keepdim=True)
    return torch.where(usable, ids, fill.clamp(min=0)), (fill >= 0)


class TokenColumns:
    """Token ids as a tensor per device, checked against the logits width once."""

    def __init__(self, name: str, ids: tuple[int, ...]) -> None:
        self.name = name
        self.ids = ids
        self._tensor = DeviceCopies(torch.tensor(ids, dtype=torch.int64))
        self._checked_width = -1

    def for_logits(self, logits: torch.Tensor) -> torch.Tensor:
        width = logits.shape[-1]
        if width != self._checked_width:
            ids_within(self.name, self.ids, width, "logits row")
            self._checked_width = width
        return self._tensor.on(logits.device)

    def token_lists(self, kind: TokenListKind, values: DeviceCopies | None = None) -> TokenLists:
        """These ids as the sparse kernel's form: one list every row shares (offsets 0
        and its length), ``values`` one per id for a bias."""
        offsets = DeviceCopies(torch.tensor([0, len(self.ids)], dtype=torch.int64))
        return TokenLists(kind, self.for_logits, offsets, values)


def eos_ids(eos_token_id: int | list[int] | None) -> tuple[int, ...] | None:
    if eos_token_id is None:
        return None
    if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool):
        return token_id_list("eos_token_id", [eos_token_id])
    return token_id_list("eos_token_id", eos_token_id)


def eos_columns(owner: str, eos: tuple[int, ...] | None, vocab: Vocabulary | None) -> TokenColumns:
    """EOS columns from ``eos`` or, when it is ``None``, from the bound vocabulary."""
    if eos is not None:
        if vocab is not None:
            ids_within("eos_token_id", eos, vocab.size, "vocabulary")
        return TokenColumns("eos_token_id", eos)
    if vocab is None:
        return TokenColumns("eos_token_id", ())
    if not vocab.eos_token_ids:
        raise ValueError(f"{owner}: the vocabulary has no EOS id; pass eos_token_id")
    return TokenColumns("eos_token_id", tuple(sorted(vocab.eos_token_ids)))


def no_eos(owner: str) -> ValueError:
    return ValueError(
        f"{owner} does not know the EOS id: pass eos_token_id=... or give the adapter the "
        "model's tokenizer"
    )


class RowColumns:
    """Per-row token ids as flat ``(rows, columns)`` indices into the logits, with an
    optional value per id: checked against the logits width once and kept per device,
    so a call neither reads the device for a range check nor copies indices to it."""

    def __init__(
        self, name: str, ids_per_row: list[list[int]], values: list[float] | None = None
    ) -> None:
        self.columns = TokenColumns(
            name, tuple(token_id for ids in ids_per_row for token_id in ids)
        )
        self._rows = row_ints([row for row, ids in enumerate(ids_per_row) for _ in ids])
        # Where each row's ids start in ``columns`` (and the last one's end): CSR offsets.
        self._offsets = row_ints(list(itertools.accumulate(map(len, ids_per_row), initial=0)))
        # float64 first: the values round once, as a float64 tensor moved to the dtype.
        self._values = None if values is None else row_values(values)

    def for_logits(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, columns)`` on the logits' device; ``ValueError`` for an id past the row."""
        columns = self.columns.for_logits(logits)
        return self._rows.on(logits.device), columns

    def offsets_on(self, device: torch.device) -> torch.Tensor:
        """Row ``r``'s ids are ``columns[offsets[r]:offsets[r + 1]]``, on ``device``."""
        return self._offsets.on(device)

    def values_for(self, logits: torch.Tensor) -> torch.Tensor:
        """The values, one per id, in the logits' dtype and on their device."""
        assert self._values is not None
        return self._values.on(logits.device, logits.dtype)

    def token_lists(self, kind: TokenListKind) -> TokenLists:
        """These rows' ids (and values) as the sparse kernel's form."""
        return TokenLists(kind, self._columns_for, self._offsets, self._values)

    def _columns_for(self, logits: torch.Tensor) -> torch.Tensor:
        return self.for_logits(logits)[1]


def add_rows(logits: torch.Tensor, batch: Batch, index: RowColumns) -> torch.Tensor:
    """Add ``index``'s values at its ids, row by row, in place."""
    return logits.index_put_(index.for_logits(logits), index.values_for(logits), accumulate=True)


def suppress_rows(logits: torch.Tensor, batch: Batch, index: RowColumns) -> torch.Tensor:
    """Set ``index``'s ids to ``-inf``, row by row, in place."""
    return logits.index_put_(index.for_logits(logits), minus_inf(logits))


class SequenceEnds:
    """Token sequences, each matched against the end of every row's history at once.

    A sequence of one token always applies. A longer one applies to its last token when
    the history ends with the rest (its prefix). Prefixes are stored right-aligned in one
    ``(N, P)`` tensor, so all of them are compared with the last ``P`` columns of the
    history in a single ``(B, N, P)`` comparison.
    """

    def __init__(self, name: str, sequences: Sequence[tuple[int, ...]]) -> None:
        self.single = [index for index, s in enumerate(sequences) if len(s) == 1]
        self.longer = [index for index, s in enumerate(sequences) if len(s) > 1]
        self.single_ids = TokenColumns(name, tuple(sequences[i][0] for i in self.single))
        self.last_ids = TokenColumns(name, tuple(sequences[i][-1] for i in self.longer))
        self.width = max((len(sequences[i]) - 1 for i in self.longer), default=0)
        # -1 left of a shorter prefix marks "any token"; history ids are never negative.
        prefixes = torch.tensor(
            [
                [-1] * (self.width + 1 - len(sequences[i])) + list(sequences[i][:-1])
                for i in self.longer
            ],
            dtype=torch.int64,
        ).reshape(len(self.longer), self.width)
        self._prefixes = DeviceCopies(prefixes)
        self._wildcards = DeviceCopies(prefixes < 0)
        self._prefix_lengths = row_ints([len(sequences[i]) - 1 for i in self.longer])

    def completed_by_last(self, batch: Batch, device: torch.device) -> torch.Tensor:
        """``(B, N)`` bool: row ``b``'s history ends with the prefix of longer sequence ``n``."""
        prefixes, wildcard = self._prefixes.on(device), self._wildcards.on(device)
        history = batch.token_ids
        tail = to_device(history[:, max(history.shape[1] - self.width, 0) :], device)
        if tail.shape[1] < self.width:
            # A history shorter than a prefix cannot end with it: pad with an id never used.
            tail = torch.nn.functional.pad(tail, (self.width - tail.shape[1], 0), value=-1)
        equal = (tail[:, None, :] == prefixes) | wildcard
        # Ragged rows: columns left of a row's start are padding, not tokens.
        long_enough = to_device(batch.lengths, device)[:, None] >= self._prefix_lengths.on(device)
        return equal.all(dim=-1) & long_enough
