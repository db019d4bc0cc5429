"""Structured generation: outputs that match a regex, a JSON schema, a choice or a grammar.

The processors below turn a spec into a grammar and each sequence's state into a mask;
the rest of this package is the way there, in order:

- ``bounds/``: what the spec may cost, read from its text (counts, greedy-lexing stalls);
- ``guard``: the grammar's first compilation, in a child process under a CPU-time and a
  memory budget, so that what nobody foresaw is refused instead of stalling or killing
  the process;
- ``engine``: llguidance behind a small interface; compiled grammars cached per
  (grammar, vocabulary, limits);
- ``state``: per-sequence cursors on shared matchers (beams, drafts, rollbacks);
- ``mask``: the packed ``(B, ceil(V/32))`` bitmask applied to the logits.

Per call, every row's allowed tokens are computed on the CPU into one packed int32
bitmask (by llguidance's threads, without the GIL, where it has more than one) and
applied to the logits with one vectorized op. EOS is allowed
exactly when the grammar accepts. Engine: llguidance (``pip install 'anylogits[structured]'``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.cache import BoundedCache
from anylogits.core.fast_paths import FastPaths
from anylogits.core.limits import (
    admitted_by_server,
    check_items,
    check_request_size,
    claim_checked_spec,
    from_request,
    limits,
)
from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor
from anylogits.core.vocab import Vocabulary
from anylogits.processors.structured.bounds.counts import check_lark, check_regex, check_schema
from anylogits.processors.structured.bounds.greedy_lexing import check_greedy_lexing
from anylogits.processors.structured.cache import grammar_key
from anylogits.processors.structured.engine import (
    ENGINE,
    StructuredUnavailable,
    load_llguidance,
)
from anylogits.processors.structured.mask import ReusedBitmask, apply_bitmask, pack_ids
from anylogits.processors.structured.state import GrammarCursor, fill_bitmask

# The grammars of requests' specs and their keys, by the spec (its request's text and
# its place there) and the limits it was checked under: a server builds a request's specs
# twice or more (to check them, then to run them) and sees a client's again and again,
# and turning a schema into its grammar costs up to milliseconds (its bounds walked, then
# llguidance's translation: 0.7 ms on average over the real-schema corpus).
REQUEST_GRAMMARS = BoundedCache(max_entries=1024, max_weight=64 << 20)


@functools.lru_cache(maxsize=64)
def _ended_row(eos_token_ids: frozenset[int], words: int) -> torch.Tensor:
    """The row of a sequence that left the grammar: EOS only. Shared by every processor
    of the vocabulary (only ever read) rather than packed at each hook's build."""
    return pack_ids(eos_token_ids, words)


# The bitmask of an unbound processor: no rows, so that its first call says what is
# missing (only ever replaced, never written).
_NO_ROWS = ReusedBitmask(0, 0)
_one_row_bitmasks = threading.local()


def _one_row_bitmask(words: int) -> ReusedBitmask:
    """This thread's one-row bitmask of ``words`` words."""
    kept: dict[int, ReusedBitmask] | None = getattr(_one_row_bitmasks, "by_words", None)
    if kept is None:
        kept = _one_row_bitmasks.by_words = {}
    bitmask = kept.get(words)
    if bitmask is None:
        bitmask = kept[words] = ReusedBitmask(1, words)
    return bitmask


