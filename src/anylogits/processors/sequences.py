"""Processors that read token sequences: banned and biased sequences, a length decay
towards EOS, and stop strings that end generation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from anylogits.core.batch import Batch
from anylogits.core.limits import check_items, check_text
from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor
from anylogits.core.vocab import Vocabulary
from anylogits.processors._checks import (
    finite_float,
    ids_within,
    int_at_least,
    positive_float,
    token_id_list,
)
from anylogits.processors._forcing import encode
from anylogits.processors.control import _eos_columns, _eos_ids, _no_eos, _TokenColumns
from anylogits.processors.sampling import opmath


class _SequenceEnds:
    """Token sequences, each matched against the end of every row's history at once.

    A sequence of one token always applies. A longer one applies to its last token when
    the history ends with the rest (its prefix). Prefixes are stored right-aligned in one
    ``(N, P)`` tensor, so all of them are compared with the last ``P`` columns of the
    history in a single ``(B, N, P)`` comparison.
    """

    def __init__(self, name: str, sequences: Sequence[tuple[int, ...]]) -> None:
        self.single = [index for index, s in enumerate(sequences) if len(s) == 1]
        self.longer = [index for index, s in enumerate(sequences) if len(s) > 1]
        self.single_ids = _TokenColumns(name, tuple(sequences[i][0] for i in self.single))
        self.last_ids = _TokenColumns(name, tuple(sequences[i][-1] for i in self.longer))
        self.width = max((len(sequences[i]) - 1 for i in self.longer), default=0)
        # -1 left of a shorter prefix marks "any token"; history ids are never negative.
        self._prefixes = torch.tensor(
            [
                [-1] * (self.width + 1 - len(sequences[i])) + list(sequences[i][:-1])
                for i in self.longer
            ],
            dtype=torch.int64,
        ).reshape(len(self.longer), self.width)
        self._prefix_lengths = torch.tensor(
            [len(sequences[i]) - 1 for i in self.longer], dtype=torch.int64
        )
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def completed_by_last(self, batch: Batch, device: torch.device) -> torch.Tensor:
        """``(B, N)`` bool: row ``b``'s history ends with the prefix of longer sequence ``n``."""
        prefixes, wildcard, prefix_lengths = self._tensors(device)
        history = batch.token_ids
        tail = history[:, max(history.shape[1] - self.width, 0) :].to(device)
        if tail.shape[1] < self.width:
            # A history shorter than a prefix cannot end with it: pad with an id never used.
            tail = torch.nn.functional.pad(tail, (self.width - tail.shape[1], 0), value=-1)
        equal = (tail[:, None, :] == prefixes) | wildcard
        # Ragged rows: columns left of a row's start are padding, not tokens.
        long_enough = batch.lengths.to(device)[:, None] >= prefix_lengths
        return equal.all(dim=-1) & long_enough

    def _tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cached = self._on_device.get(device)
        if cached is None:
            prefixes = self._prefixes.to(device)
            cached = (prefixes, prefixes < 0, self._prefix_lengths.to(device))
            self._on_device[device] = cached
        return cached


def _sequence(name: str, value: Any) -> tuple[int, ...]:
    ids = token_id_list(name, value, "sequence_tokens")
    if not ids:
        raise ValueError(f"{name} must hold at least one token id, got {value!r}")
    return ids


