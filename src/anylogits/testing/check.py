"""Check a processor the way the conformance suite checks the catalogue.

:func:`check_processor_on` (what :func:`anylogits.testing.check_processor` runs, on the
backends it names) builds call scenarios (beam forks and reorders, speculative
rollback, resumed sequences, row moves and swaps, permuted rows), and for every call
compares two things with the *truth*: each row replayed alone, from its prompt, one
token at a time, by a fresh copy of the processor. What a processor returns for a row
may depend on that row's history and logits only: not on its row index, the other
rows, or the order in which calls came.

* the core :class:`~anylogits.Pipeline` on batched rows, in float32, float16 and
  bfloat16;
* each backend's hook, called as that backend calls it, in each dtype the backend
  passes: equal to the truth, and exactly equal to the core pipeline given the same
  calls. The backends are handed in (:class:`Backend`): this module imports no engine,
  the engines (:mod:`anylogits.engines.backends`) stand above it.

Values are compared exactly (``-inf`` equals ``-inf``, NaN equals NaN), as the
conformance suite's hook-level tests compare them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from anylogits.core.pipeline import Pipeline
from anylogits.core.processor import LogitsProcessor
from anylogits.core.specs import from_spec
from anylogits.core.vocab import Vocabulary

VOCAB_SIZE = 64
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PROMPT_LENGTH = 6
_BATCH = 3
# Few distinct ids are preferred when sampling, so n-grams repeat and penalties bite.
_FAVOURED_IDS = 8


def call_sequence(batch: int, seed: int) -> list[torch.Tensor]:
    """Histories of successive calls: extend, reorder/fork rows, roll back two tokens."""
    generator = torch.Generator().manual_seed(seed)
    # Few distinct ids, so n-grams repeat and penalties bite.
    ids = torch.randint(0, 8, (batch, 6), generator=generator)
    calls = [ids]
    for step in range(6):
        if step == 3:
            ids = ids[:, :-2]  # rejected draft tokens
        parents = torch.randint(0, batch, (batch,), generator=generator)
        new = torch.randint(0, 8, (batch, 1), generator=generator)
        ids = torch.cat([ids[parents], new], 1)
        calls.append(ids)
    return calls


@dataclass
class Scenario:
    """Successive calls: each a ``(B, L)`` history and ``(B, V)`` float32 logits, with
    the prompt length of every row (what the sequence's first call held)."""

    name: str
    calls: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    prompt_lengths: list[list[int]] = field(default_factory=list)

    def permuted(self, name: str) -> Scenario:
        """The same calls with the rows of each call in reverse order."""
        return Scenario(
            name,
            [ids.flip(0) for ids in self.calls],
            [logits.flip(0) for logits in self.logits],
            [lengths[::-1] for lengths in self.prompt_lengths],
        )


class _Truth:
    """Each row's result when the row is replayed alone, from its prompt, one token at a
    time, by a fresh copy of the processor. Each earlier prefix gets the logits the
    scenario last gave it (a processor may remember what it saw, as ``ForceLastPhrase``
    remembers the top token); a prefix no call held is only tracked, never processed."""

    def __init__(self, fresh: Callable[[], LogitsProcessor], vocab: Vocabulary | None) -> None:
        self.fresh = fresh
        self.vocab = vocab
        self.cache: dict[tuple[Any, ...], torch.Tensor] = {}

    def row(
        self,
        history: Sequence[int],
        prompt_length: int,
        logits: torch.Tensor,
        seen: dict[tuple[int, ...], torch.Tensor],
    ) -> torch.Tensor:
        pipeline = Pipeline([self.fresh()], self.vocab)
        ids = torch.tensor([list(history)])
        for length in range(prompt_length, len(history)):
            earlier = seen.get(tuple(history[:length]))
            if earlier is not None:
                pipeline(earlier.to(logits.dtype).clone()[None], ids[:, :length])
            elif pipeline.tracker is not None:
                pipeline.tracker.locate(ids[:, :length])
        return pipeline(logits.clone()[None], ids)[0]

    def call(self, scenario: Scenario, index: int, dtype: torch.dtype) -> torch.Tensor:
        key = (id(scenario), index, dtype)
        if key not in self.cache:
            seen: dict[tuple[int, ...], torch.Tensor] = {}
            for ids, logits in zip(scenario.calls[:index], scenario.logits[:index], strict=True):
                seen.update(zip(map(tuple, ids.tolist()), logits, strict=True))
            ids, logits = scenario.calls[index], scenario.logits[index].to(dtype)
            rows = zip(ids.tolist(), scenario.prompt_lengths[index], logits, strict=True)
            self.cache[key] = torch.stack(
                [self.row(row, prompt, values, seen) for row, prompt, values in rows]
            )
        return self.cache[key]


class _Recorder:
    """Builds a scenario call by call, sampling each new token from the truth of its
    parent row, so that constrained processors see histories they allow."""

    def __init__(self, name: str, truth: _Truth, width: int, seed: int) -> None:
        self.scenario = Scenario(name)
        self.truth = truth
        self.width = width
        self.generator = torch.Generator().manual_seed(seed)
        self.prompt_of: dict[tuple[int, ...], int] = {}
        self.results: dict[tuple[int, ...], torch.Tensor] = {}

    def prompts(self, count: int, length: int) -> list[list[int]]:
        rows = torch.randint(0, _FAVOURED_IDS, (count, length), generator=self.generator)
        for row in rows.tolist():
            self.prompt_of[tuple(row)] = length
        return rows.tolist()

    def call(self, rows: list[list[int]]) -> list[list[int]]:
        logits = torch.randn(len(rows), self.width, generator=self.generator) * 2
        logits[:, :_FAVOURED_IDS] += 2
        prompts = [self._prompt_length(row) for row in rows]
        self.scenario.calls.append(torch.tensor(rows))
        self.scenario.logits.append(logits)
        self.scenario.prompt_lengths.append(prompts)
        results = self.truth.call(self.scenario, len(self.scenario.calls) - 1, torch.float32)
        self.results.update(zip(map(tuple, rows), results, strict=True))
        return rows

    def _prompt_length(self, row: list[int]) -> int:
        for length in range(len(row), 0, -1):
            prompt = self.prompt_of.get(tuple(row[:length]))
            if prompt is not None:
                return prompt
        raise AssertionError(f"scenario row {row} continues no prompt")

    def extend(self, rows: list[list[int]], parents: Iterable[int]) -> list[list[int]]:
        """Row ``i`` of the next call: ``rows[parents[i]]`` plus one sampled token (forks
        of one parent take different tokens where the processor allows it)."""
        taken: dict[int, list[int]] = {}
        extended = []
        for parent in parents:
            token = self.sample(rows[parent], exclude=taken.setdefault(parent, []))
            taken[parent].append(token)
            extended.append([*rows[parent], token])
        return extended

    def unseen(self, row: list[int], count: int) -> list[int]:
        """``row`` plus ``count`` sampled tokens, the histories between never called."""
        for _ in range(count):
            if tuple(row) not in self.results:
                logits = torch.randn(self.width, generator=self.generator) * 2
                prompt = self._prompt_length(row)
                self.results[tuple(row)] = self.truth.row(row, prompt, logits, {})
            row = [*row, self.sample(row)]
        return row

    def sample(self, history: list[int], exclude: Sequence[int] = ()) -> int:
        """A token the processed logits of ``history`` allow, ``exclude`` avoided if they
        allow another."""
        values = self.results[tuple(history)].to(torch.float32).clone()
        finite = torch.isfinite(values)
        if not bool(finite.any()):
            return int(torch.randint(0, self.width, (1,), generator=self.generator))
        avoided = values.clone()
        avoided[list(exclude)] = float("-inf")
        if bool(torch.isfinite(avoided).any()):
            values = avoided
        return int(torch.multinomial(values.softmax(-1), 1, generator=self.generator))


def _beam(recorder: _Recorder) -> None:
    rows = recorder.call(recorder.prompts(_BATCH, PROMPT_LENGTH))
    for parents in ([0, 0, 1], [2, 1, 0], [1, 2, 2], [2, 0, 1], [0, 1, 2]):
        rows = recorder.call(recorder.extend(rows, parents))


def _rollback(recorder: _Recorder) -> None:
    rows = recorder.call(recorder.prompts(_BATCH, PROMPT_LENGTH))
    for _ in range(3):  # draft tokens
        rows = recorder.call(recorder.extend(rows, range(_BATCH)))
    rejected = [row[-2] for row in rows]
    rows = recorder.call([row[:-2] for row in rows])  # two draft tokens rejected
    rows = [
        [*row[:-1], recorder.sample(row[:-1], [drop])]
        for row, drop in zip(rows, rejected, strict=True)
    ]
    rows = recorder.call(rows)  # ... and one other token accepted in their place
    rows = recorder.call(recorder.extend(rows, range(_BATCH)))
    rows = recorder.call(recorder.extend([row[:-1] for row in rows], range(_BATCH)))


def _resumed(recorder: _Recorder) -> None:
    first, second, third = recorder.call(recorder.prompts(_BATCH, PROMPT_LENGTH))
    for _ in range(2):
        first, second, third = recorder.call(recorder.extend([first, second, third], range(3)))
    third, first = recorder.call(recorder.extend([third, first], [0, 1]))  # second paused
    # The paused sequence comes back two tokens on, in another row, as an engine re-adds
    # a preempted request (prompt + its outputs so far).
    second, third = recorder.call([recorder.unseen(second, 2), *recorder.extend([third], [0])])
    # A history seen before, from its prompt on, in a fresh call order.
    early = recorder.call([row[: PROMPT_LENGTH + 1] for row in (third, first)])
    recorder.call(recorder.extend(early, [1, 0]))


def _row_moves(recorder: _Recorder) -> None:
    rows = recorder.call(recorder.prompts(_BATCH, PROMPT_LENGTH))
    rows = recorder.call(recorder.extend(rows, [1, 2, 0]))  # rotation: one-way moves
    rows = recorder.call(recorder.extend(rows, [1, 0, 2]))  # a swap
    rows = recorder.call(recorder.extend(rows, [2, 0]))  # a request finishes
    joined = recorder.prompts(1, len(rows[0]) + 1)[0]  # a new request joins
    rows = recorder.call([*recorder.extend(rows, [0, 1]), joined])
    recorder.call(recorder.extend(rows, [2, 0, 1]))


SCENARIOS: dict[str, Callable[[_Recorder], None]] = {
    "beam fork/reorder": _beam,
    "speculative rollback": _rollback,
    "resumed sequence": _resumed,
    "row moves/swaps": _row_moves,
}


def record_scenarios(
    fresh: Callable[[], LogitsProcessor], vocab: Vocabulary | None, seed: int = 0
) -> tuple[list[Scenario], _Truth]:
    """Every scenario, its tokens sampled from what ``fresh()`` processors allow, plus
    the truth they were recorded with (it caches every row's result)."""
    truth = _Truth(fresh, vocab)
    width = VOCAB_SIZE if vocab is None else vocab.size
    scenarios = []
    for offset, (name, build) in enumerate(SCENARIOS.items()):
        recorder = _Recorder(name, truth, width, seed + offset)
        build(recorder)
        scenarios.append(recorder.scenario)
    scenarios.append(scenarios[0].permuted("rows permuted (state never keyed by row)"))
    if vocab is None:
        scenarios.append(_random_scenario(seed))
    return scenarios, truth


def _random_scenario(seed: int) -> Scenario:
    """:func:`call_sequence`'s forks and rollbacks, the conformance suite's own calls."""
    calls = call_sequence(_BATCH, seed)
    generator = torch.Generator().manual_seed(seed)
    return Scenario(
        "random forks and rollbacks",
        calls,
        [torch.randn(ids.shape[0], VOCAB_SIZE, generator=generator) for ids in calls],
        [[PROMPT_LENGTH] * ids.shape[0] for ids in calls],
    )


def first_difference(actual: torch.Tensor, expected: torch.Tensor) -> tuple[int, int] | None:
    """``(row, column)`` of the first value that differs (NaN equals NaN), or ``None``."""
    same = (actual == expected) | (actual.isnan() & expected.isnan())
    differing = (~same).nonzero()
    if differing.shape[0] == 0:
        return None
    row, column = differing[0].tolist()
    return row, column


class _Failure:
    """Formats the AssertionError for one backend, scenario and dtype."""

    def __init__(self, processor: LogitsProcessor, where: str, scenario: str, dtype: Any) -> None:
        self.prefix = (
            f"check_processor({processor!r}) failed on {where}, scenario {scenario!r}, "
            f"{str(dtype).removeprefix('torch.')}"
        )

    def compare(
        self,
        call: int,
        history: torch.Tensor,
        actual: torch.Tensor,
        expected: torch.Tensor,
        what: str,
    ) -> None:
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            raise AssertionError(
                f"{self.prefix}, call {call}: returned {tuple(actual.shape)} {actual.dtype}, "
                f"expected {tuple(expected.shape)} {expected.dtype}"
            )
        difference = first_difference(actual, expected)
        if difference is not None:
            row, column = difference
            raise AssertionError(
                f"{self.prefix}, call {call}, row {row}, column {column}: got "
                f"{actual[row, column].item()!r}, expected {expected[row, column].item()!r} "
                f"({what}); the row's history: {history[row].tolist()}"
            )


_TRUTH = "the row replayed alone from its prompt by a fresh processor"


def _check_core(
    processor: LogitsProcessor,
    fresh: Callable[[], LogitsProcessor],
    vocab: Vocabulary | None,
    scenarios: list[Scenario],
    truth: _Truth,
    dtypes: Iterable[torch.dtype],
) -> list[str]:
    done = []
    for dtype in dtypes:
        for scenario in scenarios:
            failure = _Failure(processor, "the core pipeline", scenario.name, dtype)
            pipeline = Pipeline([fresh()], vocab)
            for index, (ids, logits) in enumerate(
                zip(scenario.calls, scenario.logits, strict=True)
            ):
                actual = pipeline(logits.to(dtype).clone(), ids)
                expected = truth.call(scenario, index, dtype)
                failure.compare(index, ids, actual, expected, _TRUTH)
            done.append(f"core: {scenario.name}, {dtype}")
    return done


def _backend_calls(scenario: Scenario, max_batch: int | None) -> Iterable[tuple[int, slice]]:
    """(call, rows) of each backend call: the whole call, or one row at a time."""
    for index, ids in enumerate(scenario.calls):
        if max_batch is None or ids.shape[0] <= max_batch:
            yield index, slice(None)
        else:
            for row in range(ids.shape[0]):
                yield index, slice(row, row + 1)


def _check_backend(
    backend: Backend,
    processor: LogitsProcessor,
    fresh: Callable[[], LogitsProcessor],
    vocab: Vocabulary | None,
    tokenizer: Any,
    scenarios: list[Scenario],
    truth: _Truth,
) -> list[str]:
    done = []
    for dtype in backend.dtypes:
        for scenario in scenarios:
            failure = _Failure(processor, f"backend {backend.name!r}", scenario.name, dtype)
            hook = backend.hook([fresh()], tokenizer=tokenizer)
            core = Pipeline([fresh()], vocab)
            for index, rows in _backend_calls(scenario, backend.max_batch):
                ids = scenario.calls[index][rows]
                logits = scenario.logits[index][rows].to(dtype)
                native = logits.clone()
                actual = backend.call(hook, ids, native)
                if backend.preserves_logits and not torch.equal(native, logits):
                    raise AssertionError(
                        f"{failure.prefix}, call {index}: the hook edited logits "
                        f"{backend.name} keeps (an adapter bug, not the processor's)"
                    )
                expected = truth.call(scenario, index, dtype)[rows]
                failure.compare(index, ids, actual, expected, _TRUTH)
                core_result = core(logits.clone(), ids)
                failure.compare(index, ids, actual, core_result, "the core pipeline's result")
            done.append(f"{backend.name}: {scenario.name}, {dtype}")
    return done


def _check_spec(
    processor: LogitsProcessor,
    vocab: Vocabulary | None,
    scenario: Scenario,
    truth: _Truth,
) -> list[str]:
    spec = processor.to_spec()
    where = "the spec round trip"
    try:
        wire = json.loads(json.dumps(spec))
    except (TypeError, ValueError) as error:
        raise AssertionError(f"{processor!r}.to_spec() is not JSON: {error}") from error
    rebuilt = from_spec(wire)
    if type(rebuilt) is not type(processor) or rebuilt.to_spec() != wire:
        raise AssertionError(
            f"check_processor({processor!r}) failed on {where}: from_spec({wire!r}) gives "
            f"{rebuilt!r}, whose spec is {rebuilt.to_spec()!r}"
        )
    try:
        original = copy.deepcopy(processor)
    except Exception:  # not copyable: nothing to compare the spec's processor with
        return [f"spec round trip: {wire!r}"]
    failure = _Failure(processor, where, scenario.name, torch.float32)
    from_copy = Pipeline([original], vocab)
    from_wire = Pipeline([from_spec(wire)], vocab)
    for index, (ids, logits) in enumerate(zip(scenario.calls, scenario.logits, strict=True)):
        expected = from_copy(logits.clone(), ids)
        actual = from_wire(logits.clone(), ids)
        failure.compare(index, ids, actual, expected, "a copy of the processor given")
    return [f"spec round trip: {wire!r}"]


class Backend(Protocol):
    """What :func:`check_processor_on` needs of a backend: how it builds its native hook
    and calls it (the classes of :data:`anylogits.engines.backends.BACKENDS` are these)."""

    @property
    def name(self) -> str:
        """The backend's name in messages and in what was checked."""

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        """The dtypes of the logits the backend hands its hook."""

    @property
    def max_batch(self) -> int | None:
        """The most rows the backend passes in one call (``None``: any number)."""

    @property
    def preserves_logits(self) -> bool:
        """Whether the backend keeps the logits it passed: the hook must not edit them."""

    def hook(self, processors: list[LogitsProcessor], tokenizer: Any = None) -> Any:
        """The backend's native hook around ``processors``."""

    def call(self, hook: Any, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Call ``hook`` as the backend does: ``(B, L)`` history, ``(B, V)`` logits."""


def check_processor_on(
    processor: LogitsProcessor,
    backends: Iterable[Backend],
    *,
    tokenizer: Any = None,
) -> list[str]:
    """:func:`anylogits.testing.check_processor` on the backends given as objects, not
    by name: their hooks, then the core pipeline, then the spec round trip.

    ``anylogits.testing.check_processor`` finds the backends by name in
    :data:`anylogits.engines.backends.BACKENDS` and calls this; the engines stand above
    this module, which drives whatever backends it is handed (``[]``: the core pipeline
    only). Arguments, checks and result are ``check_processor``'s.

    Example:
        >>> from anylogits import RepetitionPenalty
        >>> done = check_processor_on(RepetitionPenalty(1.3), [])
        >>> done[0]
        'core: beam fork/reorder, torch.float32'
    """
    vocab = None
    if tokenizer is not None:
        from anylogits.core.vocab import hf_vocabulary

        vocab = hf_vocabulary(tokenizer)
    fresh = _copier(processor)
    scenarios, truth = record_scenarios(fresh, vocab)
    done: list[str] = []
    for backend in backends:
        if backend.name == "vllm" and processor.spec_name is None:
            done.append("vllm: skipped (vLLM requests carry specs: give the class a spec_name)")
            continue
        done += _check_backend(backend, processor, fresh, vocab, tokenizer, scenarios, truth)
    done += _check_core(processor, fresh, vocab, scenarios, truth, DTYPES)
    if processor.spec_name is not None:
        done += _check_spec(processor, vocab, scenarios[0], truth)
    return done


def _copier(processor: LogitsProcessor) -> Callable[[], LogitsProcessor]:
    """Fresh copies of ``processor``: from its spec if it has one, else deep copies."""
    if processor.spec_name is not None:
        spec = processor.to_spec()
        return lambda: from_spec(spec)
    return lambda: copy.deepcopy(processor)