class _Grammar(StatefulLogitsProcessor[GrammarCursor], FastPaths):
    """A processor whose state is a cursor on a grammar matcher's token line."""

    def _set_grammar(
        self, build: Callable[[], str], what: str, checks: Callable[[], None] | None = None
    ) -> None:
        """Keep the grammar ``build`` returns (llguidance's text of the spec), after
        ``checks`` (the spec's bounds); ``what`` names it in errors. Built now, except
        where llguidance is not installed and no server is admitting the spec: a client
        builds a spec to send it, and the server builds its grammar; in this process,
        binding to a vocabulary needs it (:attr:`grammar`). A request's spec checked
        before under the limits in force (a client's schema, sent again, or a server's
        second build of a request) takes the grammar made then, without its checks."""
        self._what = what
        self._build_grammar = build
        self._grammar: str | None = None
        self._grammar_key: bytes | None = None
        spec = claim_checked_spec(type(self)) if from_request() else None
        if spec is not None:
            known = REQUEST_GRAMMARS.get((spec, limits()))
            if known is not None:
                self._grammar, self._grammar_key = known
                return
        if checks is not None:
            checks()
        try:
            grammar = self.grammar
        except StructuredUnavailable:
            if not admitted_by_server():
                return
            raise
        # A spec from a request is compiled first in the guarded checker (bounded CPU
        # time and memory; a server answers 400 there). One built here by its user is
        # compiled once, when it is bound to a vocabulary, as llguidance alone would:
        # a separate validation would cost ~40% of a compile more (measured on the
        # Kubernetes corpus) before the first mask.
        if from_request():
            with self._compile_errors():
                ENGINE.check(grammar)
            if spec is not None:
                weight = len(grammar) + len(spec[0])  # the grammar, its request's text
                REQUEST_GRAMMARS.put((spec, limits()), (grammar, self._key()), weight=weight)

    @property
    def grammar_pending(self) -> bool:
        """Whether the grammar is still to be built: a spec checked for a client on a
        machine without llguidance (the server builds it)."""
        return self._grammar is None

    @property
    def grammar(self) -> str:
        """llguidance's grammar of this processor's spec."""
        if self._grammar is None:
            self._grammar = self._build_grammar()
        return self._grammar

    def _key(self) -> bytes:
        """:attr:`grammar`'s cache key, kept: every sequence this processor starts asks
        for its compiled grammar by it."""
        if self._grammar_key is None:
            self._grammar_key = grammar_key(self.grammar)
        return self._grammar_key

    @contextlib.contextmanager
    def _compile_errors(self) -> Iterator[None]:
        try:
            yield
        except ValueError as error:
            message = f"{type(self).__name__}: {self._what} does not compile: {error}"
            raise ValueError(message) from None

    stacks_states = True
    # prepare()'s batch and its masks, until the process call of that batch.
    _prepared: tuple[Batch, torch.Tensor | ReusedBitmask] | None = None

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        # Several rows' bitmask, made at the first call of that many rows.
        self._bitmask = _NO_ROWS
        self._words = 0
        if vocab is not None:
            with self._compile_errors():
                self._words = (ENGINE.vocab_size(vocab) + 31) // 32
            self._ended_row = _ended_row(vocab.eos_token_ids, self._words)
            self._compile(vocab)

    def _compile(self, vocab: Vocabulary) -> None:
        with self._compile_errors():  # compiled now: errors before generation
            ENGINE.compile(self.grammar, vocab, self._key())

    @classmethod
    def stack(cls, processors: Sequence[Any]) -> LogitsProcessor | None:
        """The rows of many requests' grammars, of one vocabulary, in one call: each
        row's state is its own request's cursor, so one :class:`_StackedGrammars` fills
        every row's mask in one call (llguidance's threads, without the GIL) and applies
        them in one pass, where each request's processor would fill and apply its rows
        apart."""
        vocab = processors[0].vocab
        if vocab is None or any(processor.vocab is not vocab for processor in processors):
            return None
        return _StackedGrammars()

    def _vocab(self) -> Vocabulary:
        if self.vocab is None:
            raise ValueError(
                f"{type(self).__name__} needs the model's vocabulary: build the hook with "
                "the model's tokenizer (or model, for llama.cpp)"
            )
        return self.vocab

    def init_state(self, prompt_ids: torch.Tensor) -> GrammarCursor:
        # The constraint applies to generated tokens only.
        started = ENGINE.start_with_mask(self.grammar, self._vocab(), self._key())
        return GrammarCursor.start(ENGINE, *started)

    def advance(self, state: GrammarCursor, token_id: int) -> GrammarCursor:
        return state.advance(token_id)

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return apply_bitmask(logits, self._bitmask_of(batch))

    def process_into(self, logits: torch.Tensor, batch: Batch, out: torch.Tensor) -> torch.Tensor:
        # `logits` stay untouched: one row is masked into `out` in one pass, several are
        # copied there and masked in place (apply_bitmask says why).
        return apply_bitmask(logits, self._bitmask_of(batch), out=out)

    def prepare(self, batch: Batch) -> None:
        # The masks, in this processor's own bitmask (the thread's one-row bitmask is
        # another processor's until its apply): filled while the engine computes the
        # logits, applied by the process call of this batch.
        self._prepared = (batch, self._filled_bitmask(batch, shared_row=False))

    def _bitmask_of(self, batch: Batch) -> torch.Tensor | ReusedBitmask:
        """The masks of ``batch``: :meth:`prepare`'s, or filled now."""
        prepared = self._prepared
        if prepared is not None:
            self._prepared = None
            if prepared[0] is batch:
                return prepared[1]
        return self._filled_bitmask(batch)

    def _filled_bitmask(
        self, batch: Batch, shared_row: bool = True
    ) -> torch.Tensor | ReusedBitmask:
        """The packed allowed tokens of every row of ``batch``; ``shared_row``: one row's
        in the calling thread's bitmask, not this processor's."""
        cursors = batch.states(self)
        if len(cursors) == 1 and self._words and shared_row:
            # One row (a request's step, a batch of one): the calling thread's bitmask,
            # shared by its processors, each of which fills and applies it before
            # another runs. One per processor cost ~40 us of a request's first mask
            # (its tensors made while the compile has left the caches cold).
            reused = _one_row_bitmask(self._words)
            fill_bitmask(ENGINE, cursors, reused.tensor, self._ended_row)
            return reused
        reused = self._bitmask
        rows = reused.tensor.shape[0]
        if rows == len(cursors):
            # Reused across calls: every row is written by each fill.
            fill_bitmask(ENGINE, cursors, reused.tensor, self._ended_row)
            return reused
        self._vocab()  # unbound, the bitmask has no rows: say what is missing
        if rows < len(cursors):
            self._bitmask = ReusedBitmask(len(cursors), self._words)
            return self._filled_bitmask(batch, shared_row)
        bitmask = reused.tensor[: len(cursors)]
        fill_bitmask(ENGINE, cursors, bitmask, self._ended_row)
        return bitmask


