"""Forcing: leave only chosen tokens possible. A phrase at the start of the answer
(:class:`ForceSequence`), after a trigger (:class:`TriggerPhrase`) or before the end
(:class:`ForceLastPhrase`); one of a question's choice labels (:class:`MultipleChoice`).

Oracles: NVIDIA's logits-processor-zoo ``TriggerPhraseLogitsProcessor``,
``ForceLastPhraseLogitsProcessor``, ``MultipleChoiceLogitsProcessor`` (with
``strict=False``). How and why ours differ from the zoo (per-sequence state, strict
forcing, text, dropped parameters) and why classifier-free guidance is not in the
catalogue: docs/design-notes.md.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import torch

from anylogits.core.batch import Batch
from anylogits.core.limits import check_items
from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor
from anylogits.core.sync import host_sync_allowed
from anylogits.core.transfer import host_tensor_to, to_device
from anylogits.core.vocab import Vocabulary
from anylogits.processors._checks import (
    TextOrIds,
    as_config,
    boolean,
    encode,
    finite_float,
    int_at_least,
    single_token,
    text_or_ids,
    token_or_text,
)
from anylogits.processors._ops import TokenColumns, eos_columns, eos_ids, minus_inf, no_eos


def force(
    logits: torch.Tensor, columns: torch.Tensor, strict: bool, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Leave only ``columns`` (``(R, K)``, one line per forced row) possible, in place.

    Args:
        logits: ``(B, V)``.
        columns: the allowed token ids of each forced row.
        strict: ``-inf`` for every other token; else the zoo's ``enforce_tokens``.
        rows: ``(R,)`` the forced rows; ``None`` means every row (``R == B``).
    """
    part = logits if rows is None else logits.index_select(0, rows)
    chosen = part.gather(1, columns)
    if strict:
        part.fill_(float("-inf"))
    else:
        # The zoo's operations, in its order and dtype, so results are bit-identical.
        gap = part.amax(1) - chosen.amin(1)
        chosen += gap[:, None]
        part.copy_(part.amin(1, keepdim=True).expand_as(part))
    part.scatter_(1, columns, chosen)
    if rows is not None:
        logits.index_copy_(0, rows, part)
    return logits


def force_where(
    logits: torch.Tensor, columns: torch.Tensor, strict: bool, forcing: torch.Tensor
) -> torch.Tensor:
    """:func:`force` on the rows where ``forcing`` (``(B,)`` bool) holds, in place.

    ``columns`` (``(B, K)``) holds a line for every row; those of rows not forced are
    ignored. Where reading ``forcing`` on the host is not free (see
    :func:`host_sync_allowed`), every row is computed and the forced ones kept: the same
    values, no host read.
    """
    if host_sync_allowed(forcing):
        rows = forcing.nonzero().squeeze(1)
        if rows.numel() == 0:
            return logits
        return force(logits, columns[rows], strict, rows)
    if strict:
        # Rows not forced get their own logits written back at ``columns``.
        chosen = logits.gather(1, columns)
        torch.where(forcing[:, None], minus_inf(logits), logits, out=logits)
        return logits.scatter_(1, columns, chosen)
    forced = force(logits.clone(), columns, strict)
    return torch.where(forcing[:, None], forced, logits, out=logits)


