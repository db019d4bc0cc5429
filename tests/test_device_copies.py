"""The accelerator level (issue 34): a decode step on an emulated device, every transfer
counted, every result the CPU's.

The logits (and whatever the engine keeps on the device) are
:class:`~test_support.emulated_device.DeviceTensor` s: they report a device that is not
the CPU, so every processor takes its accelerator branch, while their values live on the
CPU, so each result is compared with the same call on CPU tensors. Counted per call:
host->device copies, blocking or not, and device->host reads (see
``test_support/emulated_device/``). The budget per steady-state step (after two
warm-up calls): no blocking copy at all, and no device read but those pinned in
:data:`DEVICE_READS`, each with its reason and what vLLM itself does there.

Layouts, as each engine hands its rows over:

- ``host history``: token histories built on the host, logits on the device (vLLM's V1
  runner through :class:`PersistentBatch`; llama.cpp and mlx-lm pass host ids too);
- ``device history``: ``input_ids`` on the device (transformers);
- vLLM's V2 runner: committed tokens in a device buffer, read where they are.

The reads each case may make are pinned in ``test_support/device_budget.py``; each
engine's own hook runs the same budget in ``conformance_tests/test_accelerator_level.py``.

Run this file as a script to print the table: ``python tests/test_device_copies.py``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import pytest
import torch
from test_host_sync import stacked

from anylogits import LogitsProcessor, Pipeline, from_spec
from anylogits.core import device_history
from anylogits.core.batch import Batch
from anylogits.core.device_history import CommittedReads, SlotHistory
from anylogits.core.persistent_batch import PersistentBatch
from anylogits.core.transfer import HostCopy
from anylogits.processors import watermark as watermark_module
from anylogits.processors._greenlist import GreenlistCache
from test_support.device_budget import DEVICE_HISTORY, HOST_HISTORY, LAYOUTS, expected_device_reads
from test_support.emulated_device import (
    ASYNC_D2H,
    EVENT_WAIT,
    EmulatedDevice,
    Transfers,
    host_values,
    on_device,
)
from test_support.engine_rows import CASES, PROMPTS, SLOT_SPECS, STACK_VARIANTS, VOCAB, WIDTH

WARM_UP = 2  # calls that fill caches of device constants, not counted
STEPS = WARM_UP + 4  # then every call counted, on logits shaped to reach every branch


class Rows:
    """The ragged PROMPTS growing by each step's CPU argmax, as an engine extends them."""

    def __init__(self) -> None:
        self.sequences = [list(p) for p in PROMPTS]

    def history(self) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, self.sequences))
        ids = torch.zeros(len(self.sequences), width, dtype=torch.int64)
        for row, sequence in enumerate(self.sequences):
            ids[row, width - len(sequence) :] = torch.tensor(sequence)
        return ids, torch.tensor([len(s) for s in self.sequences])

    def commit(self, logits: torch.Tensor) -> None:
        for row, token_id in enumerate(logits.argmax(dim=-1).tolist()):
            self.sequences[row].append(token_id)


def run_steps(
    device: EmulatedDevice,
    step: Callable[[torch.Tensor], torch.Tensor],
    reference: Callable[[torch.Tensor], torch.Tensor],
    rows: Rows,
    *,
    steps: int = STEPS,
) -> Transfers:
    """``steps`` calls of ``step(device logits)`` against ``reference(cpu
    logits)``; each result must be the CPU's. The transfers of the last call."""
    generator = torch.Generator().manual_seed(0)
    each_step: list[Transfers] = []
    for number in range(steps):
        logits = torch.randn(len(rows.sequences), WIDTH, generator=generator) * 3
        logits = shape_logits(logits, number)
        expected = reference(logits.clone())
        with device.counting() as transfers:
            actual = step(on_device(logits))
        each_step.append(transfers)
        torch.testing.assert_close(host_values(actual), expected, rtol=0, atol=0, equal_nan=True)
        assert not transfers.unclassified, (
            f"device operations the emulation has not classified: {transfers.unclassified} "
            f"at {dict(transfers.where)}; classify each in test_support/emulated_device/ops.py"
        )
        rows.commit(expected)
    return worst(each_step[WARM_UP:])