class BadWords(LogitsProcessor):
    """Never generate the given token sequences.

    A one-token entry is always banned. A longer entry bans its last token whenever the
    history (prompt included) ends with the rest of it, so the whole sequence can never
    be completed.

    A string entry is tokenized with the bound vocabulary's tokenizer exactly as given
    (no special tokens, no space added): ``"foo"`` and ``" foo"`` are different token
    sequences in most vocabularies, so ban both where a word may start a sentence or
    follow a space. A vocabulary without a tokenizer (``Vocabulary.encode`` is ``None``,
    e.g. one built from token bytes only) cannot resolve strings: binding then raises
    ``ValueError`` asking for token ids, rather than guessing a tokenization.

    Oracle: transformers ``NoBadWordsLogitsProcessor`` (identical result), except that
    transformers' ``generate`` drops a one-token entry equal to an EOS id; ours bans it.
    vLLM's ``bad_words`` differs in two ways: it strips a word's leading spaces and also
    bans the space-prefixed tokenization (when that has the same length and another first
    token), and it matches prefixes against generated tokens only, not the prompt.

    Args:
        words: entries to ban, each a list of token ids or a string.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.sequences import BadWords
        >>> history = torch.tensor([[4, 1], [4, 2]])  # row 0 ends with 1: [1, 3] is banned
        >>> Pipeline([BadWords([[0], [1, 3]])])(torch.zeros(2, 4), history)
        tensor([[-inf, 0., 0., -inf],
                [-inf, 0., 0., 0.]])
    """

    spec_name = "bad_words"

    def __init__(self, words: list[list[int] | str]) -> None:
        if isinstance(words, (str, bytes)) or not isinstance(words, (list, tuple)):
            raise ValueError(f"words must be a list of token-id lists or strings, got {words!r}")
        check_items("words", words)
        entries: list[tuple[int, ...] | str] = []
        for index, word in enumerate(words):
            if isinstance(word, str):
                if not word:
                    raise ValueError(f"words[{index}] is an empty string")
                check_text(f"words[{index}]", word)
                entries.append(word)
            else:
                entries.append(_sequence(f"words[{index}]", word))
        self.words = tuple(entries)
        self._ends: _SequenceEnds | None = None
        if not any(isinstance(word, str) for word in entries):
            self._ends = _SequenceEnds("words", entries)  # type: ignore[arg-type]

    def config(self) -> dict[str, Any]:
        return {"words": [w if isinstance(w, str) else list(w) for w in self.words]}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        sequences = [
            encode("BadWords", f"words[{index}]", word, vocab)
            for index, word in enumerate(self.words)
        ]
        self._ends = _SequenceEnds("words", sequences)

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        ends = self._ends
        if ends is None:
            raise ValueError("BadWords holds strings, so it must be bound to a vocabulary first")
        if ends.single:
            logits.index_fill_(1, ends.single_ids.on(logits), float("-inf"))
        if ends.longer:
            last = ends.last_ids.on(logits)
            completed = ends.completed_by_last(batch, logits.device)
            # amin with +inf leaves a logit alone, with -inf bans it; duplicates are harmless.
            banned = torch.full(
                completed.shape, float("inf"), dtype=logits.dtype, device=logits.device
            ).masked_fill_(completed, float("-inf"))
            logits.scatter_reduce_(1, last.expand_as(banned), banned, reduce="amin")
        return logits


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
        >>> from anylogits.processors.sequences import SequenceBias
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
            sequence = _sequence(f"biases[{index}][0]", pair[0])
            bias = finite_float(f"biases[{index}][1]", pair[1])
            if sequence in pairs:
                raise ValueError(f"biases[{index}] repeats the sequence {list(sequence)}")
            pairs[sequence] = bias
        self.biases = pairs
        sequences, values = list(pairs), list(pairs.values())
        self._ends = _SequenceEnds("biases", sequences)
        # Each biased column once; every entry adds into its column's slot.
        columns = list(dict.fromkeys(sequence[-1] for sequence in sequences))
        self._columns = _TokenColumns("biases", tuple(columns))
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
        columns = self._columns.on(logits)
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
                return torch.tensor(values, dtype=torch.int64, device=device)

            def floats(values: list[float]) -> torch.Tensor:
                return torch.tensor(values, dtype=dtype, device=device)

            single_slots, single_values = self._single
            tensors = self._tensors[key] = (
                (ids(single_slots), floats(single_values)),
                [(ids(p), ids(s), floats(v)) for p, s, v in self._groups],
            )
        return tensors