class ForceSequence(LogitsProcessor):
    """Force the first generated tokens to be ``phrase``, one per step.

    At the ``g``-th generated position (from 0) the processor forces ``phrase[g]`` while
    ``g < len(phrase)``, then leaves the model free: a forced opening such as
    ``"```json\\n"`` or ``"<think>\\n"``. The position is the row's generated length, so no
    state is needed. Like the zoo it counts positions: it does not check that earlier
    forced tokens were taken (they always are with ``strict=True``).

    Oracle: logits-processor-zoo ``TriggerPhraseLogitsProcessor`` fired at the first step
    (a ``trigger_time`` of a nanosecond), with ``strict=False`` (identical result).

    Args:
        phrase: the text (encoded with the model's tokenizer, no special tokens added) or
            the token ids to force.
        strict: every other token becomes ``-inf``; ``False`` uses the zoo's arithmetic
            (forced token raised to the row maximum, the rest lowered to the row minimum).

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.forcing import ForceSequence
        >>> pipeline = Pipeline([ForceSequence([2, 0])])
        >>> pipeline(torch.zeros(1, 3), torch.tensor([[1]]))  # first call: the prompt
        tensor([[-inf, -inf, 0.]])
        >>> pipeline(torch.zeros(1, 3), torch.tensor([[1, 2]]))
        tensor([[0., -inf, -inf]])
        >>> pipeline(torch.zeros(1, 3), torch.tensor([[1, 2, 0]]))  # phrase done
        tensor([[0., 0., 0.]])
    """

    spec_name = "force_sequence"
    needs_sequences = True

    def __init__(self, phrase: TextOrIds, strict: bool = True) -> None:
        self.phrase = text_or_ids("phrase", phrase)
        self.strict = boolean("strict", strict)
        self._columns: TokenColumns | None = None

    def config(self) -> dict[str, Any]:
        return {"phrase": as_config(self.phrase), "strict": self.strict}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        self._columns = TokenColumns(
            "phrase", encode("ForceSequence", "phrase", self.phrase, vocab)
        )

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        assert self._columns is not None, "bind() first (Pipeline does)"
        phrase = self._columns.for_logits(logits)
        generated = to_device(batch.generated_lengths, logits.device)
        forced = phrase[generated.clamp(0, phrase.shape[0] - 1), None]
        return force_where(logits, forced, self.strict, generated < phrase.shape[0])


class _Forcing(NamedTuple):
    """Where one sequence stands with a triggered phrase (a value: never mutated)."""

    position: int  # the phrase token to force at the next step; -1: none
    remaining: int  # triggers left
    tail: bytes | tuple[int, ...]  # generated text since the last phrase that a match may need
    prefix: int  # hash of the sequence's tokens (replacing triggers only, else 0)


# Decisions kept per processor: a few steps' worth for the largest batches engines run.
_DECISIONS_KEPT = 1 << 16


