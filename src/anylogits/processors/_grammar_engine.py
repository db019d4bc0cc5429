"""The grammar engine behind the structured processors, behind one small interface.

llguidance does the matching (one matcher per sequence, masks filled in parallel on the
CPU into a packed ``(B, ceil(V/32))`` int32 bitmask); :func:`apply_bitmask` applies that
bitmask to the logits in one vectorized op on the logits' own device. Another engine
(xgrammar) would implement :class:`GrammarEngine` and nothing else would change.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

import torch

from anylogits.core.vocab import Vocabulary


class GrammarEngine(Protocol):
    """What the structured processors need from a grammar engine."""

    def check(self, grammar: str) -> None:
        """Raise ``ValueError`` naming the problem when ``grammar`` cannot compile."""

    def start(self, grammar: str, vocab: Vocabulary) -> Any:
        """A fresh matcher of ``grammar`` over ``vocab`` (compiled once per pair)."""

    def fork(self, matcher: Any) -> Any:
        """An independent copy of ``matcher``."""

    def advance(self, matcher: Any, token_id: int) -> None:
        """Consume ``token_id``; raise ``ValueError`` if the grammar forbids it."""

    def fill(self, matchers: list[Any], bitmask: torch.Tensor, eos_ids: list[int]) -> None:
        """Write each matcher's allowed-token bitmask into its row of ``bitmask``; a
        matcher that left the grammar allows only ``eos_ids``."""


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.torch
    except ImportError:
        raise ImportError(
            "structured generation needs llguidance: pip install 'anylogits[structured]'"
        ) from None
    return llguidance


class _VocabularyTokenizer:
    """A :class:`Vocabulary` in the shape llguidance's ``TokenizerWrapper`` reads."""

    def __init__(self, vocab: Vocabulary) -> None:
        eos = sorted(vocab.eos_token_ids)
        self.eos_token_id = eos[0] if eos else None
        self.bos_token_id = vocab.bos_token_id
        self.tokens = list(vocab.tokens)
        self.special_token_ids = sorted(vocab.special_token_ids)
        self._encode = vocab.encode
        self._by_bytes: dict[bytes, int] | None = None

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        if self._encode is not None:
            return self._encode(text)
        return self._greedy(text.encode("utf-8"))

    def _greedy(self, data: bytes) -> list[int]:
        # Without the model's tokenizer: longest known piece first (valid, not canonical).
        if self._by_bytes is None:
            special = set(self.special_token_ids)
            self._by_bytes = {}
            for token_id, piece in enumerate(self.tokens):
                if piece and token_id not in special:
                    self._by_bytes.setdefault(piece, token_id)
        longest = max(map(len, self._by_bytes), default=1)
        ids, start = [], 0
        while start < len(data):
            for end in range(min(len(data), start + longest), start, -1):
                token_id = self._by_bytes.get(data[start:end])
                if token_id is not None:
                    ids.append(token_id)
                    start = end
                    break
            else:
                raise ValueError(f"the vocabulary cannot spell byte {data[start]:#x}")
        return ids


class LLGuidanceEngine:
    """llguidance: tokenizers and compiled grammars cached, masks filled in parallel."""

    name = "llguidance"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokenizers: weakref.WeakKeyDictionary[Vocabulary, Any] = weakref.WeakKeyDictionary()
        self._compiled: dict[tuple[int, str], Any] = {}
        self._executor: Any = None

    def check(self, grammar: str) -> None:
        llguidance = _llguidance()
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise ValueError(messages[0] if messages else "the grammar does not compile")

    def tokenizer(self, vocab: Vocabulary) -> Any:
        """llguidance's tokenizer for ``vocab`` (built once: ~1 s at 128k tokens)."""
        with self._lock:
            tokenizer = self._tokenizers.get(vocab)
            if tokenizer is None:
                llguidance = _llguidance()
                wrapper = llguidance.TokenizerWrapper(_VocabularyTokenizer(vocab))
                eos = sorted(vocab.eos_token_ids) or None
                tokenizer = llguidance.LLTokenizer(wrapper, eos_token=eos)
                self._tokenizers[vocab] = tokenizer
            return tokenizer

    def start(self, grammar: str, vocab: Vocabulary) -> Any:
        tokenizer = self.tokenizer(vocab)
        key = (id(tokenizer), grammar)
        template = self._compiled.get(key)
        if template is None:
            llguidance = _llguidance()
            template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
            if template.is_error():
                raise ValueError(template.get_error())
            if len(self._compiled) >= 256:  # bounded: a server sees endless schemas
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[key] = template
        return template.deep_copy()

    def fork(self, matcher: Any) -> Any:
        return matcher.deep_copy()

    def advance(self, matcher: Any, token_id: int) -> None:
        if not (matcher.is_stopped() or matcher.is_error()):
            # A forbidden token leaves the matcher in its error state (see fill): that
            # happens to draft tokens of speculative decoding that get rejected anyway.
            matcher.consume_token(token_id)

    def fill(self, matchers: list[Any], bitmask: torch.Tensor, eos_ids: list[int]) -> None:
        llguidance = _llguidance()
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        # Rows of one sequence (prompt rows, beams not yet apart) share a matcher, which
        # the executor may borrow only once: fill each matcher once, then copy its row.
        first_row: dict[int, int] = {}
        for row, matcher in enumerate(matchers):
            first_row.setdefault(id(matcher), row)
        unique = [(matchers[row], row) for row in first_row.values()]
        llguidance.torch.fill_next_token_bitmask_par(self._executor, unique, bitmask)
        if len(unique) < len(matchers):
            sources = torch.tensor([first_row[id(m)] for m in matchers])
            bitmask.copy_(bitmask.index_select(0, sources))
        for row, matcher in enumerate(matchers):
            if matcher.is_error() or not bitmask[row].any():
                # A sequence that left the grammar (or has nowhere to go) is ended.
                bitmask[row] = 0
                for eos in eos_ids:
                    bitmask[row, eos // 32] |= _bit(eos % 32)


def _bit(position: int) -> int:
    """The int32 value with only bit ``position`` set (bit 31 is negative)."""
    return -(1 << 31) if position == 31 else 1 << position


ENGINE: GrammarEngine = LLGuidanceEngine()

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set ``logits`` to ``-inf`` wherever the packed bitmask has a 0 bit, in place.

    One vectorized op for the whole batch on the logits' device; ids beyond the bitmask
    (a logits row wider than the vocabulary) are masked too.
    """
    device = logits.device
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    bits = bitmask.to(device, non_blocking=True)
    allowed = ((bits.unsqueeze(-1) >> shifts) & 1).view(bits.shape[0], -1)
    width = logits.shape[-1]
    if allowed.shape[1] < width:
        allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[1]))
    minus_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=device)
    return torch.where(allowed[:, :width].bool(), logits, minus_inf, out=logits)
