"""Control processors: biases, suppressed tokens, a minimum length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.limits import check_items
from anylogits.core.processor import LogitsProcessor, RowwiseProcessor
from anylogits.core.vocab import Vocabulary
from anylogits.processors._checks import finite_float, ids_within, int_at_least, token_id_list


class _TokenColumns:
    """Token ids as a tensor per device, checked against the logits width once."""

    def __init__(self, name: str, ids: tuple[int, ...]) -> None:
        self.name = name
        self.ids = ids
        self._tensors: dict[torch.device, torch.Tensor] = {}
        self._checked_width = -1

    def on(self, logits: torch.Tensor) -> torch.Tensor:
        width = logits.shape[-1]
        if width != self._checked_width:
            ids_within(self.name, self.ids, width, "logits row")
            self._checked_width = width
        tensor = self._tensors.get(logits.device)
        if tensor is None:
            tensor = torch.tensor(self.ids, dtype=torch.int64, device=logits.device)
            self._tensors[logits.device] = tensor
        return tensor


def _eos_ids(eos_token_id: int | list[int] | None) -> tuple[int, ...] | None:
    if eos_token_id is None:
        return None
    if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool):
        return token_id_list("eos_token_id", [eos_token_id])
    return token_id_list("eos_token_id", eos_token_id)


def _eos_columns(
    owner: str, eos: tuple[int, ...] | None, vocab: Vocabulary | None
) -> _TokenColumns:
    """EOS columns from ``eos`` or, when it is ``None``, from the bound vocabulary."""
    if eos is not None:
        if vocab is not None:
            ids_within("eos_token_id", eos, vocab.size, "vocabulary")
        return _TokenColumns("eos_token_id", eos)
    if vocab is None:
        return _TokenColumns("eos_token_id", ())
    if not vocab.eos_token_ids:
        raise ValueError(f"{owner}: the vocabulary has no EOS id; pass eos_token_id")
    return _TokenColumns("eos_token_id", tuple(sorted(vocab.eos_token_ids)))


def _no_eos(owner: str) -> ValueError:
    return ValueError(
        f"{owner} does not know the EOS id: pass eos_token_id=... or give the adapter the "
        "model's tokenizer"
    )


class LogitBias(LogitsProcessor):
    """Add a fixed bias to chosen tokens (OpenAI's ``logit_bias``).

    Oracle: transformers ``SequenceBiasLogitsProcessor`` with one-token sequences
    (identical float arithmetic).

    Args:
        bias: token id -> additive bias. Keys may be ints or decimal strings (JSON
            object keys are strings); values are finite numbers.

    Example:
        >>> import torch
        >>> from anylogits import LogitBias, Pipeline
        >>> Pipeline([LogitBias({1: 5.0, "2": -1.0})])(torch.zeros(1, 4))
        tensor([[ 0.,  5., -1.,  0.]])
    """

    spec_name = "logit_bias"

    def __init__(self, bias: dict[int | str, float]) -> None:
        if not isinstance(bias, dict):
            raise ValueError(f"bias must be a dict of token id -> bias, got {bias!r}")
        check_items("bias", bias, "token_ids")
        normalized: dict[int, float] = {}
        for key, value in bias.items():
            token_id = _token_id_key(key)
            if token_id in normalized:
                raise ValueError(f"bias names token id {token_id} twice ({key!r})")
            normalized[token_id] = finite_float(f"bias[{key!r}]", value)
        self.bias = normalized
        self._columns = _TokenColumns("bias", tuple(normalized))
        self._values: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def config(self) -> dict[str, Any]:
        return {"bias": {str(token_id): value for token_id, value in self.bias.items()}}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        if vocab is not None:
            ids_within("bias", self.bias, vocab.size, "vocabulary")

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self.bias:
            return logits
        columns = self._columns.on(logits)
        key = (logits.device, logits.dtype)
        values = self._values.get(key)
        if values is None:
            values = torch.tensor(
                list(self.bias.values()), dtype=logits.dtype, device=logits.device
            )
            self._values[key] = values
        return logits.index_add_(1, columns, values.expand(logits.shape[0], -1))

    @classmethod
    def stack(cls, processors: Sequence[LogitsProcessor]) -> LogitsProcessor:
        biases = [p.bias for p in processors]  # type: ignore[attr-defined]
        rows, columns = _row_columns([list(bias) for bias in biases])
        values = torch.tensor([v for bias in biases for v in bias.values()], dtype=torch.float64)
        return RowwiseProcessor(_add_rows, rows=rows, columns=columns, values=values)


def _token_id_key(key: int | str) -> int:
    if isinstance(key, bool):
        raise ValueError(f"bias key {key!r} is not a token id")
    if isinstance(key, str):
        if not key.strip().isdigit():
            raise ValueError(f"bias key {key!r} is not a token id (a non-negative integer)")
        key = int(key)
    if not isinstance(key, int) or key < 0:
        raise ValueError(f"bias key {key!r} is not a token id (a non-negative integer)")
    return key


class SuppressTokens(LogitsProcessor):
    """Never generate the given tokens (their logits become ``-inf``).

    Oracle: transformers ``SuppressTokensLogitsProcessor`` (identical result).

    Args:
        token_ids: the ids to suppress.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, SuppressTokens
        >>> Pipeline([SuppressTokens([0, 2])])(torch.zeros(1, 3))
        tensor([[-inf, 0., -inf]])
    """

    spec_name = "suppress_tokens"

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_id_list("token_ids", token_ids)
        self._columns = _TokenColumns("token_ids", self.token_ids)

    def config(self) -> dict[str, Any]:
        return {"token_ids": list(self.token_ids)}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        if vocab is not None:
            ids_within("token_ids", self.token_ids, vocab.size, "vocabulary")

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self.token_ids:
            return logits
        return logits.index_fill_(1, self._columns.on(logits), float("-inf"))

    @classmethod
    def stack(cls, processors: Sequence[LogitsProcessor]) -> LogitsProcessor:
        rows, columns = _row_columns([list(p.token_ids) for p in processors])  # type: ignore[attr-defined]
        return RowwiseProcessor(_suppress_rows, rows=rows, columns=columns)


def _row_columns(ids_per_row: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat ``(row, column)`` index tensors of per-row token ids."""
    rows = [row for row, ids in enumerate(ids_per_row) for _ in ids]
    columns = [token_id for ids in ids_per_row for token_id in ids]
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(columns, dtype=torch.int64)


def _on_logits(logits: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor) -> tuple:
    if columns.numel() and int(columns.max()) >= logits.shape[-1]:
        raise ValueError(
            f"token id {int(columns.max())} is outside the logits row of {logits.shape[-1]} ids"
        )
    return rows.to(logits.device), columns.to(logits.device)


def _add_rows(
    logits: torch.Tensor,
    batch: Batch,
    rows: torch.Tensor,
    columns: torch.Tensor,
    values: torch.Tensor,
) -> torch.Tensor:
    index = _on_logits(logits, rows, columns)
    return logits.index_put_(index, values.to(logits.device, logits.dtype), accumulate=True)


def _suppress_rows(
    logits: torch.Tensor, batch: Batch, rows: torch.Tensor, columns: torch.Tensor
) -> torch.Tensor:
    minus_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    return logits.index_put_(_on_logits(logits, rows, columns), minus_inf)


class MinNewTokens(LogitsProcessor):
    """Forbid end-of-sequence until ``min_new_tokens`` tokens were generated.

    Counts per sequence (not per call), so it stays right when rows are reordered or
    draft tokens are rolled back.

    Oracle: transformers ``MinNewTokensLengthLogitsProcessor`` (identical result).

    Args:
        min_new_tokens: generated tokens required before EOS is allowed, >= 0.
        eos_token_id: the id(s) to forbid; defaults to the bound vocabulary's EOS ids.

    Example:
        >>> import torch
        >>> from anylogits import MinNewTokens, Pipeline
        >>> pipeline = Pipeline([MinNewTokens(1, eos_token_id=2)])
        >>> pipeline(torch.zeros(1, 3), torch.tensor([[7, 8]]))  # first call: the prompt
        tensor([[0., 0., -inf]])
    """

    spec_name = "min_new_tokens"
    needs_sequences = True

    def __init__(self, min_new_tokens: int, eos_token_id: int | list[int] | None = None) -> None:
        self.min_new_tokens = int_at_least("min_new_tokens", min_new_tokens, 0)
        self.eos_token_id = _eos_ids(eos_token_id)
        self._columns = _TokenColumns("eos_token_id", self.eos_token_id or ())

    def config(self) -> dict[str, Any]:
        eos = None if self.eos_token_id is None else list(self.eos_token_id)
        return {"min_new_tokens": self.min_new_tokens, "eos_token_id": eos}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        self._columns = _eos_columns("MinNewTokens", self.eos_token_id, vocab)

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self._columns.ids:
            raise _no_eos("MinNewTokens")
        too_short = (batch.generated_lengths < self.min_new_tokens).to(logits.device)
        columns = self._columns.on(logits)
        eos_logits = logits.index_select(1, columns).masked_fill_(too_short[:, None], float("-inf"))
        return logits.index_copy_(1, columns, eos_logits)