def shape_logits(logits: torch.Tensor, step: int) -> torch.Tensor:
    """Step ``step``'s logits, shaped to reach data-dependent branches after warm-up:
    ties at the top, a row all -inf but one token, a zero-probability tail."""
    if step < WARM_UP:
        return logits
    kind = (step - WARM_UP) % 4
    if kind == 1:  # ties: the top values repeat
        logits[:, :8] = logits.max() + 1.0
    elif kind == 2:  # a single allowed token in row 0
        logits[0] = float("-inf")
        logits[0, 5] = 0.0
    elif kind == 3:  # a tail far below the head: zero probability in float32
        logits[:, WIDTH // 2 :] -= 200.0
    return logits


def worst(steps: Sequence[Transfers]) -> Transfers:
    """Per kind, the most any counted step made (with where it was made)."""
    merged = Transfers()
    for transfers in steps:
        for kind, count in transfers.kinds.items():
            if count > merged.kinds[kind]:
                merged.kinds[kind] = count
                merged.where[kind] = transfers.where[kind]
    return merged


def pipeline_transfers(processor_of: Callable[[], LogitsProcessor], layout: str) -> Transfers:
    """A processor through :class:`Pipeline` as the adapters call it, in ``layout``."""
    rows = Rows()
    on_cpu, on_gpu = Pipeline([processor_of()], VOCAB), Pipeline([processor_of()], VOCAB)

    def history() -> tuple[torch.Tensor, torch.Tensor | None]:
        ids, lengths = rows.history()
        # transformers: left-padded input_ids, every row full width (its padding too).
        return (ids, None) if layout == DEVICE_HISTORY else (ids, lengths)

    def reference(logits: torch.Tensor) -> torch.Tensor:
        ids, lengths = history()
        return on_cpu(logits, ids, lengths=lengths)

    def step(logits: torch.Tensor) -> torch.Tensor:
        ids, lengths = history()
        return on_gpu(logits, on_device(ids) if layout == DEVICE_HISTORY else ids, lengths=lengths)

    with EmulatedDevice() as device, _fresh_greenlists():
        return run_steps(device, step, reference, rows)


def _fresh_greenlists() -> Any:
    # Watermark's greenlist cache is process-wide: a fresh one per run.
    return mock.patch.object(watermark_module, "GREENLISTS", GreenlistCache())


def _assert_budget(
    name: str, layout: str, transfers: Transfers, processor: LogitsProcessor
) -> None:
    expected, reason = expected_device_reads(name, processor, layout)
    assert transfers.blocking_copies == 0, (
        f"{name} ({layout}): {transfers.blocking_copies} blocking host->device copies per "
        f"step: {transfers.summary()} at {dict(transfers.where)}"
    )
    assert transfers.device_reads == expected, (
        f"{name} ({layout}) read the device {transfers.device_reads} time(s) "
        f"({transfers.summary()} at {dict(transfers.where)}); the budget says {expected} "
        f"({reason})"
    )


# ---------------------------------------------------------------------------------------
# The counter
# ---------------------------------------------------------------------------------------


def test_the_emulator_counts_every_kind_of_transfer() -> None:
    host = torch.arange(6.0)
    with EmulatedDevice() as device:
        x = on_device(torch.arange(6.0))
        transfers_of: dict[str, Callable[[], Any]] = {
            "h2d blocking": lambda: host.to(device.device),
            "h2d non_blocking": lambda: host.pin_memory().to(device.device, non_blocking=True),
            # From pageable memory CUDA ignores non_blocking: a copy and a synchronize.
            "h2d blocking (pageable memory)": lambda: host.to(device.device, non_blocking=True),
            "d2h __repr__": lambda: repr(x),
            "d2h __format__": lambda: f"{x[0]:.2f}",
            ASYNC_D2H: lambda: torch.empty(6, pin_memory=True).copy_(x, non_blocking=True),
            "d2h copy_": lambda: torch.empty(6).copy_(x, non_blocking=True),
            EVENT_WAIT: lambda: HostCopy(x).wait(),
            "h2d hidden": lambda: torch.tensor([1, 2], device=device.device),
            "h2d implicit index": lambda: x[torch.tensor([0, 2])],
            "d2h item": lambda: x.sum().item(),
            "d2h tolist": lambda: x.tolist(),
            "d2h cpu": lambda: x.cpu(),
            "d2h nonzero": lambda: x.nonzero(),
            "d2h boolean-mask index": lambda: x[x > 2],
            # numpy's rule: many test elements for few elements sort (seen on an H100).
            "d2h isin (sorting path)": lambda: torch.isin(x[:3], on_device(torch.arange(32.0))),
        }
        for kind, transfer in transfers_of.items():
            with device.counting() as transfers:
                transfer()
            assert kind in transfers.kinds, (kind, transfers.summary())
        free: list[Callable[[], Any]] = [
            lambda: torch.where(x > 2, x, 0.0),
            lambda: x[on_device(torch.tensor([0, 2]))],
            lambda: torch.zeros(3, device=device.device) + x[:3],
            lambda: x * torch.tensor(2.0),  # a host scalar is a kernel argument
            lambda: x.topk(2),
            lambda: torch.isin(x[:3], on_device(torch.tensor([7.0]))),
        ]
        for operation in free:
            with device.counting() as transfers:
                operation()
            assert transfers.kinds == {}, transfers.summary()


def test_the_emulator_asserts_on_an_index_out_of_range_as_cuda_does() -> None:
    """A -1 id (vLLM's draft placeholder) in a gather is a device-side assert on CUDA,
    which ends the engine; the CPU raises or wraps, depending on the op."""
    with EmulatedDevice():
        x = on_device(torch.zeros(2, 5))
        ids = on_device(torch.tensor([[0, -1], [1, 2]]))
        for operation in (
            lambda: x.gather(1, ids),
            lambda: x.scatter_(1, ids, 1.0),
            lambda: x.index_select(1, on_device(torch.tensor([-1]))),
            lambda: x.index_fill_(1, on_device(torch.tensor([5])), 0.0),
        ):
            with pytest.raises(RuntimeError, match="device-side assert"):
                operation()
        x.gather(1, ids.clamp(min=0))


def test_the_emulator_pins_even_where_vllm_replaced_pin_memory() -> None:
    """vLLM's CPU worker (vllm/v1/worker/cpu/shm.py) sets ``torch.Tensor.pin_memory`` to a
    function that returns the tensor, process-wide, once an engine has run in the process.
    The emulation pins all the same: a copy through pinned memory is non-blocking, a copy
    from pageable memory is not."""
    from anylogits.core.transfer import to_device

    replaced = mock.patch.object(torch.Tensor, "pin_memory", lambda tensor, *_: tensor)
    with replaced, EmulatedDevice() as device, device.counting() as transfers:
        to_device(torch.arange(4), device.device)
        torch.arange(4).to(device.device, non_blocking=True)
    assert transfers.kinds == {
        "h2d non_blocking": 1,
        "h2d blocking (pageable memory)": 1,
    }, transfers.summary()


def test_the_emulator_computes_the_cpus_values_in_place_and_through_views() -> None:
    with EmulatedDevice():
        x = on_device(torch.zeros(2, 4))
        rows = x[1:]
        rows.add_(1.0)
        same = x.index_fill_(1, on_device(torch.tensor([0])), -1.0)
        assert same is x
        assert torch.equal(host_values(x), torch.tensor([[-1.0, 0, 0, 0], [-1.0, 1, 1, 1]]))


# ---------------------------------------------------------------------------------------
# Every catalogue processor, in each layout
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_decode_step_copies_without_blocking(name: str, layout: str) -> None:
    if name in ("json_schema", "regex", "choice", "grammar"):
        pytest.importorskip("llguidance")
    transfers = pipeline_transfers(lambda: from_spec(CASES[name]), layout)
    _assert_budget(name, layout, transfers, from_spec(CASES[name]))


def _tracked_read_bytes(width: int, order: Sequence[int]) -> tuple[int, list[int]]:
    """Bytes a tracked step reads in transformers' layout, after a call at ``width``
    columns, and each row's length as the tracker found it (the rows reordered by
    ``order``, as beam search does)."""
    generator = torch.Generator().manual_seed(width)
    ids = torch.randint(0, VOCAB.size, (3, width), generator=generator)
    on_gpu = Pipeline([from_spec(CASES["force_sequence"])], VOCAB)
    tracker = on_gpu.tracker
    assert tracker is not None
    with EmulatedDevice() as device:
        tracker.locate(on_device(ids))
        grown = torch.cat([ids[list(order)], ids[:, :1]], 1)
        with device.counting() as transfers:
            nodes = tracker.locate(on_device(grown))
    host = Pipeline([from_spec(CASES["force_sequence"])], VOCAB).tracker
    assert host is not None
    host.locate(ids)
    expected = host.locate(grown)
    assert [n.states for n in nodes] == [n.states for n in expected]
    assert transfers.device_reads == 1, transfers.summary()
    return transfers.read_bytes, [node.length for node in nodes]


def test_transformers_layout_reads_what_is_new_not_the_history() -> None:
    """``input_ids`` on the device: each row is hashed there and (B, 5) int64 come back
    (hashes, last token, id range), whatever the history's length; the rows may move
    (beam search) and still find their parents. Reading the whole (B, L) history cost
    O(B·L) a step."""
    short, lengths = _tracked_read_bytes(64, (0, 1, 2))
    long, moved = _tracked_read_bytes(4096, (2, 2, 0))
    assert short == long == 3 * 5 * 8, (short, long)
    assert lengths == [65] * 3 and moved == [4097] * 3


def _stacked_rows(name: str) -> LogitsProcessor:
    processor = stacked(name)
    assert processor is not None, f"{name} no longer stacks different parameters"
    return processor


@pytest.mark.parametrize("name", sorted(STACK_VARIANTS))
def test_stacked_rows_copy_without_blocking(name: str) -> None:
    """The form vLLM's grouped requests take: one processor, a parameter per row."""
    rows = Rows()
    on_cpu, on_gpu = _stacked_rows(name), _stacked_rows(name)

    def batch(ids: torch.Tensor, lengths: torch.Tensor, device: torch.device | None) -> Batch:
        return Batch(
            len(rows.sequences),
            ids,
            lengths=lengths,
            prompt_lengths=torch.tensor([len(p) for p in PROMPTS]),
            vocab=VOCAB,
            device=device,
        )

    def reference(logits: torch.Tensor) -> torch.Tensor:
        return on_cpu.process(logits, batch(*rows.history(), None))

    def step(logits: torch.Tensor) -> torch.Tensor:
        return on_gpu.process(logits, batch(*rows.history(), logits.device))

    with EmulatedDevice() as device, _fresh_greenlists():
        transfers = run_steps(device, step, reference, rows)
    _assert_budget(f"{name} stacked", HOST_HISTORY, transfers, on_gpu)


# ---------------------------------------------------------------------------------------
# vLLM's runners: requests in slots
# ---------------------------------------------------------------------------------------


def _slot_batch() -> PersistentBatch:
    slots = PersistentBatch(VOCAB)
    for slot, specs in enumerate(SLOT_SPECS):
        slots.put(slot, specs, prompt_length=len(PROMPTS[slot % len(PROMPTS)]))
    return slots


class SlotEngine:
    """Four requests in slots (SLOT_SPECS: three stacked stateless, one stateful), their
    committed tokens read per step, as vLLM's runners hand them over."""

    def __init__(self) -> None:
        self.held = [list(PROMPTS[slot % len(PROMPTS)]) for slot in range(len(SLOT_SPECS))]
        self.cpu, self.gpu = _slot_batch(), _slot_batch()

    def committed(self, slots: list[int], starts: list[int]) -> list[list[int]]:
        return [self.held[slot][start:] for slot, start in zip(slots, starts, strict=True)]

    def commit(self, logits: torch.Tensor) -> None:
        for slot, token_id in enumerate(logits.argmax(dim=-1).tolist()):
            self.held[slot].append(token_id)


def _run_slot_engine(
    step_of: Callable[[SlotEngine], Callable[[torch.Tensor], torch.Tensor]],
) -> Transfers:
    engine = SlotEngine()
    rows = Rows()
    rows.sequences = engine.held  # the engine's own lists, extended by run_steps

    def reference(logits: torch.Tensor) -> torch.Tensor:
        return engine.cpu.process(logits, committed=engine.committed)

    with EmulatedDevice() as device:
        return run_steps(device, step_of(engine), reference, rows)


def test_vllm_v1_runner_step_copies_without_blocking() -> None:
    """The V1 runner's path: histories from the engine's host lists, logits on the device."""

    def step_of(engine: SlotEngine) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda logits: engine.gpu.process(logits, committed=engine.committed)

    transfers = _run_slot_engine(step_of)
    assert transfers.blocking_copies == 0, (transfers.summary(), dict(transfers.where))
    assert transfers.device_reads == 0, (transfers.summary(), dict(transfers.where))


class DeviceSlots:
    """vLLM's V2 runner's request state: committed tokens and lengths on the device."""

    def __init__(self, held: Sequence[list[int]], max_len: int = 64) -> None:
        tokens = torch.zeros(len(held), max_len, dtype=torch.int32)
        for slot, sequence in enumerate(held):
            tokens[slot, : len(sequence)] = torch.tensor(sequence)
        self.tokens = on_device(tokens)
        self.total = on_device(torch.tensor([len(s) for s in held], dtype=torch.int32))
        self.held = held

    def history(self) -> SlotHistory:
        rows = len(self.held)
        lengths = [len(s) for s in self.held]
        return SlotHistory(
            self.tokens,
            row_slots=on_device(torch.arange(rows, dtype=torch.int32)),
            row_offsets=on_device(torch.zeros(rows, dtype=torch.int32)),
            row_inputs=on_device(torch.tensor([s[-1] for s in self.held], dtype=torch.int32)),
            row_positions=on_device(torch.tensor(lengths, dtype=torch.int32) - 1),
            width=max(lengths),
        )


def _v2_runner_step(engine: SlotEngine) -> Callable[[torch.Tensor], torch.Tensor]:
    """A step as AnyLogitsV2Runner takes it: histories on the device; for the requests
    that keep host states, the committed tokens' copy started before the step (in
    ``apply_staged_writes``) and waited for in it."""
    current: list[DeviceSlots] = []
    reads = CommittedReads(lambda: current[-1].tokens, lambda: current[-1].total)
    for slot, sequence in enumerate(engine.held):
        reads.admit(slot, len(sequence))

    def step(logits: torch.Tensor) -> torch.Tensor:
        current.append(DeviceSlots(engine.held))  # the runner's buffers, on the device
        reads.start(engine.gpu.host_state_lengths())  # apply_staged_writes
        rows = list(range(len(SLOT_SPECS)))
        try:
            return engine.gpu.process(
                logits, rows, committed=reads.read, device_history=current[-1].history()
            )
        finally:
            reads.grow(rows, [len(sequence) for sequence in engine.held])

    return step


def test_vllm_v2_runner_reads_histories_where_they_are() -> None:
    """Stateless groups gather histories on the device; the stateful request (slot 3)
    waits for its committed tokens' copy, started before the step: no read in the step."""
    transfers = _run_slot_engine(_v2_runner_step)
    assert transfers.blocking_copies == 0, (transfers.summary(), dict(transfers.where))
    assert transfers.device_reads == 0, (transfers.summary(), dict(transfers.where))
    assert transfers.kinds[ASYNC_D2H] == 1, (transfers.summary(), transfers.where)
    assert transfers.event_waits == 1, (transfers.summary(), transfers.where)


def test_vllm_v2_runner_stateless_requests_read_nothing() -> None:
    engine_specs = [*SLOT_SPECS[:3], SLOT_SPECS[0]]
    with mock.patch(f"{__name__}.SLOT_SPECS", engine_specs):
        transfers = _run_slot_engine(_v2_runner_step)
    assert transfers.blocking_copies == 0, (transfers.summary(), dict(transfers.where))
    assert transfers.device_reads == 0, (transfers.summary(), dict(transfers.where))
    assert transfers.event_waits == 0, (transfers.summary(), dict(transfers.where))


def test_committed_reads_take_each_requests_window_not_the_longest_sequence() -> None:
    """A grammar request of 500 tokens beside a 32k-token request reads the tokens it can
    have gained (one per step), not 32k columns (the batch-wide width it read before)."""
    windows: list[int] = []
    real_window = device_history.committed_window

    def spy(*args: Any) -> torch.Tensor:
        windows.append(args[-1])
        return real_window(*args)

    tokens = torch.zeros(2, 32_768, dtype=torch.int32)
    tokens[0, :500] = torch.arange(500) % 97
    lengths = torch.tensor([500, 32_000], dtype=torch.int32)
    reads = CommittedReads(lambda: tokens, lambda: lengths)
    reads.admit(0, 500)
    with mock.patch.object(device_history, "committed_window", spy):
        reads.start({0: 0})
        assert reads.read([0], [0]) == [(torch.arange(500) % 97).tolist()]
        for step in range(3):
            reads.grow([1, 0], [32_000 + step, 500 + step])  # this step's sequence bounds
            tokens[0, 500 + step] = 7 + step  # the token it samples
            lengths[0] += 1
            reads.start({0: 500 + step})
            assert reads.read([0], [500 + step]) == [[7 + step]]
    assert windows == [500, 1, 1, 1]


def test_committed_reads_never_miss_a_token_past_the_bound() -> None:
    """The bound only sizes the window: a slot whose length passed it (an engine that
    commits more than its bound said) is read again, as far as its length says."""
    tokens = torch.arange(40, dtype=torch.int32).reshape(1, 40)
    lengths = torch.tensor([10], dtype=torch.int32)
    reads = CommittedReads(lambda: tokens, lambda: lengths)
    reads.admit(0, 4)  # too low: 10 tokens are there
    reads.start({0: 0})
    assert reads.read([0], [0]) == [list(range(10))]
    lengths[0] = 15
    assert reads.read([0], [10]) == [list(range(10, 15))]  # nothing started: read now


def device_copy_table() -> list[tuple[str, str, int, int, str]]:
    """``(case, layout, blocking copies, device reads, kinds)`` of every case."""
    table = []
    for name in sorted(CASES):
        for layout in LAYOUTS:
            try:
                t = pipeline_transfers(lambda name=name: from_spec(CASES[name]), layout)
                table.append((name, layout, t.blocking_copies, t.device_reads, t.summary()))
            except Exception as error:  # the table shows what failed
                table.append((name, layout, -1, -1, f"{type(error).__name__}: {error}"[:120]))
    return table


if __name__ == "__main__":
    counts: collections.Counter[str] = collections.Counter()
    for line in device_copy_table():
        print(" | ".join(map(str, line)))


# ---------------------------------------------------------------------------------------
# The level cannot be fooled: processors that synchronize fail it
# ---------------------------------------------------------------------------------------


class _Syncs(LogitsProcessor):
    """A processor whose ``process`` is ``operation(logits)``, then the logits."""

    def __init__(self, operation: Callable[[torch.Tensor], Any]) -> None:
        self.operation = operation

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        self.operation(logits)
        return logits


def _read_twice_on_ties(logits: torch.Tensor) -> None:
    """One budgeted-looking read, and a second one only when the top two values tie
    (the watermark's tie path): random logits never reach it."""
    top = logits.topk(2, dim=-1).values.cpu()
    if bool((top[:, 0] == top[:, 1]).any()):
        logits.argmax(dim=-1).tolist()


SYNCING_PROCESSORS: dict[str, Callable[[torch.Tensor], Any]] = {
    # Inside ATen's CUDA kernels, no Python read in sight:
    "masked_fill_ with a 0-dim device value": lambda x: x.masked_fill_(
        x < -1e9, x.new_tensor(-1.0).amax()
    ),
    "multinomial": lambda x: torch.multinomial(x.softmax(-1), 1),
    "allclose": lambda x: torch.allclose(x, x),
    "histc with min == max": lambda x: torch.histc(x, bins=4),
    "index_put_ with a bool mask": lambda x: x.index_put_((x > 1e9,), x.new_tensor(0.0)),
    "nonzero": lambda x: (x > 0).nonzero(),
    # Host tensors beside device tensors: a device-mismatch error on CUDA.
    "a 1-element host tensor": lambda x: x.add_(torch.tensor([0.0])),
    # Copies that block:
    "non_blocking from pageable memory": lambda x: x.add_(
        torch.zeros(1, x.shape[1]).to(x.device, non_blocking=True)
    ),
    "repr of a device tensor": lambda x: repr(x[0, :2]),
    "a read only where the top two values tie": _read_twice_on_ties,
}


@pytest.mark.parametrize("name", sorted(SYNCING_PROCESSORS))
def test_a_processor_that_synchronizes_fails_the_level(name: str) -> None:
    processor_of = lambda: _Syncs(SYNCING_PROCESSORS[name])  # noqa: E731
    budget = 1 if name == "a read only where the top two values tie" else 0
    with pytest.raises((AssertionError, RuntimeError)):
        transfers = pipeline_transfers(processor_of, HOST_HISTORY)
        assert transfers.blocking_copies == 0, transfers.summary()
        assert transfers.device_reads <= budget, transfers.summary()