class _PhraseOnTrigger(StatefulLogitsProcessor[_Forcing]):
    """Force ``phrase`` token by token once a trigger fires, up to ``count`` times.

    Two kinds of trigger: a *following* one fires once the generated text contains the
    trigger, and the phrase starts at the next step; its state follows from the tokens
    alone. A *replacing* one fires when the model's top choice for the next token is a
    trigger token, and the phrase's first token is forced in its place. That depends on
    the logits, which ``advance`` never sees, and the token cannot tell a forced first
    phrase token from the model choosing it. So ``process`` records its decision under
    the hash of the row's token prefix, and ``advance`` looks it up. The decision is a
    function of the prefix (the same tokens give the same logits), so rows that share a
    prefix (beams) agree, a rollback finds the decision that produced the next token,
    and so does a replay of tokens this processor saw (an engine committing accepted
    draft tokens, a resumed sequence). A prefix ``process`` never saw counts as "not
    forced". The last :data:`_DECISIONS_KEPT` decisions are kept.
    """

    owner: ClassVar[str]
    strict: bool

    def _setup(self, phrase: str | tuple[int, ...], count: int, replaces: bool) -> None:
        self._phrase = phrase
        self._count = count
        self._replaces = replaces
        self._phrase_ids: tuple[int, ...] = ()
        self._phrase_columns: TokenColumns | None = None
        self._trigger_columns = TokenColumns("trigger", ())
        self._trigger_key: bytes | tuple[int, ...] = b""
        self._tokens: tuple[bytes, ...] = ()
        self._top_was_trigger: dict[int, bool] = {}

    def _bind_phrase(self, vocab: Vocabulary | None) -> None:
        self._phrase_ids = encode(self.owner, "phrase", self._phrase, vocab)
        self._phrase_columns = TokenColumns("phrase", self._phrase_ids)
        self._top_was_trigger.clear()  # decisions of another model's logits

    def init_state(self, prompt_ids: torch.Tensor) -> _Forcing:
        prefix = hash(tuple(prompt_ids.tolist())) if self._replaces else 0
        return _Forcing(-1, self._count, self._trigger_key[:0], prefix)

    def advance(self, state: _Forcing, token_id: int) -> _Forcing:
        if state.remaining == 0:
            return state  # done for good: nothing to match, nothing to decide
        empty = self._trigger_key[:0]
        prefix = hash((state.prefix, token_id)) if self._replaces else 0
        if state.position >= 0:
            return self._after_phrase_token(state.position, state.remaining, prefix)
        if self._replaces:
            if self._top_was_trigger.get(state.prefix, False):  # phrase[0] was forced here
                return self._after_phrase_token(0, state.remaining, prefix)
            return _Forcing(-1, state.remaining, empty, prefix)
        tail, fired = self._matched(state.tail, token_id)
        return _Forcing(0 if fired else -1, state.remaining, empty if fired else tail, prefix)

    def _after_phrase_token(self, position: int, remaining: int, prefix: int) -> _Forcing:
        empty = self._trigger_key[:0]
        if position + 1 < len(self._phrase_ids):
            return _Forcing(position + 1, remaining, empty, prefix)
        # Phrase complete: only text generated after it can trigger again.
        return _Forcing(-1, remaining - 1, empty, prefix)

    def _matched(
        self, tail: bytes | tuple[int, ...], token_id: int
    ) -> tuple[bytes | tuple[int, ...], bool]:
        trigger = self._trigger_key
        if isinstance(trigger, bytes):
            piece = self._tokens[token_id] if token_id < len(self._tokens) else b""
            text: bytes | tuple[int, ...] = tail + piece  # type: ignore[operator]
            # The tail holds no match (it would have fired), so any match is new.
            fired = trigger in text
        else:
            text = (*tail, token_id)
            fired = text[len(text) - len(trigger) :] == trigger
        keep = len(trigger) - 1
        return text[len(text) - keep :] if keep else text[:0], fired

    def _remember(self, prefix: int, top_was_trigger: bool) -> None:
        decisions = self._top_was_trigger
        decisions.pop(prefix, None)
        decisions[prefix] = top_was_trigger
        if len(decisions) > _DECISIONS_KEPT:
            del decisions[next(iter(decisions))]

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        assert self._phrase_columns is not None, "bind() first (Pipeline does)"
        states = batch.states(self)
        positions = [state.position for state in states]
        watching = (
            [state.position < 0 and state.remaining > 0 for state in states]
            if self._replaces
            else []
        )
        if max(positions) < 0 and not any(watching):
            return logits
        phrase = self._phrase_columns.for_logits(logits)
        position = host_tensor_to(positions, logits.device)
        forcing = position >= 0
        forced = phrase[position.clamp(min=0)]
        if any(watching):
            if not self._trigger_columns.ids:
                raise no_eos(self.owner)
            triggers = self._trigger_columns.for_logits(logits)
            # Not torch.isin: with many EOS ids it sorts, and reads the device, on CUDA.
            starts = (logits.argmax(1)[:, None] == triggers).any(1)
            starts &= host_tensor_to(watching, logits.device)
            # The one device read: whether the trigger was the top choice goes into the
            # host state (advance looks the decision up).
            for state, watched, started in zip(states, watching, starts.tolist(), strict=True):
                if watched:
                    self._remember(state.prefix, started)
            forcing |= starts
            forced = torch.where(starts, phrase[0], forced)
        return force_where(logits, forced[:, None], self.strict, forcing)