class _StackedGrammars(_Grammar):
    """Grammar processors of several requests stacked into one (:meth:`_Grammar.stack`):
    it reads, as its own state of each row, that row's request's cursor. It owns no
    grammar and starts no sequence (each request's own processor does both); internal,
    it has no spec."""

    def __init__(self) -> None:
        self._what = "the stacked grammars"

    @property
    def grammar(self) -> str:
        raise TypeError("stacked grammars have no grammar of their own")

    def _compile(self, vocab: Vocabulary) -> None:
        pass  # each request's own processor compiled its grammar

    def init_state(self, prompt_ids: torch.Tensor) -> GrammarCursor:
        raise TypeError("stacked grammars read their requests' states; they start none")

    def config(self) -> dict[str, Any]:
        return {}


class Regex(_Grammar):
    """Generated text matches ``pattern`` in full (Rust ``regex`` syntax, anchored).

    Args:
        pattern: the regular expression the whole output must match.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, Regex, Vocabulary
        >>> vocab = Vocabulary((b"a", b"b", b"<eos>"), eos_token_ids=frozenset({2}))
        >>> Pipeline([Regex("ab")], vocab)(torch.zeros(1, 3), torch.tensor([[0]]))
        tensor([[0., -inf, -inf]])
    """

    spec_name = "regex"

    def __init__(self, pattern: str) -> None:
        if not isinstance(pattern, str):
            raise ValueError(f"pattern must be a string, got {pattern!r}")
        check_request_size("pattern", len(pattern), "grammar_chars", "characters")
        check_regex(pattern, "pattern")
        self.pattern = pattern
        self._set_grammar(self._regex_grammar, f"regex {pattern!r}")

    def _regex_grammar(self) -> str:
        return load_llguidance().LLMatcher.grammar_from_regex(self.pattern)

    def config(self) -> dict[str, Any]:
        return {"pattern": self.pattern}


