"""The grammar engine behind the structured processors, behind one small interface.

llguidance does the matching (one matcher per sequence, masks filled on the CPU, by
llguidance's thread pool where it has more than one thread, into a packed
``(B, ceil(V/32))`` int32 bitmask, the layout of
:mod:`anylogits.processors.structured.mask`, which applies it). Another engine
(xgrammar) would implement :class:`GrammarEngine` and nothing else would change.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any, Protocol

import torch

from anylogits.core.cache import BoundedCache
from anylogits.core.limits import admitted_by_server, limits, llguidance_limits
from anylogits.core.vocab import Vocabulary
from anylogits.processors.structured.cache import grammar_key
from anylogits.processors.structured.guard import GUARD, GrammarCheckFailed

logger = logging.getLogger(__name__)


class GrammarEngine(Protocol):
    """What the structured processors need from a grammar engine."""

    def check(self, grammar: str) -> None:
        """Raise ``ValueError`` naming the problem when ``grammar`` cannot compile."""

    def compile(self, grammar: str, vocab: Vocabulary, key: bytes | None = None) -> None:
        """Compile ``grammar`` over ``vocab`` now (once per pair); ``ValueError`` naming
        the problem when it cannot compile or allows no output. ``key``: the grammar's
        :func:`~anylogits.processors.structured.cache.grammar_key`, where the caller
        keeps it."""

    def start(self, grammar: str, vocab: Vocabulary) -> Any:
        """A fresh matcher of ``grammar`` over ``vocab`` (compiled once per pair)."""

    def start_with_mask(
        self, grammar: str, vocab: Vocabulary, key: bytes | None = None
    ) -> tuple[Any, torch.Tensor]:
        """:meth:`start`'s matcher and its first mask, a packed int32 row (computed once
        per compiled grammar); ``key`` as in :meth:`compile`."""

    def copy(self, matcher: Any) -> Any:
        """An independent copy of ``matcher``, rollback history included."""

    def consume(self, matcher: Any, token_id: int) -> bool:
        """Consume ``token_id``; ``False`` (matcher unchanged) if the grammar forbids it
        or the matcher has stopped."""

    def rollback(self, matcher: Any, count: int) -> None:
        """Undo the last ``count`` consumed tokens."""

    def vocab_size(self, vocab: Vocabulary) -> int:
        """Tokens per bitmask row for ``vocab``."""

    def tokenizer(self, vocab: Vocabulary) -> Any:
        """The engine's tokenizer for ``vocab``, built once per vocabulary (engines build
        it ahead of the first structured request)."""

    def fill(self, work: list[tuple[Any, int]], bitmask: torch.Tensor) -> list[int]:
        """For each ``(matcher, row)``, write the matcher's allowed tokens into that row
        of the packed bitmask; a matcher appears at most once. Return the rows whose
        matcher ran out of its per-token budget or reached a prefix nothing extends (their
        sequences end); raise ``RuntimeError`` if the engine fails otherwise."""

    def fill_row(self, matcher: Any, bitmask: torch.Tensor, row: int) -> bool:
        """:meth:`fill` of one matcher: whether its sequence ends."""


class StructuredUnavailable(ImportError):
    """llguidance, the structured processors' engine, is not installed in this process."""