class TriggerPhrase(_PhraseOnTrigger):
    """Force ``phrase`` when a trigger appears, up to ``trigger_count`` times.

    ``trigger_after=False`` (the zoo's default): the trigger is one token; when it is the
    model's top choice (the argmax of the logits this processor receives), the phrase's
    first token is forced in its place, then the rest of the phrase. ``trigger_after=True``:
    once the generated text contains the trigger, the phrase is forced from the next
    step. A text trigger is then matched on the generated *bytes*, so it fires however
    the model tokenized it (also inside a token, or across several); a list of ids fires
    when the generated ids end with it. Only generated tokens count, and after a phrase
    only text generated after it. Like the zoo, a started phrase is forced to its end,
    one token per step, without checking that earlier forced tokens were taken.

    Oracle: logits-processor-zoo ``TriggerPhraseLogitsProcessor`` with ``strict=False``
    (identical under greedy decoding). Differences: the zoo's ``trigger_after=True``
    fires when the trigger is the model's top choice, ours when it is generated (the
    same token under greedy decoding, not under sampling); the zoo takes one trigger
    token, ours any text or id sequence in that mode; ``trigger_time`` is not supported
    (see docs/design-notes.md).

    Args:
        trigger: text or token ids (one token when ``trigger_after`` is False).
        phrase: text (encoded with the model's tokenizer) or token ids to force.
        trigger_count: how many times the phrase may be forced, >= 1.
        trigger_after: see above.
        strict: every other token becomes ``-inf``; ``False`` uses the zoo's arithmetic.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.forcing import TriggerPhrase
        >>> pipeline = Pipeline([TriggerPhrase([1], [3, 0])])
        >>> pipeline(torch.tensor([[0.0, 5.0, 0.0, 0.0]]), torch.tensor([[2]]))  # wants 1
        tensor([[-inf, -inf, -inf, 0.]])
        >>> pipeline(torch.zeros(1, 4), torch.tensor([[2, 3]]))
        tensor([[0., -inf, -inf, -inf]])
    """

    spec_name = "trigger_phrase"
    owner = "TriggerPhrase"

    def __init__(
        self,
        trigger: TextOrIds,
        phrase: TextOrIds,
        trigger_count: int = 1,
        trigger_after: bool = False,
        strict: bool = True,
    ) -> None:
        self.trigger = text_or_ids("trigger", trigger)
        self.phrase = text_or_ids("phrase", phrase)
        self.trigger_count = int_at_least("trigger_count", trigger_count, 1)
        self.trigger_after = boolean("trigger_after", trigger_after)
        self.strict = boolean("strict", strict)
        if not self.trigger_after and isinstance(self.trigger, tuple) and len(self.trigger) > 1:
            raise ValueError(
                "trigger must be one token when trigger_after is False (it stands for the "
                f"model's next token), got {len(self.trigger)} ids {list(self.trigger)}"
            )
        self._setup(self.phrase, self.trigger_count, replaces=not self.trigger_after)

    def config(self) -> dict[str, Any]:
        return {
            "trigger": as_config(self.trigger),
            "phrase": as_config(self.phrase),
            "trigger_count": self.trigger_count,
            "trigger_after": self.trigger_after,
            "strict": self.strict,
        }

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        self._bind_phrase(vocab)
        trigger = self.trigger
        if self._replaces:
            one = trigger if isinstance(trigger, str) else trigger[0]
            token_id = single_token(self.owner, "trigger", one, vocab)
            self._trigger_columns = TokenColumns("trigger", (token_id,))
        elif isinstance(trigger, str):
            if vocab is None:
                raise ValueError(
                    f"TriggerPhrase matches the text trigger {trigger!r} on decoded tokens: "
                    "give the adapter the model's tokenizer, or pass token ids"
                )
            self._trigger_key = trigger.encode("utf-8")
            self._tokens = vocab.tokens
        else:
            encode(self.owner, "trigger", trigger, vocab)  # range check
            self._trigger_key = trigger