#: ``json.dumps``' default layout, :class:`JSONSchema`'s default.
DEFAULT_SEPARATORS = (", ", ": ")


def json_options(
    flexible_whitespace: bool = False,
    lenient: bool = False,
    separators: tuple[str, str] = DEFAULT_SEPARATORS,
) -> dict[str, Any]:
    """llguidance's JSON compile options for :class:`JSONSchema`'s arguments (the same
    options compile the same grammar in llguidance alone)."""
    options: dict[str, Any] = {"whitespace_flexible": flexible_whitespace}
    if not flexible_whitespace:
        options.update(item_separator=separators[0], key_separator=separators[1])
    if lenient:
        options.update(coerce_one_of=True, lenient=True)
    return options


class JSONSchema(_Grammar):
    """Generated text is JSON valid under ``schema``.

    Args:
        schema: a JSON schema as a dict, its JSON text, or a pydantic model class.
        flexible_whitespace: allow any JSON whitespace between tokens; by default the
            output is laid out like ``json.dumps`` (``", "`` and ``": "``), which keeps a
            model from spending its tokens on whitespace.
        separators: the item and key separators when whitespace is not flexible, as
            ``json.dumps`` takes them: ``(",", ":")`` is the compact layout of vLLM's
            and llguidance's structured outputs without whitespace (the same request
            then gives the same tokens there).
        lenient: compile what the engine can approximate instead of refusing it:
            ``oneOf`` as ``anyOf``, and keywords it does not implement (``uniqueItems``,
            ``if``/``then``, ``not``, unknown formats, ...) ignored. One Kubernetes
            schema in four uses ``oneOf``; outputs then satisfy the schema except for
            what was approximated (validate them if that matters).

    Example:
        >>> import torch
        >>> from anylogits import JSONSchema, Pipeline, Vocabulary
        >>> vocab = Vocabulary((b"1", b"x", b"<eos>"), eos_token_ids=frozenset({2}))
        >>> processor = JSONSchema({"type": "integer"})
        >>> Pipeline([processor], vocab)(torch.zeros(1, 3), torch.tensor([[0]]))
        tensor([[0., -inf, -inf]])
    """

    spec_name = "json_schema"

    def __init__(
        self,
        schema: dict[str, Any] | str | type,
        flexible_whitespace: bool = False,
        lenient: bool = False,
        separators: tuple[str, str] | list[str] = DEFAULT_SEPARATORS,
    ) -> None:
        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        elif isinstance(schema, str):
            check_request_size("schema", len(schema), "grammar_chars", "characters")
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise ValueError(f"schema is not valid JSON: {error}") from None
            except RecursionError:
                raise ValueError("schema nests too deep to parse") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError(
                f"schema must be a dict, its JSON text or a pydantic model class, got {schema!r}"
            )
        for name, value in (("flexible_whitespace", flexible_whitespace), ("lenient", lenient)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {value!r}")
        self.schema = schema
        self.flexible_whitespace = flexible_whitespace
        self.lenient = lenient
        self.separators = _checked_separators(separators)
        self._set_grammar(
            self._json_grammar, "the JSON schema", functools.partial(_check_schema, schema)
        )

    def _json_grammar(self) -> str:
        try:
            return load_llguidance().LLMatcher.grammar_from_json_schema(
                self.schema,
                defaults=json_options(self.flexible_whitespace, self.lenient, self.separators),
            )
        except ValueError as error:
            raise ValueError(f"JSONSchema: schema is not usable: {error}") from None

    def config(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "flexible_whitespace": self.flexible_whitespace,
            "lenient": self.lenient,
            "separators": list(self.separators),
        }


def _check_schema(schema: Any) -> None:
    """``schema`` is plain JSON and every count in it is bounded; a request's is measured
    too (its JSON's length)."""
    check_schema(schema)
    if from_request():
        check_request_size("schema", len(json.dumps(schema)), "grammar_chars", "bytes of JSON")


def _checked_separators(separators: Any) -> tuple[str, str]:
    """``separators`` as ``(item, key)``: ``","`` and ``":"``, each with at most a few
    spaces around it (what JSON allows between tokens and a layout needs)."""
    if (
        isinstance(separators, (list, tuple))
        and len(separators) == 2
        and all(isinstance(part, str) and len(part) <= 4 for part in separators)
        and [part.strip(" ") for part in separators] == [",", ":"]
    ):
        return (separators[0], separators[1])
    raise ValueError(
        f"separators must be (item, key) like json.dumps' (', ', ': ') or (',', ':'): "
        f"',' and ':' with at most a few spaces around them, got {separators!r}"
    )


class Choice(_Grammar):
    """Generated text is exactly one of ``choices``.

    Args:
        choices: the allowed outputs (non-empty list of distinct strings).

    Example:
        >>> import torch
        >>> from anylogits import Choice, Pipeline, Vocabulary
        >>> vocab = Vocabulary((b"yes", b"no", b"<eos>"), eos_token_ids=frozenset({2}))
        >>> Pipeline([Choice(["no"])], vocab)(torch.zeros(1, 3), torch.tensor([[0]]))
        tensor([[-inf, 0., -inf]])
    """

    spec_name = "choice"

    def __init__(self, choices: list[str]) -> None:
        if (
            not isinstance(choices, (list, tuple))
            or not choices
            or not all(isinstance(c, str) for c in choices)
        ):
            raise ValueError(f"choices must be a non-empty list of strings, got {choices!r}")
        check_items("choices", choices)
        check_request_size("choices", sum(map(len, choices)), "grammar_chars", "characters in all")
        if len(set(choices)) != len(choices):
            raise ValueError(f"choices holds duplicates: {choices!r}")
        self.choices = list(choices)
        self._set_grammar(self._choice_grammar, "the choices")

    def _choice_grammar(self) -> str:
        alternatives = " | ".join(json.dumps(choice) for choice in self.choices)
        return load_llguidance().LLMatcher.grammar_from_lark(f"start: {alternatives}")

    def config(self) -> dict[str, Any]:
        return {"choices": list(self.choices)}


class Grammar(_Grammar):
    """Generated text is derived from a context-free grammar.

    Args:
        grammar: the grammar text; the start rule is ``start`` (Lark) or ``root`` (GBNF).
        syntax: ``"lark"`` (llguidance's Lark dialect) or ``"gbnf"`` (llama.cpp grammars).

    Example:
        >>> import torch
        >>> from anylogits import Grammar, Pipeline, Vocabulary
        >>> vocab = Vocabulary((b"a", b"b", b"<eos>"), eos_token_ids=frozenset({2}))
        >>> processor = Grammar('root ::= "b"+', syntax="gbnf")
        >>> Pipeline([processor], vocab)(torch.zeros(1, 3), torch.tensor([[0]]))
        tensor([[-inf, 0., -inf]])
    """

    spec_name = "grammar"

    def __init__(self, grammar: str, syntax: str = "lark") -> None:
        if not isinstance(grammar, str):
            raise ValueError(f"grammar must be a string, got {grammar!r}")
        check_request_size("grammar", len(grammar), "grammar_chars", "characters")
        if syntax not in ("lark", "gbnf"):
            raise ValueError(f"syntax must be 'lark' or 'gbnf', got {syntax!r}")
        self.text = grammar
        self.syntax = syntax
        self._set_grammar(self._converted, f"the {syntax} grammar")

    def _converted(self) -> str:
        try:
            compiled: str = load_llguidance().grammar_from(self.syntax, self.text)
        except ValueError as error:
            raise ValueError(
                f"Grammar: the {self.syntax} grammar does not convert: {error}"
            ) from None
        # GBNF arrives converted to llguidance's Lark: one reader bounds both.
        check_lark(compiled, "grammar")
        check_greedy_lexing(compiled, "grammar")
        return compiled

    def config(self) -> dict[str, Any]:
        return {"grammar": self.text, "syntax": self.syntax}
