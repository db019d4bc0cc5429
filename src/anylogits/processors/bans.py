"""Bans: tokens that may never be generated, alone (:class:`SuppressTokens`), at the end
of a sequence (:class:`BadWords`) or completing an n-gram already present
(:class:`NoRepeatNGram`).

Oracles: transformers ``SuppressTokensLogitsProcessor``, ``NoBadWordsLogitsProcessor``,
``NoRepeatNGramLogitsProcessor``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.fast_paths import FastPaths, RowwiseProcessor
from anylogits.core.fused_forms import TokenListKind, TokenLists
from anylogits.core.limits import check_items, check_text
from anylogits.core.processor import LogitsProcessor
from anylogits.core.sync import host_sync_allowed
from anylogits.core.transfer import to_device
from anylogits.core.vocab import Vocabulary
from anylogits.processors._checks import (
    encode,
    ids_within,
    int_at_least,
    token_id_list,
    token_sequence,
)
from anylogits.processors._ops import RowColumns, SequenceEnds, TokenColumns, suppress_rows

if TYPE_CHECKING:
    from typing_extensions import Self


class SuppressTokens(FastPaths):
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
        self._columns = TokenColumns("token_ids", self.token_ids)

    def config(self) -> dict[str, Any]:
        return {"token_ids": list(self.token_ids)}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        if vocab is not None:
            ids_within("token_ids", self.token_ids, vocab.size, "vocabulary")

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not self.token_ids:
            return logits
        return logits.index_fill_(1, self._columns.for_logits(logits), float("-inf"))

    def fused_form(self) -> TokenLists:
        return self._columns.token_lists(TokenListKind.BANS)

    @classmethod
    def stack(cls, processors: Sequence[Self]) -> LogitsProcessor:
        index = RowColumns("token_ids", [list(p.token_ids) for p in processors])
        return RowwiseProcessor(
            suppress_rows, fused=index.token_lists(TokenListKind.BANS), index=index
        )


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
        >>> from anylogits.processors.bans import BadWords
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
                entries.append(token_sequence(f"words[{index}]", word))
        self.words = tuple(entries)
        self._ends: SequenceEnds | None = None
        if not any(isinstance(word, str) for word in entries):
            self._ends = SequenceEnds("words", entries)  # type: ignore[arg-type]

    def config(self) -> dict[str, Any]:
        return {"words": [w if isinstance(w, str) else list(w) for w in self.words]}

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        sequences = [
            encode("BadWords", f"words[{index}]", word, vocab)
            for index, word in enumerate(self.words)
        ]
        self._ends = SequenceEnds("words", sequences)

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        ends = self._ends
        if ends is None:
            raise ValueError("BadWords holds strings, so it must be bound to a vocabulary first")
        if ends.single:
            logits.index_fill_(1, ends.single_ids.for_logits(logits), float("-inf"))
        if ends.longer:
            last = ends.last_ids.for_logits(logits)
            completed = ends.completed_by_last(batch, logits.device)
            # amin with +inf leaves a logit alone, with -inf bans it; duplicates are harmless.
            banned = torch.full(
                completed.shape, float("inf"), dtype=logits.dtype, device=logits.device
            ).masked_fill_(completed, float("-inf"))
            logits.scatter_reduce_(1, last.expand_as(banned), banned, reduce="amin")
        return logits


class NoRepeatNGram(LogitsProcessor):
    """Forbid any token that would complete an n-gram the sequence already contains.

    Vectorized: every window of the history is compared with the last ``n - 1`` tokens
    at once, so the cost is one ``(B, L, n)`` comparison instead of a Python loop.

    Oracle: transformers ``NoRepeatNGramLogitsProcessor`` (identical result; like it,
    the prompt counts).

    Args:
        ngram_size: n, >= 1 (1 forbids every token already present).

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, NoRepeatNGram
        >>> history = torch.tensor([[5, 1, 2, 5]])  # "5 1" was seen: 1 may not follow 5
        >>> Pipeline([NoRepeatNGram(2)])(torch.zeros(1, 6), history)
        tensor([[0., -inf, 0., 0., 0., 0.]])
    """

    spec_name = "no_repeat_ngram"

    def __init__(self, ngram_size: int) -> None:
        self.ngram_size = int_at_least("ngram_size", ngram_size, 1, limit="ngram_size")

    def config(self) -> dict[str, Any]:
        return {"ngram_size": self.ngram_size}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        n = self.ngram_size
        ids = to_device(batch.token_ids, logits.device)
        width = ids.shape[1]
        if width < n:
            return logits
        windows = ids.unfold(1, n, 1)  # (B, W, n), W = L - n + 1
        matches = (windows[..., :-1] == ids[:, width - n + 1 :].unsqueeze(1)).all(-1)
        lengths = to_device(batch.lengths, ids.device)
        readable = host_sync_allowed(lengths)
        if not readable or lengths.min() < width:
            # A window must lie inside the row, and the row must hold n - 1 tokens.
            starts = torch.arange(windows.shape[1], device=ids.device)
            inside = (starts >= (width - lengths)[:, None]) & (lengths >= n)[:, None]
            matches &= inside
        followers = windows[..., -1]
        if not readable or int(followers.max()) >= logits.shape[-1]:
            # Ids beyond the logits (embedding wider than the LM head) cannot be banned.
            matches &= followers < logits.shape[-1]
            followers = followers.clamp(max=logits.shape[-1] - 1)
        # amin with +inf leaves a logit alone, with -inf bans it; duplicates are harmless.
        banned = torch.full(followers.shape, float("inf"), dtype=logits.dtype, device=ids.device)
        banned.masked_fill_(matches, float("-inf"))
        return logits.scatter_reduce_(1, followers, banned, reduce="amin")