class ForceLastPhrase(_PhraseOnTrigger):
    """Say ``phrase`` before ending: when the model's top choice is EOS, force the phrase.

    The first time the model's top choice (the argmax of the logits this processor
    receives) is an EOS token, the phrase's first token is forced in its place, then the
    rest of the phrase, one token per step. Afterwards the model is free: it may end, or
    go on. It happens once per sequence.

    Oracle: logits-processor-zoo ``ForceLastPhraseLogitsProcessor`` with ``strict=False``
    (identical result). Differences: any of several EOS ids triggers (the zoo checks the
    tokenizer's one ``eos_token_id``).

    Args:
        phrase: text (encoded with the model's tokenizer) or token ids to force.
        eos_token_id: the id(s) whose top rank triggers; defaults to the bound
            vocabulary's EOS ids.
        strict: every other token becomes ``-inf``; ``False`` uses the zoo's arithmetic.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.forcing import ForceLastPhrase
        >>> pipeline = Pipeline([ForceLastPhrase([1, 2], eos_token_id=3)])
        >>> pipeline(torch.tensor([[0.0, 0.0, 0.0, 9.0]]), torch.tensor([[0]]))  # wants EOS
        tensor([[-inf, 0., -inf, -inf]])
        >>> pipeline(torch.tensor([[0.0, 0.0, 0.0, 9.0]]), torch.tensor([[0, 1]]))
        tensor([[-inf, -inf, 0., -inf]])
        >>> pipeline(torch.tensor([[0.0, 0.0, 0.0, 9.0]]), torch.tensor([[0, 1, 2]]))
        tensor([[0., 0., 0., 9.]])
    """

    spec_name = "force_last_phrase"
    owner = "ForceLastPhrase"

    def __init__(
        self,
        phrase: TextOrIds,
        eos_token_id: int | list[int] | None = None,
        strict: bool = True,
    ) -> None:
        self.phrase = text_or_ids("phrase", phrase)
        self.eos_token_id = eos_ids(eos_token_id)
        self.strict = boolean("strict", strict)
        self._setup(self.phrase, 1, replaces=True)

    def config(self) -> dict[str, Any]:
        eos = None if self.eos_token_id is None else list(self.eos_token_id)
        return {"phrase": as_config(self.phrase), "eos_token_id": eos, "strict": self.strict}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        self._bind_phrase(vocab)
        self._trigger_columns = eos_columns(self.owner, self.eos_token_id, vocab)


