"""No host reads in the hot path of stateless processors (issue 17).

Every catalogue processor runs ``process(logits, batch)`` on rows as an engine hands them
(a :class:`Batch` built as
:class:`~anylogits.core.persistent_batch.PersistentBatch` builds it: history and lengths
on demand, prompt lengths and states from each request's committed tokens)
under :func:`forbid_host_sync`, while a ``TorchFunctionMode`` counts every operation that
reads a tensor's value on the host (``.item()``, ``.tolist()``, ``bool(t)``, ``nonzero``,
boolean-mask indexing, ``torch.unique``, ...). On a GPU each one stalls the stream.
Stateless processors read nothing. What the others read is pinned in :data:`HOST_READS`
with the reason: a new read fails here, and a removed one asks for the table to change.

Run this file as a script to print the table: ``python tests/test_host_sync.py``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anylogits import LogitsProcessor, Pipeline, StatefulLogitsProcessor, from_spec
from anylogits.core.batch import Batch
from anylogits.core.persistent_batch import PersistentBatch
from anylogits.core.registry import processor_type
from anylogits.core.sync import forbid_host_sync
from anylogits.core.tracker import SequenceNode, descendant_node, root_node
from anylogits.processors import watermark as watermark_module
from anylogits.processors._greenlist import GreenlistCache
from anylogits.processors.dry import _dense_ranks
from test_support.catalogue import catalogue_classes
from test_support.engine_rows import (
    CASES,
    PROMPTS,
    SLOT_SPECS,
    STACK_VARIANTS,
    VOCAB,
    WIDTH,
)
from test_support.host_reads import HostReads
from test_support.kept_sets import BOUNDARY_TYPES, assert_same_logits

# ---------------------------------------------------------------------------------------
# Counting host reads
# ---------------------------------------------------------------------------------------


def test_the_counter_sees_every_kind_of_host_read() -> None:
    t = torch.tensor([1, 2, 3])
    reads: list[Callable[[], Any]] = [
        lambda: bool(t.any()),
        lambda: int(t.max()),
        lambda: float(t[0]),
        lambda: t[0].item(),
        lambda: t.tolist(),
        lambda: t.nonzero(),
        lambda: torch.unique(t),
        lambda: t[t > 1],
        lambda: t[: t[1]],
        lambda: [0, 1, 2][t[1]],
        lambda: t.cpu(),
        lambda: torch.repeat_interleave(t, t),
        lambda: t.masked_select(t > 1),
        lambda: torch.where(t > 1),
    ]
    for read in reads:
        with HostReads() as counter:
            read()
        assert counter.total == 1, read
    free = [
        lambda: torch.where(t > 1, t, 0),
        lambda: t[torch.tensor([0, 2])],
        lambda: torch.repeat_interleave(t, t, output_size=6),
        lambda: t.clamp(max=2).amax(),
        lambda: t[1:],
    ]
    for operation in free:
        with HostReads() as counter:
            operation()
        assert counter.total == 0, operation


# ---------------------------------------------------------------------------------------
# Rows as an engine hands them
# ---------------------------------------------------------------------------------------

STEPS = 6  # calls per run: the prompt, then five generated tokens


def _is_stateful(spec: dict[str, Any]) -> bool:
    # The class, not an instance: building a structured case needs llguidance, and this
    # runs while the module is collected.
    return issubclass(processor_type(spec["type"]), StatefulLogitsProcessor)


class EngineRows:
    """Requests in slots, their Batch built per call as PersistentBatch builds it."""

    def __init__(self, pipeline: Pipeline, prompts: Sequence[list[int]]) -> None:
        self.pipeline = pipeline
        self.prompts = [list(p) for p in prompts]
        self.generated: list[list[int]] = [[] for _ in prompts]
        self.nodes: list[SequenceNode] = [
            root_node(pipeline.stateful, torch.tensor(p)) for p in self.prompts
        ]

    def batch(self) -> Batch:
        sequences = [p + g for p, g in zip(self.prompts, self.generated, strict=True)]

        def history() -> torch.Tensor:
            width = max(map(len, sequences))
            ids = torch.zeros(len(sequences), width, dtype=torch.int64)
            for row, sequence in enumerate(sequences):
                ids[row, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.int64)
            return ids

        states: dict[int, Sequence[Any]] = {}
        prompt_lengths = None
        if self.pipeline.tracker is not None:
            states = {
                id(processor): [node.states[k] for node in self.nodes]
                for k, processor in enumerate(self.pipeline.stateful)
            }
            prompt_lengths = torch.tensor([len(p) for p in self.prompts])
        return Batch(
            len(sequences),
            history,
            lengths=lambda: torch.tensor([len(s) for s in sequences]),
            prompt_lengths=prompt_lengths,
            states=states,
            vocab=self.pipeline.vocab,
        )

    def commit(self, logits: torch.Tensor) -> None:
        """Append each row's likeliest token (processed logits: forced and structured
        rows take an allowed one)."""
        for row, token_id in enumerate(logits.argmax(dim=-1).tolist()):
            self.generated[row].append(token_id)
            self.nodes[row] = descendant_node(self.pipeline.child, self.nodes[row], [token_id])


def count_host_reads(
    processor: LogitsProcessor, *, steps: int = STEPS, seed: int = 0
) -> collections.Counter[str]:
    """Host reads of ``processor.process`` over a run of ``steps`` calls on PROMPTS, each
    call under :func:`forbid_host_sync`."""
    pipeline = Pipeline([processor], VOCAB)
    rows = EngineRows(pipeline, PROMPTS)
    generator = torch.Generator().manual_seed(seed)
    kinds: collections.Counter[str] = collections.Counter()
    # Watermark's greenlist cache is process-wide: a fresh one makes its count the same
    # whatever ran before.
    with mock.patch.object(watermark_module, "GREENLISTS", GreenlistCache()):
        for _ in range(steps):
            logits = torch.randn(len(PROMPTS), WIDTH, generator=generator) * 3
            batch = rows.batch()
            with forbid_host_sync(), HostReads() as counter:
                logits = processor.process(logits, batch)
            kinds += counter.kinds
            rows.commit(logits)
    return kinds


# What each case reads on the host over one run of count_host_reads (6 calls of 3 rows),
# and why. Every case not listed must read nothing. Stateful processors keep their states
# on the host, so what decides a state goes there; stateless ones read only where a CPU
# generator must be seeded with token values.
HOST_READS: dict[str, tuple[int, str]] = {
    "watermark": (
        726,
        "selfhash: greenlists are drawn by CPU generators seeded by the 40 likeliest tokens "
        "and the context, so the candidates and which rows tie at the 40th place go to the "
        "host in one read (cpu x1 per call; the context with them when the history is on "
        "the device, else the host history's); then, on the host, the tied rows (tolist), "
        "the seeds (tolist), the candidates (tolist) and each (seed, token) answer not "
        "cached yet (__bool__ on a CPU greenlist); a tied row would cost one more read",
    ),
    "watermark (lefthash)": (
        STEPS,
        "the previous tokens seed CPU generators that draw the greenlists: tolist x1 per "
        "call, of the host history (a history on the device: .cpu() of its last column)",
    ),
    "force_last_phrase": (
        STEPS,
        "whether EOS was the top choice goes into the state (advance looks the decision "
        "up): tolist x1 per call",
    ),
    "trigger_phrase (replacing)": (
        STEPS,
        "whether the trigger was the top choice goes into the state: tolist x1 per call",
    ),
    "gen_length": (
        0,
        "stateful: whether a row is boosted is in the state; the exact integer power of its "
        "generated length is taken on the device (int64)",
    ),
    "xtc": (0, "stateful: coin flips are in the state (host), the removal is on the device"),
    "cite_from_prompt": (0, "stateful: prompt ids are host tensors in the state, sent as is"),
    **dict.fromkeys(
        ("multiple_choice", "multiple_choice (text)"),
        (0, "stateful: first-word ids are in the state"),
    ),
    **dict.fromkeys(
        ("trigger_phrase", "trigger_phrase (text)"),
        (0, "stateful: phrase positions are in the state"),
    ),
    "stop_strings": (0, "stateful: whether a row stopped is in the state"),
    "stateful_probe": (0, "stateful: the bias per row is in the state"),
    **dict.fromkeys(
        ("json_schema", "regex", "choice", "grammar"),
        (0, "stateful: the grammar's bitmask is filled on the host, then applied"),
    ),
}


def stacked(name: str, rows: int = len(PROMPTS)) -> LogitsProcessor | None:
    """The stacked form of case ``name`` and its variant, rows ``[case, variant, case,
    ...]`` (``None`` when the class cannot stack them)."""
    first, second = from_spec(CASES[name]), from_spec(STACK_VARIANTS[name])
    for processor in (first, second):
        processor.bind(VOCAB)
    return type(first).stack([(first, second)[row % 2] for row in range(rows)])


def host_read_table() -> list[tuple[str, str, int, str]]:
    """``(case, class, reads, their kinds)`` for every catalogue case and stacked form."""

    def line(name: str, processor: LogitsProcessor) -> tuple[str, str, int, str]:
        kinds = count_host_reads(processor)
        detail = ", ".join(f"{kind} x{count}" for kind, count in sorted(kinds.items()))
        return (name, type(processor).__name__, sum(kinds.values()), detail)

    table = [line(name, from_spec(spec)) for name, spec in CASES.items()]
    for name in STACK_VARIANTS:
        processor = stacked(name)
        if processor is not None:
            table.append(line(f"{name} stacked", processor))
    return table


def _expected(name: str) -> tuple[int, str]:
    return HOST_READS.get(name, (0, "stateless: no host read"))


def test_every_catalogue_class_has_a_case() -> None:
    assert set(catalogue_classes()) <= {spec["type"] for spec in CASES.values()}


def test_every_stateful_processor_states_its_reads() -> None:
    stateful = [name for name, spec in CASES.items() if _is_stateful(spec)]
    assert [name for name in stateful if name not in HOST_READS] == []
    assert set(HOST_READS) <= set(CASES) | {f"{name} stacked" for name in STACK_VARIANTS}


@pytest.mark.parametrize("name", sorted(CASES))
def test_host_reads_in_process(name: str) -> None:
    kinds = count_host_reads(from_spec(CASES[name]))
    expected, reason = _expected(name)
    assert sum(kinds.values()) == expected, (
        f"{name} read the host {sum(kinds.values())} time(s) ({dict(kinds)}); "
        f"HOST_READS says {expected} ({reason})"
    )


@pytest.mark.parametrize("name", sorted(STACK_VARIANTS))
def test_host_reads_in_stacked_rows(name: str) -> None:
    processor = stacked(name)
    assert processor is not None, f"{name} no longer stacks different parameters"
    kinds = count_host_reads(processor)
    expected, reason = _expected(f"{name} stacked")
    assert sum(kinds.values()) == expected, (
        f"{name} stacked read the host {sum(kinds.values())} time(s) ({dict(kinds)}); "
        f"HOST_READS says {expected} ({reason})"
    )


# ---------------------------------------------------------------------------------------
# PersistentBatch's per-step path (vLLM's), around the processors
# ---------------------------------------------------------------------------------------


# PersistentBatch advances the states of the row that tracks its sequence over the tokens the
# engine committed since the last step: they come from the engine's lists as host ints and
# are kept so until a history is read, so the states advance without reading a tensor.
SLOT_BATCH_READS = (0, "committed tokens advance the states as the engine's host ints")


def count_slot_batch_reads(steps: int = STEPS) -> collections.Counter[str]:
    """Host reads of ``PersistentBatch.process`` over a run of ``steps`` calls, each under
    :func:`forbid_host_sync`, committed tokens read from the engine per call."""
    slots = PersistentBatch(VOCAB)
    held = {slot: list(PROMPTS[slot % len(PROMPTS)]) for slot in range(len(SLOT_SPECS))}
    for slot, specs in enumerate(SLOT_SPECS):
        slots.put(slot, specs, prompt_length=len(held[slot]))

    def committed(slot_list: list[int], starts: list[int]) -> list[list[int]]:
        return [held[slot][start:] for slot, start in zip(slot_list, starts, strict=True)]

    generator = torch.Generator().manual_seed(0)
    kinds: collections.Counter[str] = collections.Counter()
    for _ in range(steps):
        logits = torch.randn(len(SLOT_SPECS), WIDTH, generator=generator) * 3
        with forbid_host_sync(), HostReads() as counter:
            logits = slots.process(logits, committed=committed)
        kinds += counter.kinds
        for slot, token_id in enumerate(logits.argmax(dim=-1).tolist()):
            held[slot].append(token_id)
    return kinds


def test_host_reads_in_a_slot_batch_step() -> None:
    kinds = count_slot_batch_reads()
    expected, reason = SLOT_BATCH_READS
    assert sum(kinds.values()) == expected, (
        f"PersistentBatch.process read the host {sum(kinds.values())} time(s) ({dict(kinds)}); "
        f"SLOT_BATCH_READS says {expected} ({reason})"
    )


# ---------------------------------------------------------------------------------------
# Both branches give the same logits
# ---------------------------------------------------------------------------------------

# Ids that repeat (penalties, n-grams, DRY), breakers' pieces ("\n", ":", "#", "1", "x",
# "\n\n", "x\n"), a trigger, the EOS, and ids past the logits (an embedding wider than
# the LM head).
_IDS = (0, 1, 2, 3, 5, 7, 10, 35, 49, 58, 120, 256 + 4, 256 + 5, 4095, WIDTH - 1, WIDTH + 3)
_STATELESS = sorted(name for name, spec in CASES.items() if not _is_stateful(spec))


@st.composite
def engine_batches(draw: st.DrawFn) -> tuple[Batch, torch.Tensor]:
    """Ragged right-aligned rows (empty ones too), prompts of any length, and logits."""
    rows = draw(st.integers(1, 4))
    width = draw(st.integers(0, 16))
    lengths = [draw(st.integers(0, width)) for _ in range(rows)]
    prompt_lengths = [draw(st.integers(0, length)) for length in lengths]
    ids = [[draw(st.sampled_from(_IDS)) for _ in range(width)] for _ in range(rows)]
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    logits = (torch.randn(rows, WIDTH, generator=generator) * 3).to(dtype)
    logits[:, draw(st.integers(0, WIDTH - 1))] = float("-inf")
    return rows_batch(ids, lengths, prompt_lengths), logits


def rows_batch(ids: list[list[int]], lengths: list[int], prompt_lengths: list[int]) -> Batch:
    """A Batch of right-aligned rows of equal width, as a backend passes them."""
    history = torch.tensor(ids, dtype=torch.int64).reshape(len(ids), len(ids[0]))
    return Batch(
        len(ids),
        history,
        lengths=torch.tensor(lengths),
        prompt_lengths=torch.tensor(prompt_lengths),
        vocab=VOCAB,
    )


def _bound(spec: dict[str, Any]) -> LogitsProcessor:
    processor = from_spec(spec)
    processor.bind(VOCAB)
    return processor


def assert_both_branches_agree(batch: Batch, logits: torch.Tensor) -> None:
    """Every stateless case and stacked form gives the same logits with host reads
    allowed (the CPU's early exits) and forbidden (the accelerator's branch)."""
    processors = [(name, name, _bound(CASES[name])) for name in _STATELESS]
    for name in STACK_VARIANTS:
        processor = stacked(name, rows=batch.size)
        if processor is not None:
            processors.append((f"{name} stacked", name, processor))
    for label, name, processor in processors:
        with mock.patch.object(watermark_module, "GREENLISTS", GreenlistCache()):
            expected = processor.process(logits.clone(), batch)
            with forbid_host_sync():
                actual = processor.process(logits.clone(), batch)
        # NaN where the zoo's arithmetic meets -inf: equal as well. The accelerator's
        # softmax may move a token within rounding of a probability threshold.
        boundary = CASES[name]["type"] in BOUNDARY_TYPES
        assert_same_logits(actual, expected, label, boundary=boundary)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=engine_batches())
def test_the_branch_without_host_reads_gives_the_same_logits(
    case: tuple[Batch, torch.Tensor],
) -> None:
    assert_both_branches_agree(*case)


PAST = WIDTH + 3  # an id past the logits
EDGE_BATCHES = {
    # n-grams and repeats whose next id is past the logits; a ragged row; a row whose
    # every id is past the logits.
    "ids past the logits": (
        [[1, PAST, 1, PAST, 1], [0, 0, 5, 5, 5], [PAST] * 5],
        [5, 3, 5],
        [2, 1, 0],
    ),
    "empty history": ([[], []], [0, 0], [0, 0]),
    "full rows, one without output": ([[1, 2, 3, 1, 2], [3, 3, 3, 3, 3]], [5, 5], [2, 5]),
    "prompt only, then one token": ([[PAST, PAST], [1, 2]], [2, 2], [2, 1]),
    # Repeats of many lengths (DRY ranks blocks over several doubling rounds).
    "long repeats": (
        [[7, 4000, 2000, 3, 3, 58, 1, 9] * 6, [5, 1, 2, 1, 2, 3, 4000, 2, 1] * 4 + [5] * 12],
        [48, 40],
        [10, 20],
    ),
}


@pytest.mark.parametrize("name", sorted(EDGE_BATCHES))
def test_both_branches_agree_on_edge_batches(name: str) -> None:
    batch = rows_batch(*EDGE_BATCHES[name])
    generator = torch.Generator().manual_seed(batch.size)
    assert_both_branches_agree(batch, torch.randn(batch.size, WIDTH, generator=generator) * 3)


def test_dry_finds_multi_token_breakers_without_host_reads() -> None:
    # "1ab" repeats, but the breaker "x\n1" (tokens "x\n", "1") ends inside the repeat.
    history = torch.tensor([[49, 97, 98, 261, 49, 97, 98], [0, 0, 97, 98, 261, 97, 98]])
    batch = Batch(2, history, lengths=torch.tensor([7, 5]), vocab=VOCAB)
    logits = torch.zeros(2, WIDTH)
    dry = _bound(CASES["dry (multi-token breakers)"])
    expected = dry.process(logits.clone(), batch)
    with forbid_host_sync():
        actual = dry.process(logits.clone(), batch)
    assert torch.equal(actual, expected)
    without_breakers = _bound({**CASES["dry (multi-token breakers)"], "sequence_breakers": []})
    assert not torch.equal(actual, without_breakers.process(logits.clone(), batch))


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.integers(-50, 50), min_size=1, max_size=40), rows=st.integers(1, 4))
def test_dry_ranks_blocks_as_torch_unique_does(values: list[int], rows: int) -> None:
    blocks = torch.tensor(values * rows).reshape(rows, -1)
    distinct, inverse = torch.unique(blocks, return_inverse=True)
    ranks, count = _dense_ranks(blocks)
    assert torch.equal(ranks, inverse)
    assert int(count) == distinct.numel()


if __name__ == "__main__":
    for line in host_read_table():
        print(" | ".join(map(str, line)))
    print("PersistentBatch.process | PersistentBatch |", dict(count_slot_batch_reads()))
