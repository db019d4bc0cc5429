"""Biases: fixed amounts added to chosen tokens (:class:`LogitBias`), to the token that
ends a sequence (:class:`SequenceBias`), or to the prompt's tokens
(:class:`CiteFromPrompt`).

Oracles: transformers ``SequenceBiasLogitsProcessor``; logits-processor-zoo
``CiteFromPromptLogitsProcessor``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from anylogits.core.batch import Batch
from anylogits.core.fast_paths import FastPaths, RowwiseProcessor
from anylogits.core.fused_forms import TokenListKind, TokenLists
from anylogits.core.limits import check_items
from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor
from anylogits.core.transfer import DeviceCopies, to_device
from anylogits.core.vocab import Vocabulary
from anylogits.processors._checks import boolean, finite_float, ids_within, token_sequence
from anylogits.processors._ops import (
    RowColumns,
    SequenceEnds,
    TokenColumns,
    add_rows,
    eos_columns,
    eos_ids,
    no_eos,
)

if TYPE_CHECKING:
    from typing_extensions import Self


class LogitBias(FastPaths):
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
        self._columns = TokenColumns("bias", tuple(normalized))
        self._values = DeviceCopies(torch.tensor(list(normalized.values()), dtype=torch.float64))

    def config(self) -> dict[str, Any]:
        return {"bias": {str(token_id): value for token_id, value in self.bias.items()}}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        if vocab is not None:
            ids_within("bias", self.bias, vocab.size, "vocabulary")

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self.bias:
            return logits
        columns = self._columns.for_logits(logits)
        values = self._values.on(logits.device, logits.dtype)
        return logits.index_add_(1, columns, values.expand(logits.shape[0], -1))

    def fused_form(self) -> TokenLists:
        return self._columns.token_lists(TokenListKind.BIAS, self._values)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor:
        biases = [p.bias for p in processors]
        values = [v for bias in biases for v in bias.values()]
        index = RowColumns("bias", [list(bias) for bias in biases], values)
        return RowwiseProcessor(add_rows, fused=index.token_lists(TokenListKind.BIAS), index=index)


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


class SequenceBias(LogitsProcessor):
    """Add a bias to the last token of a sequence when the history ends with the rest.

    A one-token entry is always applied (it is a logit bias). Biases that meet on one
    token add up, in transformers' order (one-token entries first, then longer ones
    grouped by length in order of first appearance), so half-precision sums round
    alike.

    Oracle: transformers ``SequenceBiasLogitsProcessor`` (identical result for float16,
    bfloat16 and float32 logits; for float64 logits the oracle adds ``float32(bias)``,
    ours the exact bias, as :class:`~anylogits.LogitBias` does).

    Args:
        biases: ``[token_ids, bias]`` pairs; each sequence at most once, biases finite.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.bias import SequenceBias
        >>> history = torch.tensor([[4, 1], [4, 2]])  # only row 0 ends with 1
        >>> Pipeline([SequenceBias([[[1, 3], 2.5], [[0], -1.0]])])(torch.zeros(2, 4), history)
        tensor([[-1.0000,  0.0000,  0.0000,  2.5000],
                [-1.0000,  0.0000,  0.0000,  0.0000]])
    """

    spec_name = "sequence_bias"

    def __init__(self, biases: list[list[Any]]) -> None:
        if isinstance(biases, (str, bytes)) or not isinstance(biases, (list, tuple)):
            raise ValueError(f"biases must be a list of [token_ids, bias] pairs, got {biases!r}")
        check_items("biases", biases)
        pairs: dict[tuple[int, ...], float] = {}
        for index, pair in enumerate(biases):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError(f"biases[{index}] must be a [token_ids, bias] pair, got {pair!r}")
            sequence = token_sequence(f"biases[{index}][0]", pair[0])
            bias = finite_float(f"biases[{index}][1]", pair[1])
            if sequence in pairs:
                raise ValueError(f"biases[{index}] repeats the sequence {list(sequence)}")
            pairs[sequence] = bias
        self.biases = pairs
        sequences, values = list(pairs), list(pairs.values())
        self._ends = SequenceEnds("biases", sequences)
        # Each biased column once; every entry adds into its column's slot.
        columns = list(dict.fromkeys(sequence[-1] for sequence in sequences))
        self._columns = TokenColumns("biases", tuple(columns))
        slot = {token_id: index for index, token_id in enumerate(columns)}
        single = self._ends.single
        self._single = ([slot[sequences[i][-1]] for i in single], [values[i] for i in single])
        # transformers adds longer sequences with one index_add_ per prefix length, in
        # order of first appearance; half-precision sums round differently if regrouped.
        groups: dict[int, list[int]] = {}
        for position, i in enumerate(self._ends.longer):
            groups.setdefault(len(sequences[i]), []).append(position)
        longer = self._ends.longer
        self._groups = [
            (
                positions,
                [slot[sequences[longer[p]][-1]] for p in positions],
                [values[longer[p]] for p in positions],
            )
            for positions in groups.values()
        ]
        self._tensors: dict[tuple[torch.device, torch.dtype], Any] = {}

    def config(self) -> dict[str, Any]:
        return {"biases": [[list(sequence), bias] for sequence, bias in self.biases.items()]}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        if vocab is not None:
            for sequence in self.biases:
                ids_within("biases", sequence, vocab.size, "vocabulary")

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self.biases:
            return logits
        columns = self._columns.for_logits(logits)
        (single_slots, single_values), groups = self._on(logits.device, logits.dtype)
        bias = logits.new_zeros(logits.shape[0], columns.shape[0])
        if single_values.numel():
            bias.index_copy_(1, single_slots, single_values.expand(bias.shape[0], -1))
        if groups:
            completed = self._ends.completed_by_last(batch, logits.device)
            zero = logits.new_zeros(())
            for positions, slots, values in groups:
                added = torch.where(completed.index_select(1, positions), values, zero)
                bias.index_add_(1, slots, added)
        return logits.index_add_(1, columns, bias)

    def _on(self, device: torch.device, dtype: torch.dtype) -> Any:
        """Slots, positions and biases as tensors (biases in the logits dtype)."""
        key = (device, dtype)
        tensors = self._tensors.get(key)
        if tensors is None:

            def ids(values: list[int]) -> torch.Tensor:
                return to_device(torch.tensor(values, dtype=torch.int64), device)

            def floats(values: list[float]) -> torch.Tensor:
                return to_device(torch.tensor(values, dtype=dtype), device)

            single_slots, single_values = self._single
            tensors = self._tensors[key] = (
                (ids(single_slots), floats(single_values)),
                [(ids(p), ids(s), floats(v)) for p, s, v in self._groups],
            )
        return tensors


class _PromptTokens(NamedTuple):
    boosted: torch.Tensor  # distinct prompt ids (and EOS ids when boosted), int64
    followers: dict[int, torch.Tensor]  # prompt id -> distinct ids that follow it
    last_token: int | None  # the last generated token, None before the first


class CiteFromPrompt(StatefulLogitsProcessor[_PromptTokens]):
    """Add ``boost_factor`` to every token of the prompt (negative: avoid them).

    With ``conditional_boost_factor``, once a token has been generated, the tokens that
    follow it somewhere in the prompt also get that boost, so quotes continue as written.

    Oracle: logits-processor-zoo ``CiteFromPromptLogitsProcessor`` (identical result on
    unpadded prompts). Differences: the zoo reads the prompt as the first call's
    left-padded ``input_ids``, so in a padded batch it also boosts the pad id; ours reads
    each sequence's own prompt. Any of several EOS ids is boosted (the zoo boosts one).

    Args:
        boost_factor: finite, added to each prompt token's logit.
        boost_eos: also boost the EOS id(s).
        conditional_boost_factor: finite, added to the prompt tokens that follow the last
            generated token in the prompt; 0 turns it off.
        eos_token_id: the EOS id(s) for ``boost_eos``; defaults to the bound vocabulary's.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.bias import CiteFromPrompt
        >>> pipeline = Pipeline([CiteFromPrompt(2.0, boost_eos=False)])
        >>> pipeline(torch.zeros(1, 5), torch.tensor([[1, 3, 1]]))  # the prompt
        tensor([[0., 2., 0., 2., 0.]])
    """

    spec_name = "cite_from_prompt"

    def __init__(
        self,
        boost_factor: float = 1.0,
        boost_eos: bool = True,
        conditional_boost_factor: float = 0.0,
        eos_token_id: int | list[int] | None = None,
    ) -> None:
        self.boost_factor = finite_float("boost_factor", boost_factor)
        self.boost_eos = boolean("boost_eos", boost_eos)
        self.conditional_boost_factor = finite_float(
            "conditional_boost_factor", conditional_boost_factor
        )
        self.eos_token_id = eos_ids(eos_token_id)
        self._eos = self.eos_token_id or ()

    def config(self) -> dict[str, Any]:
        eos = None if self.eos_token_id is None else list(self.eos_token_id)
        return {
            "boost_factor": self.boost_factor,
            "boost_eos": self.boost_eos,
            "conditional_boost_factor": self.conditional_boost_factor,
            "eos_token_id": eos,
        }

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        if self.boost_eos:
            self._eos = eos_columns("CiteFromPrompt", self.eos_token_id, vocab).ids

    def init_state(self, prompt_ids: torch.Tensor) -> _PromptTokens:
        if self.boost_eos and not self._eos:
            raise no_eos("CiteFromPrompt")
        prompt = prompt_ids.to("cpu", torch.int64)
        eos = torch.tensor(self._eos if self.boost_eos else (), dtype=torch.int64)
        boosted = torch.unique(torch.cat([prompt, eos]))
        followers: dict[int, torch.Tensor] = {}
        if self.conditional_boost_factor != 0 and prompt.numel() > 1:
            pairs = torch.unique(torch.stack([prompt[:-1], prompt[1:]], 1), dim=0)
            leaders, counts = torch.unique_consecutive(pairs[:, 0], return_counts=True)
            split = torch.split(pairs[:, 1], counts.tolist())
            followers = dict(zip(leaders.tolist(), split, strict=True))
        return _PromptTokens(boosted, followers, None)

    def advance(self, state: _PromptTokens, token_id: int) -> _PromptTokens:
        return state._replace(last_token=token_id)

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        states = batch.states(self)
        _add_per_row(logits, [state.boosted for state in states], self.boost_factor)
        if self.conditional_boost_factor != 0:
            nothing = states[0].boosted[:0]
            followers = [
                nothing if state.last_token is None else state.followers.get(state.last_token)
                for state in states
            ]
            _add_per_row(
                logits,
                [nothing if ids is None else ids for ids in followers],
                self.conditional_boost_factor,
            )
        return logits


def _add_per_row(logits: torch.Tensor, ids_per_row: list[torch.Tensor], value: float) -> None:
    """Add ``value`` to row ``b``'s distinct ``ids_per_row[b]`` (ids past the row skipped),
    with the zoo's ``scores[i, ids] += value`` arithmetic, reading nothing on the host."""
    counts = [ids.numel() for ids in ids_per_row]
    total = sum(counts)
    if not total:
        return
    host_rows = torch.repeat_interleave(
        torch.arange(len(counts)), torch.tensor(counts), output_size=total
    )
    device = logits.device
    # The states' ids are host tensors: one copy to the device for rows and columns.
    rows, columns = to_device(torch.stack([host_rows, torch.cat(ids_per_row)]), device).unbind()
    # An id past the row is replaced by the row's largest id (boosted anyway: the write
    # repeats), or, in a row without one, written back unchanged.
    inside = columns < logits.shape[1]
    largest = torch.full((len(counts),), -1, dtype=columns.dtype, device=device)
    largest = largest.scatter_reduce_(0, rows, torch.where(inside, columns, -1), reduce="amax")[
        rows
    ]
    index = (rows, torch.where(inside, columns, largest.clamp(min=0)))
    values = logits[index]
    logits[index] = torch.where(largest >= 0, values + value, values)