class MultipleChoice(StatefulLogitsProcessor[tuple[int, ...]]):
    """Answer with one of the choice labels: only their tokens stay possible, every step.

    With ``boost_first_words``, each label also gets ``boost_first_words`` times the
    logit of its option's first word, found in the prompt as a line ``"<label><delimiter>
    <first word> ..."`` (a token ending in a newline, the label, the delimiter, then the
    word's token; labels are searched in order, each after the previous one, as the zoo
    does). It helps models that know the answer's text better than its label.

    Oracle: logits-processor-zoo ``MultipleChoiceLogitsProcessor`` with ``strict=False``
    (identical result). Differences: labels and the delimiter must each be one token
    (the zoo takes the last of up to two); two labels may not share a token; the
    prompt is each sequence's own (the zoo reads the left-padded first call).

    Args:
        choices: the labels, as one token's text each or as token ids; default
            ``["1", "2", "3", "4"]`` (the zoo's).
        delimiter: the one token after a label in the prompt (text or id), used by
            ``boost_first_words``.
        boost_first_words: finite; 0 turns the prompt search off.
        strict: every other token becomes ``-inf``; ``False`` uses the zoo's arithmetic
            (labels raised together so the lowest ties the row maximum, the rest lowered
            to the row minimum).

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.forcing import MultipleChoice
        >>> pipeline = Pipeline([MultipleChoice([1, 3])])
        >>> pipeline(torch.tensor([[4.0, 1.0, 3.0, 2.0]]), torch.tensor([[0]]))
        tensor([[-inf, 1., -inf, 2.]])
    """

    spec_name = "multiple_choice"

    def __init__(
        self,
        choices: list[str] | list[int] | None = None,
        delimiter: str | int = ".",
        boost_first_words: float = 0.0,
        strict: bool = True,
    ) -> None:
        if choices is None:
            choices = ["1", "2", "3", "4"]
        if isinstance(choices, (str, bytes)) or not isinstance(choices, (list, tuple)):
            raise ValueError(f"choices must be a list of labels, got {choices!r}")
        if not choices:
            raise ValueError("choices must hold at least one label")
        check_items("choices", choices)
        self.choices = [token_or_text(f"choices[{i}]", c) for i, c in enumerate(choices)]
        self.delimiter = token_or_text("delimiter", delimiter)
        self.boost_first_words = finite_float("boost_first_words", boost_first_words)
        self.strict = boolean("strict", strict)
        self._columns: TokenColumns | None = None
        self._delimiter_id = -1
        self._newline: torch.Tensor | None = None

    def config(self) -> dict[str, Any]:
        return {
            "choices": list(self.choices),
            "delimiter": self.delimiter,
            "boost_first_words": self.boost_first_words,
            "strict": self.strict,
        }

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        ids = [
            single_token("MultipleChoice", f"choices[{i}]", choice, vocab)
            for i, choice in enumerate(self.choices)
        ]
        if len(set(ids)) != len(ids):
            raise ValueError(f"MultipleChoice: two choices are the same token: {ids}")
        self._columns = TokenColumns("choices", tuple(ids))
        if self.boost_first_words:
            if vocab is None:
                raise ValueError(
                    "MultipleChoice finds newline tokens in the vocabulary for "
                    "boost_first_words: give the adapter the model's tokenizer"
                )
            self._delimiter_id = single_token("MultipleChoice", "delimiter", self.delimiter, vocab)
            self._newline = torch.tensor([token.endswith(b"\n") for token in vocab.tokens])

    def init_state(self, prompt_ids: torch.Tensor) -> tuple[int, ...]:
        """The first-word token of each choice found in the prompt, in choice order."""
        if not self.boost_first_words:
            return ()
        assert self._columns is not None and self._newline is not None
        prompt = prompt_ids.to("cpu", torch.int64)
        if prompt.numel() < 4:
            return ()
        heads = prompt[:-3]
        newline = self._newline[heads.clamp(max=self._newline.numel() - 1)]
        newline &= heads < self._newline.numel()
        starts = (newline & (prompt[2:-1] == self._delimiter_id)).nonzero().squeeze(1).tolist()
        labels, ids = self._columns.ids, prompt.tolist()
        first_words: list[int] = []
        for start in starts:
            if ids[start + 1] == labels[len(first_words)]:
                first_words.append(ids[start + 3])
                if len(first_words) == len(labels):
                    break
        return tuple(first_words)

    def advance(self, state: tuple[int, ...], token_id: int) -> tuple[int, ...]:
        return state

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        assert self._columns is not None, "bind() first (Pipeline does)"
        columns = self._columns.for_logits(logits).expand(logits.shape[0], -1)
        if self.boost_first_words:
            states = batch.states(self)
            width = len(self._columns.ids)
            words = host_tensor_to(
                [list(state) + [-1] * (width - len(state)) for state in states],
                logits.device,
                torch.int64,
            )
            found = (words >= 0) & (words < logits.shape[1])
            boost = logits.gather(1, words.clamp(0, logits.shape[1] - 1)) * self.boost_first_words
            labels = logits.gather(1, columns)
            logits.scatter_(1, columns, torch.where(found, labels + boost, labels))
        return force(logits, columns, self.strict)