class ExponentialDecayLength(LogitsProcessor):
    """Raise the EOS logit exponentially once ``start_index`` tokens were generated.

    After ``n > start_index`` generated tokens, each EOS logit ``x`` becomes
    ``x + |x| * (decay_factor ** (n - start_index) - 1)``: shorter sequences without a
    hard cut-off. Counts per sequence, so rows may differ in length.

    Oracle: transformers ``ExponentialDecayLengthPenalty`` (identical result). Its
    ``start_index`` counts from the prompt length it is given; ours counts generated
    tokens of each sequence, which is the same thing.

    Args:
        start_index: generated tokens before the decay starts, >= 0.
        decay_factor: base of the exponential, > 0 (> 1 favours EOS, < 1 disfavours it).
        eos_token_id: the id(s) to raise; defaults to the bound vocabulary's EOS ids.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.sequences import ExponentialDecayLength
        >>> pipeline = Pipeline([ExponentialDecayLength(0, 2.0, eos_token_id=2)])
        >>> pipeline(torch.full((1, 3), -1.0), torch.tensor([[7, 8]]))  # the prompt
        tensor([[-1., -1., -1.]])
        >>> pipeline(torch.full((1, 3), -1.0), torch.tensor([[7, 8, 0]]))  # one generated
        tensor([[-1., -1.,  0.]])
    """

    spec_name = "exponential_decay_length"
    needs_sequences = True

    def __init__(
        self, start_index: int, decay_factor: float, eos_token_id: int | list[int] | None = None
    ) -> None:
        self.start_index = int_at_least("start_index", start_index, 0)
        self.decay_factor = positive_float("decay_factor", decay_factor)
        self.eos_token_id = _eos_ids(eos_token_id)
        self._columns = _TokenColumns("eos_token_id", self.eos_token_id or ())

    def config(self) -> dict[str, Any]:
        eos = None if self.eos_token_id is None else list(self.eos_token_id)
        return {
            "start_index": self.start_index,
            "decay_factor": self.decay_factor,
            "eos_token_id": eos,
        }

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        self._columns = _eos_columns("ExponentialDecayLength", self.eos_token_id, vocab)

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self._columns.ids:
            raise _no_eos("ExponentialDecayLength")
        steps = (batch.generated_lengths - self.start_index).to(torch.float64)
        # In float64, as transformers' Python ``pow(decay_factor, steps) - 1`` is, then in
        # the precision torch multiplies logits by a Python float (see opmath).
        growth = opmath(torch.pow(self.decay_factor, steps.clamp(min=0)) - 1, logits)
        columns = self._columns.on(logits)
        eos = logits.index_select(1, columns)
        penalty = (eos.to(growth.dtype).abs() * growth.to(logits.device)[:, None]).to(eos.dtype)
        active = (steps > 0).to(logits.device)[:, None] & eos.isfinite()
        return logits.index_copy_(1, columns, torch.where(active, eos + penalty, eos))


class _StopState(NamedTuple):
    tail: bytes  # the last generated bytes, as many as a stop string could still need
    stopped: bool  # a stop string was generated: only EOS from now on


_START = _StopState(b"", False)


