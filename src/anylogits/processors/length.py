"""Length: steer end-of-sequence with the answer's length. Forbid it early
(:class:`MinNewTokens`), raise it as the answer grows (:class:`ExponentialDecayLength`,
:class:`GenLength`), force it once a stop string was generated (:class:`StopStrings`).

Oracles: transformers ``MinNewTokensLengthLogitsProcessor``,
``ExponentialDecayLengthPenalty``, ``StopStringCriteria``; logits-processor-zoo
``GenLengthLogitsProcessor``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

from anylogits.core.batch import Batch
from anylogits.core.limits import check_items, check_text
from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor
from anylogits.core.transfer import host_tensor_to, to_device
from anylogits.core.vocab import Vocabulary
from anylogits.processors._checks import (
    boolean,
    encode,
    finite_float,
    int_at_least,
    positive_float,
    single_token,
    token_or_text,
)
from anylogits.processors._ops import TokenColumns, compute_dtype, eos_columns, eos_ids, no_eos


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
        self.eos_token_id = eos_ids(eos_token_id)
        self._columns = TokenColumns("eos_token_id", self.eos_token_id or ())

    def config(self) -> dict[str, Any]:
        eos = None if self.eos_token_id is None else list(self.eos_token_id)
        return {"min_new_tokens": self.min_new_tokens, "eos_token_id": eos}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        self._columns = eos_columns("MinNewTokens", self.eos_token_id, vocab)

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self._columns.ids:
            raise no_eos("MinNewTokens")
        too_short = to_device(batch.generated_lengths, logits.device) < self.min_new_tokens
        columns = self._columns.for_logits(logits)
        eos_logits = logits.index_select(1, columns).masked_fill_(too_short[:, None], float("-inf"))
        return logits.index_copy_(1, columns, eos_logits)


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
        >>> from anylogits.processors.length import ExponentialDecayLength
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
        self.eos_token_id = eos_ids(eos_token_id)
        self._columns = TokenColumns("eos_token_id", self.eos_token_id or ())

    def config(self) -> dict[str, Any]:
        eos = None if self.eos_token_id is None else list(self.eos_token_id)
        return {
            "start_index": self.start_index,
            "decay_factor": self.decay_factor,
            "eos_token_id": eos,
        }

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        self._columns = eos_columns("ExponentialDecayLength", self.eos_token_id, vocab)

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self._columns.ids:
            raise no_eos("ExponentialDecayLength")
        generated = to_device(batch.generated_lengths, logits.device)
        steps = (generated - self.start_index).to(torch.float64)
        # In float64, as transformers' Python ``pow(decay_factor, steps) - 1`` is, then in
        # the precision torch multiplies logits by a Python float (see compute_dtype).
        growth = (torch.pow(self.decay_factor, steps.clamp(min=0)) - 1).to(compute_dtype(logits))
        columns = self._columns.for_logits(logits)
        eos = logits.index_select(1, columns)
        penalty = (eos.to(growth.dtype).abs() * growth[:, None]).to(eos.dtype)
        active = (steps > 0)[:, None] & eos.isfinite()
        return logits.index_copy_(1, columns, torch.where(active, eos + penalty, eos))


class _LengthState(NamedTuple):
    boost_token_seen: bool  # a boosted token was generated: the boost stops
    ends_sentence: bool  # the last token ends a sentence (for complete_sentences)


_LENGTH_STATES = {
    (seen, ends): _LengthState(seen, ends) for seen in (False, True) for ends in (False, True)
}


class GenLength(StatefulLogitsProcessor[_LengthState]):
    """Raise (or lower) EOS with the answer's length: ``+ boost_factor * (n / 10) ** p``.

    ``n`` is the number of generated tokens of the row. The boost applies until a boosted
    token has been generated, and with ``complete_sentences`` only right after a token
    that ends a sentence (the last token of ``"It is a sentence."`` or of
    ``"It is a new line\\n"`` in the model's tokenizer, as the zoo picks them).

    Oracle: logits-processor-zoo ``GenLengthLogitsProcessor`` (identical result; like it,
    the boost is rounded to float32 before it is added, for any logits dtype; ``n ** p``
    is exact up to ``2 ** 63``, within an ulp beyond, computed on the logits' device).
    Differences: ``n`` is per row (the zoo uses one count for the batch); "a boosted
    token was generated" looks at generated tokens only (the zoo looks at the whole row
    before the first generated token, which matters only with ``p = 0``); ``boost_token``
    (the zoo's ``boost_token_str``) also takes a token id; without it every EOS id of the
    vocabulary is boosted (the zoo boosts the tokenizer's one).

    Args:
        boost_factor: finite; positive shortens answers, negative lengthens them (the zoo
            suggests [-1, 1]).
        p: the power of the length, an integer >= 0.
        complete_sentences: boost only after a sentence-ending token.
        boost_token: the token to boost instead of EOS (e.g. ``"</think>"``), as one
            token's text or id.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.length import GenLength
        >>> pipeline = Pipeline([GenLength(1.0, boost_token=2)])
        >>> _ = pipeline(torch.zeros(1, 3), torch.tensor([[0]]))  # the prompt
        >>> pipeline(torch.zeros(1, 3), torch.tensor([[0] + [1] * 20]))  # 20 generated
        tensor([[0., 0., 4.]])
    """

    spec_name = "gen_length"

    def __init__(
        self,
        boost_factor: float,
        p: int = 2,
        complete_sentences: bool = False,
        boost_token: int | str | None = None,
    ) -> None:
        self.boost_factor = finite_float("boost_factor", boost_factor)
        self.p = int_at_least("p", p, 0)
        self.complete_sentences = boolean("complete_sentences", complete_sentences)
        self.boost_token = (
            None if boost_token is None else token_or_text("boost_token", boost_token)
        )
        self._boosted = TokenColumns("boost_token", ())
        self._sentence_ends: frozenset[int] = frozenset()

    def config(self) -> dict[str, Any]:
        return {
            "boost_factor": self.boost_factor,
            "p": self.p,
            "complete_sentences": self.complete_sentences,
            "boost_token": self.boost_token,
        }

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        if self.boost_token is not None:
            boosted: tuple[int, ...] = (
                single_token("GenLength", "boost_token", self.boost_token, vocab),
            )
        else:
            boosted = tuple(sorted(vocab.eos_token_ids)) if vocab is not None else ()
            if vocab is not None and not boosted:
                raise ValueError("GenLength: the vocabulary has no EOS id; pass boost_token")
        self._boosted = TokenColumns("boost_token", boosted)
        if self.complete_sentences:
            self._sentence_ends = frozenset(
                encode("GenLength", "the sentence-end probe", text, vocab)[-1]
                for text in ("It is a sentence.", "It is a new line\n")
            )

    def init_state(self, prompt_ids: torch.Tensor) -> _LengthState:
        ends = int(prompt_ids[-1]) in self._sentence_ends if prompt_ids.numel() else False
        return _LENGTH_STATES[False, ends]

    def advance(self, state: _LengthState, token_id: int) -> _LengthState:
        seen = state.boost_token_seen or token_id in self._boosted.ids
        return _LENGTH_STATES[seen, token_id in self._sentence_ends]

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self._boosted.ids:
            raise no_eos("GenLength")
        enabled = [
            not state.boost_token_seen and (state.ends_sentence or not self.complete_sentences)
            for state in batch.states(self)
        ]
        counts = to_device(batch.generated_lengths, logits.device)
        # As the zoo: boost_factor * n**p / 10**p in float64 with n**p an exact integer
        # power (float pow may round), times "enabled" as a 0/1 factor (a disabled row adds
        # a signed 0), rounded to float32 once.
        powers = _exact_powers(counts, self.p)
        scale = float(10**self.p)
        factors = host_tensor_to(enabled, logits.device, torch.float64)
        boost = (factors * (self.boost_factor * powers / scale)).to(torch.float32)
        columns = self._boosted.for_logits(logits)  # distinct ids: one add per cell
        logits[:, columns] += boost[:, None]
        return logits


def _exact_powers(counts: torch.Tensor, p: int) -> torch.Tensor:
    """``float(n ** p)`` for each int64 ``n`` of ``counts``, where it lives: the int64
    power is exact and rounds to float64 once, as Python's ``float(n ** p)`` does, for
    ``|n ** p| < 2 ** 63`` (every generated length when ``p <= 2``; up to 2,097,151
    tokens for ``p = 3``). Beyond, float64 ``pow``, within an ulp of it."""
    exact = counts.pow(p).to(torch.float64)
    largest = _largest_exact_base(p)
    if largest is None:
        return exact
    approximate = counts.to(torch.float64).pow(p)
    return torch.where(counts.abs() <= largest, exact, approximate)


@functools.cache
def _largest_exact_base(p: int) -> int | None:
    """The largest ``n`` with ``n ** p < 2 ** 63``; ``None`` when every length fits
    (``p <= 2``: ``n < 2 ** 31``)."""
    if p <= 2:
        return None
    base = int(2 ** (63 / p))
    while base**p >= 2**63:
        base -= 1
    while (base + 1) ** p < 2**63:
        base += 1
    return base


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
        >>> from anylogits.processors.length import StopStrings
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
        self.eos_token_id = eos_ids(eos_token_id)
        self._stops = tuple(dict.fromkeys(encoded))
        self._tail_length = max((len(stop) for stop in self._stops), default=1) - 1
        self._columns = TokenColumns("eos_token_id", self.eos_token_id or ())
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
        self._columns = eos_columns("StopStrings", self.eos_token_id, vocab)
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
            raise no_eos("StopStrings")
        stopped = [state.stopped for state in batch.states(self)]
        if not any(stopped):
            return logits
        forced = self._forced_row(logits)
        rows = host_tensor_to(stopped, logits.device)[:, None]
        return torch.where(rows, forced, logits, out=logits)

    def _forced_row(self, logits: torch.Tensor) -> torch.Tensor:
        key = (logits.shape[-1], logits.device, logits.dtype)
        row = self._forced_rows.get(key)
        if row is None:
            row = torch.full((1, key[0]), float("-inf"), dtype=logits.dtype, device=logits.device)
            row.index_fill_(1, self._columns.for_logits(logits), 0.0)
            self._forced_rows[key] = row
        return row