def load_llguidance() -> Any:
    """The llguidance module; :class:`StructuredUnavailable` when it is missing, saying how
    to install it, or, for a server's request, only that this server has no structured
    output (a client learns nothing of the server's installation)."""
    try:
        # Not llguidance.torch: its torch.compile decorator imports Dynamo (~2 s of a
        # process's first structured processor), and the bitmask is filled here.
        import llguidance
    except ImportError:
        if admitted_by_server():
            raise StructuredUnavailable(
                "structured output (regex, JSON schema, choice, grammar) is unavailable on "
                "this server: its engine, llguidance, is not installed there"
            ) from None
        from anylogits.installation import pip_install

        raise StructuredUnavailable(
            f"structured generation needs llguidance: {pip_install('structured')}"
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
        self._cache: dict[str | bytes, list[int]] = {}

    def __call__(self, text: str | bytes) -> list[int]:
        # llguidance tokenizes the grammar's forced text (JSON keys, literals) while it
        # computes masks, again at every sequence: remember the answers.
        ids = self._cache.get(text)
        if ids is None:
            decoded = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
            data = decoded.encode("utf-8")
            ids = self._encode(decoded) if self._encode is not None else None
            if ids is None or b"".join(self.tokens[i] for i in ids) != data:
                # No tokenizer, or one whose tokens do not spell the text alone:
                # SentencePiece's leading space ("{" -> " {"), a normalizer. The grammar
                # would force those tokens and then nothing could follow.
                ids = self._greedy(data)
            if len(self._cache) >= 4096:
                self._cache.pop(next(iter(self._cache)))
            self._cache[text] = ids
        return list(ids)

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
                found = self._by_bytes.get(data[start:end])
                if found is not None:
                    ids.append(found)
                    start = end
                    break
            else:
                raise ValueError(f"the vocabulary cannot spell byte {data[start]:#x}")
        return ids


def _wrapped_tokenizer(vocab: Vocabulary) -> Any:
    llguidance = load_llguidance()
    wrapper = llguidance.TokenizerWrapper(_VocabularyTokenizer(vocab))
    return llguidance.LLTokenizer(wrapper, eos_token=sorted(vocab.eos_token_ids) or None)


def _native_tokenizer(vocab: Vocabulary) -> Any | None:
    """llguidance's tokenizer from ``vocab.tokenizer_json``; ``None`` (logged) when the
    vocabulary has none, llguidance cannot read it, or it reads a token differently."""
    if vocab.tokenizer_json is None:
        return None
    llguidance = load_llguidance()
    try:
        tokenizer = llguidance.LLTokenizer(
            vocab.tokenizer_json(),
            n_vocab=vocab.size,
            eos_token=sorted(vocab.eos_token_ids) or None,
        )
    except Exception as error:  # any tokenizer llguidance does not support
        logger.info("llguidance cannot read the tokenizer (%s); wrapping its tokens", error)
        return None
    disagreement = _token_disagreement(tokenizer, vocab)
    if disagreement is not None:
        logger.info(
            "llguidance reads the tokenizer differently (%s); wrapping its tokens", disagreement
        )
        return None
    return tokenizer


def _token_disagreement(tokenizer: Any, vocab: Vocabulary) -> str | None:
    """Where llguidance's ``tokenizer`` and ``vocab`` disagree on a token; ``None`` when
    they agree on every one (~30 ms per 50k tokens). llguidance reserves the byte 0xFF
    to mark special tokens, so a token of such bytes is special to it whatever the
    vocabulary says, as it is when built around the vocabulary's tokens."""
    if int(tokenizer.vocab_size) != vocab.size:
        return f"{tokenizer.vocab_size} tokens against the vocabulary's {vocab.size}"
    special_ids = vocab.special_token_ids
    for token_id, piece in enumerate(vocab.tokens):
        special = bool(tokenizer.is_special_token(token_id))
        if special != (token_id in special_ids) and not piece.startswith(b"\xff"):
            return f"token {token_id} is{'' if special else ' not'} special to llguidance"
        if not special and tokenizer.decode_bytes([token_id]) != piece:
            return f"token {token_id} is {tokenizer.decode_bytes([token_id])!r}, not {piece!r}"
    return None


def _parser_limits(budget: dict[str, int]) -> Any:
    # verbose_errors=False: an error message must not echo the grammar back to a client.
    return load_llguidance().LLParserLimits(**budget, verbose_errors=False)


# Verdicts are small; compiled grammars hold the grammar and its lexer: bounded by count
# and by the bytes of grammar text they were compiled from (a 1 MB Kubernetes schema's
# grammar compiles to a few MB).
VALIDATIONS = BoundedCache(max_entries=4096, max_weight=1 << 62)
COMPILED = BoundedCache(max_entries=256, max_weight=256 << 20)


def _validation_error(grammar: str, budget: dict[str, int], guard: tuple[int, int]) -> str | None:
    """llguidance's error for ``grammar`` under ``budget``, or ``None``; remembered, since
    a server validates each request's grammar in its frontend before the engine compiles
    the same grammar again. Validated in the guarded child process, under ``guard`` (its
    memory and CPU-time budget): a grammar over either is an error too, remembered as
    well, so that sending it again costs nothing."""
    key = (grammar_key(grammar), tuple(budget.values()), guard)
    found = VALIDATIONS.get(key)
    if found is not None:
        return found[0]
    try:
        error = GUARD.validate(grammar, budget)
    except GrammarCheckFailed as failed:
        error = str(failed)
        if failed.transient:  # the machine, not the grammar: not remembered
            raise ValueError(error) from None
    VALIDATIONS.put(key, (error,))
    return error


class _Compiled:
    """A compiled grammar: the matcher every sequence copies, and its first mask.

    ``spare``: a copy made while compiling, still before any token; the first sequence
    takes it instead of a copy of its own (~70 us of a request's first mask, the caches
    cold after the compile)."""

    __slots__ = ("first_row", "spare", "template", "tokenizer")

    def __init__(self, tokenizer: Any, template: Any, first_row: torch.Tensor, spare: Any) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.first_row = first_row
        self.spare = [spare]

    def start(self) -> Any:
        """A matcher of its own for a new sequence, before any token."""
        try:
            return self.spare.pop()  # atomic: two threads never take the same one
        except IndexError:
            return self.template.deep_copy()


class LLGuidanceEngine:
    """llguidance: tokenizers and compiled grammars cached, several rows' masks filled
    in one call.

    Args:
        threads: threads of llguidance's pool (``LLExecutor``) that fills several rows
            at once; ``None``: llguidance's own default (:func:`executor_threads`). With
            one, rows are filled one after the other in the calling thread instead.
    """

    name = "llguidance"

    def __init__(self, threads: int | None = None) -> None:
        if threads is not None and (type(threads) is not int or threads < 1):
            raise ValueError(f"threads must be a positive int or None, got {threads!r}")
        self._lock = threading.Lock()
        self._tokenizers: weakref.WeakKeyDictionary[Vocabulary, Any] = weakref.WeakKeyDictionary()
        self._threads = threads
        self._executor: Any = None  # made at the first fill of several rows; False: none

    def check(self, grammar: str) -> None:
        current = limits()
        guard = (current.grammar_check_mb, current.grammar_check_ms)
        error = _validation_error(grammar, llguidance_limits(), guard)
        if error is not None:
            raise ValueError(error)

    def tokenizer(self, vocab: Vocabulary) -> Any:
        """llguidance's tokenizer for ``vocab`` (built once per vocabulary): from the
        Hugging Face tokenizer's JSON where the vocabulary has it and llguidance reads
        every token as the vocabulary does, as llguidance's own users build it, so that
        forced text (JSON keys, literals) is tokenized in native code; otherwise around
        the vocabulary's tokens, calling its ``encode`` back for forced text (a Python
        call per new text inside a mask: measured at half of the slowest 1% of masks on
        the real-schema corpus)."""
        with self._lock:
            tokenizer = self._tokenizers.get(vocab)
            if tokenizer is None:
                tokenizer = _native_tokenizer(vocab) or _wrapped_tokenizer(vocab)
                self._tokenizers[vocab] = tokenizer
            return tokenizer

    def compile(self, grammar: str, vocab: Vocabulary, key: bytes | None = None) -> None:
        self._compiled(grammar, vocab, key)

    def start(self, grammar: str, vocab: Vocabulary) -> Any:
        return self.start_with_mask(grammar, vocab)[0]

    def start_with_mask(
        self, grammar: str, vocab: Vocabulary, key: bytes | None = None
    ) -> tuple[Any, torch.Tensor]:
        compiled = self._compiled(grammar, vocab, key)
        return compiled.start(), compiled.first_row

    def _compiled(self, grammar: str, vocab: Vocabulary, key: bytes | None = None) -> _Compiled:
        tokenizer = self.tokenizer(vocab)
        budget = llguidance_limits()
        # Hashing the text costs ~1 ms per MB: a processor hands over the key it keeps.
        cache_key = (key or grammar_key(grammar), tuple(budget.values()), id(tokenizer))
        compiled = COMPILED.get(cache_key)
        if compiled is None or compiled.tokenizer is not tokenizer:
            started = time.perf_counter()
            compiled = self._compile(tokenizer, grammar, budget)
            COMPILED.put(cache_key, compiled, weight=len(grammar))
            if logger.isEnabledFor(logging.INFO):  # the cache's stats are counted for it
                logger.info(
                    "compiled a grammar of %d KB for a vocabulary of %d tokens in %.1f ms; "
                    "compiled grammars: %s",
                    len(grammar) >> 10,
                    tokenizer.vocab_size,
                    (time.perf_counter() - started) * 1e3,
                    COMPILED.stats(),
                )
        return compiled

    def _compile(self, tokenizer: Any, grammar: str, budget: dict[str, int]) -> _Compiled:
        llguidance = load_llguidance()
        template = llguidance.LLMatcher(
            tokenizer, grammar, log_level=0, limits=_parser_limits(budget)
        )
        if template.is_error():
            raise ValueError(template.get_error())
        # A grammar can compile and still allow no first token (`root ::= r0`,
        # `r0 ::= r0`): refuse it here, before generation, not at its first mask. That
        # mask is every sequence's first: kept, it is not computed again. The template
        # computes it, so that every copy starts with it computed: a copy of a matcher
        # that never computed a mask pays for it inside its first consume (~9 us more
        # at 128k tokens, cold), and a copy costs the same either way.
        # Filled where it is kept: compute_bitmask's bytes, converted and copied into a
        # tensor, cost ~50 us of a request's first mask at 128k tokens.
        words = (int(tokenizer.vocab_size) + 31) // 32
        first_row = torch.empty(words, dtype=torch.int32)
        template.unsafe_compute_mask_ptr(first_row.data_ptr(), 4 * words)
        if template.is_error():
            reason = template.get_error().splitlines()[0]
            if reason.startswith("panic"):  # the engine failed, not the grammar
                raise RuntimeError(f"llguidance failed to compute a mask: {reason}")
            if _ran_out_of_budget(reason):
                raise ValueError(
                    "the grammar's first token needs more than its per-token budget "
                    f"(anylogits limits 'grammar_step_items', 'grammar_step_fuel'): {reason}"
                )
            raise ValueError(f"the grammar allows no output ({reason})")
        return _Compiled(tokenizer, template, first_row, template.deep_copy())

    def copy(self, matcher: Any) -> Any:
        return matcher.deep_copy()

    def consume(self, matcher: Any, token_id: int) -> bool:
        # try_consume leaves a matcher usable on a forbidden token (consume_token would
        # put it in its error state, which no rollback undoes).
        return bool(matcher.try_consume_tokens([token_id]))

    def rollback(self, matcher: Any, count: int) -> None:
        if not matcher.rollback(count):
            error = matcher.get_error()
            raise RuntimeError(f"llguidance could not roll back {count} tokens: {error}")

    def vocab_size(self, vocab: Vocabulary) -> int:
        return int(self.tokenizer(vocab).vocab_size)

    def fill(self, work: list[tuple[Any, int]], bitmask: torch.Tensor) -> list[int]:
        if not work:
            return []
        if len(work) == 1:
            matcher, row = work[0]
            return [row] if self.fill_row(matcher, bitmask, row) else []
        _check_bitmask(bitmask)
        rows, words = bitmask.shape
        size = 4 * words
        pool = self._pool()
        if pool is not None:
            # What llguidance.torch.fill_next_token_bitmask_par does, minus its asserts.
            pool.unsafe_compute_mask_ptr(work, bitmask.data_ptr(), size, rows)
        else:
            address = bitmask.data_ptr()
            for matcher, row in work:
                matcher.unsafe_compute_mask_ptr(address + size * row, size)
        return [row for matcher, row in work if matcher.is_error() and _ended(matcher)]

    def _pool(self) -> Any | None:
        """llguidance's pool for several rows, made once; ``None`` where it would have
        one thread: it would parallelize nothing and cost a hand-off to its thread and
        back at every call (B=32, 49k tokens, a 2-core VM, where llguidance's default
        pool has one thread: ~100 us of a ~850 us step). Rows are then filled here,
        each call without the GIL as in the pool."""
        if self._executor is None:
            threads = self._threads or executor_threads()
            self._executor = load_llguidance().LLExecutor(threads) if threads > 1 else False
        return self._executor or None

    def fill_row(self, matcher: Any, bitmask: torch.Tensor, row: int) -> bool:
        # One row (a single sequence's step): the matcher itself, as
        # llguidance.torch.fill_next_token_bitmask does, not the thread pool.
        _check_bitmask(bitmask)
        size = 4 * bitmask.shape[1]
        matcher.unsafe_compute_mask_ptr(bitmask.data_ptr() + size * row, size)
        return matcher.is_error() and _ended(matcher)


def executor_threads() -> int:
    """The threads of llguidance's default ``LLExecutor`` here: 80% of the CPUs this
    process may run on, at least 1 and at most 32 (its own rule, for the same count)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return min(max(cpus * 80 // 100, 1), 32)


def _check_bitmask(bitmask: torch.Tensor) -> None:
    # llguidance writes through the tensor's address.
    if bitmask.dtype is not torch.int32 or not bitmask.is_cpu or not bitmask.is_contiguous():
        raise ValueError("the bitmask must be a contiguous int32 CPU tensor")


def _ended(matcher: Any) -> bool:
    """``True`` for a matcher in its error state whose sequence ends (its row gets EOS).

    Refused tokens are never consumed, so an error state is either the grammar's
    per-token budget run out (a limit the spec reached: its sequence ends, as on a
    server) or a failure inside the engine, such as the tokenizer it calls back having
    been freed: that raises rather than quietly forcing EOS."""
    error = matcher.get_error()
    if _ran_out_of_budget(error):
        logger.warning(
            "a grammar ran out of its per-token budget (anylogits limits "
            "'grammar_step_items', 'grammar_step_fuel'): its sequence ends. %s",
            error.splitlines()[0],
        )
    elif error.startswith(_DEAD_END):
        logger.warning(
            "a grammar allows no token after this prefix (it cannot be completed): its "
            "sequence ends. %s",
            error.splitlines()[0],
        )
    else:
        raise RuntimeError(f"llguidance failed to compute a mask: {error}")
    return True


# How llguidance says a matcher ran out of its per-token budget (LLParserLimits: Earley
# items, lexer fuel; 1.7's lexer also caps the regex expressions it builds lazily).
_BUDGET_ERRORS = ("Too many items", "fuel", "too many expressions")


def _ran_out_of_budget(error: str) -> bool:
    return any(sign in error for sign in _BUDGET_ERRORS)


# A prefix the grammar allows but no token extends (`r0: "a" "a" r1`, `r1: r1 "a"`).
_DEAD_END = "NoExtensionBias"

ENGINE: GrammarEngine = LLGuidanceEngine()