class StopStrings(StatefulLogitsProcessor[_StopState]):
    """Force end-of-sequence once the generated text contains a stop string.

    Matches bytes, so a stop string may span any number of tokens and split multi-byte
    characters; a token that runs past the end of the stop string still stops. Only
    generated tokens count, not the prompt. The state keeps the last
    ``max(len(stop)) - 1`` generated bytes, so each token costs the same however long the
    sequence is. Special tokens count with their text. Once stopped, every later step
    allows only EOS: the EOS logits become 0 and all others ``-inf`` (as transformers'
    ``ForcedEOSTokenLogitsProcessor`` does).

    Oracle: transformers ``StopStringCriteria``, a stopping criterion: where it stops
    generation after a token, this forces EOS at the next step. It also matches stop
    strings that begin in the prompt; ours does not. vLLM's ``stop`` matches the decoded
    text (special tokens skipped by default) and cuts the stop string from the output,
    without generating EOS.

    Args:
        stop_strings: the strings (non-empty) that end generation; one string is one stop.
        eos_token_id: the id(s) to force; defaults to the bound vocabulary's EOS ids.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, Vocabulary
        >>> from anylogits.processors.sequences import StopStrings
        >>> vocab = Vocabulary(tokens=(b"s", b"to", b"p!", b"</s>"), eos_token_ids=frozenset({3}))
        >>> pipeline = Pipeline([StopStrings(["stop"])], vocab)
        >>> pipeline(torch.zeros(1, 4), torch.tensor([[2]]))  # the prompt
        tensor([[0., 0., 0., 0.]])
        >>> pipeline(torch.zeros(1, 4), torch.tensor([[2, 0, 1]]))  # "sto"
        tensor([[0., 0., 0., 0.]])
        >>> pipeline(torch.zeros(1, 4), torch.tensor([[2, 0, 1, 2]]))  # "stop!"
        tensor([[-inf, -inf, -inf, 0.]])
    """

    spec_name = "stop_strings"

    def __init__(
        self, stop_strings: list[str] | str, eos_token_id: int | list[int] | None = None
    ) -> None:
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        if not isinstance(stop_strings, (list, tuple)):
            raise ValueError(f"stop_strings must be a list of strings, got {stop_strings!r}")
        check_items("stop_strings", stop_strings)
        encoded: list[bytes] = []
        for index, stop in enumerate(stop_strings):
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop_strings[{index}] must be a non-empty string, got {stop!r}")
            check_text(f"stop_strings[{index}]", stop)
            try:
                encoded.append(stop.encode("utf-8"))
            except UnicodeEncodeError:
                raise ValueError(f"stop_strings[{index}] is not valid text: {stop!r}") from None
        self.stop_strings = tuple(stop_strings)
        self.eos_token_id = _eos_ids(eos_token_id)
        self._stops = tuple(dict.fromkeys(encoded))
        self._tail_length = max((len(stop) for stop in self._stops), default=1) - 1
        self._columns = _TokenColumns("eos_token_id", self.eos_token_id or ())
        self._tokens: tuple[bytes, ...] = ()
        self._forced_rows: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}

    def config(self) -> dict[str, Any]:
        eos = None if self.eos_token_id is None else list(self.eos_token_id)
        return {"stop_strings": list(self.stop_strings), "eos_token_id": eos}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        if vocab is None:
            raise ValueError(
                "StopStrings decodes generated tokens with the model's vocabulary: give "
                "the adapter the model's tokenizer (or Pipeline(..., vocab=...))"
            )
        self._columns = _eos_columns("StopStrings", self.eos_token_id, vocab)
        self._tokens = vocab.tokens
        self._forced_rows.clear()

    def init_state(self, prompt_ids: torch.Tensor) -> _StopState:
        return _START

    def advance(self, state: _StopState, token_id: int) -> _StopState:
        if state.stopped:
            return state
        # Ids past the tokenizer (padded logits) have no text.
        piece = self._tokens[token_id] if token_id < len(self._tokens) else b""
        text = state.tail + piece
        # The tail holds no stop string (it would have stopped), so any match is new.
        if any(stop in text for stop in self._stops):
            return _StopState(b"", True)
        return _StopState(text[max(len(text) - self._tail_length, 0) :], False)

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self._columns.ids:
            raise _no_eos("StopStrings")
        stopped = [state.stopped for state in batch.states(self)]
        if not any(stopped):
            return logits
        forced = self._forced_row(logits)
        rows = torch.tensor(stopped, device=logits.device)[:, None]
        return torch.where(rows, forced, logits, out=logits)

    def _forced_row(self, logits: torch.Tensor) -> torch.Tensor:
        key = (logits.shape[-1], logits.device, logits.dtype)
        row = self._forced_rows.get(key)
        if row is None:
            row = torch.full((1, key[0]), float("-inf"), dtype=logits.dtype, device=logits.device)
            row.index_fill_(1, self._columns.on(logits), 0.0)
            self._forced_rows[key] = row
        return row
