"""The accelerator level (issue 34): a decode step on an emulated device, every transfer
counted, every result the CPU's.

The logits (and whatever the engine keeps on the device) are
:class:`~test_support.emulated_device.DeviceTensor` s: they report a device that is not
the CPU, so every processor takes its accelerator branch, while their values live on the
CPU, so each result is compared with the same call on CPU tensors. Counted per call:
host->device copies, blocking or not, and device->host reads (see
``test_support/emulated_device.py``). The budget per steady-state step (after two
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
from anylogits.core.batch import Batch
from anylogits.core.device_history import SlotHistory, committed_since
from anylogits.core.persistent_batch import PersistentBatch
from anylogits.processors import watermark as watermark_module
from anylogits.processors._greenlist import GreenlistCache
from test_support.device_budget import DEVICE_HISTORY, HOST_HISTORY, LAYOUTS, expected_device_reads
from test_support.emulated_device import (
    EmulatedDevice,
    Transfers,
    host_values,
    on_device,
)
from test_support.engine_rows import CASES, PROMPTS, SLOT_SPECS, STACK_VARIANTS, VOCAB, WIDTH

STEPS = 3  # two warm-up calls (caches of device constants fill), then the counted one


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
    for _ in range(steps):
        logits = torch.randn(len(rows.sequences), WIDTH, generator=generator) * 3
        expected = reference(logits.clone())
        with device.counting() as transfers:
            actual = step(on_device(logits))
        each_step.append(transfers)
        torch.testing.assert_close(host_values(actual), expected, rtol=0, atol=0, equal_nan=True)
        rows.commit(expected)
    return each_step[-1]


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
            "h2d non_blocking": lambda: host.to(device.device, non_blocking=True),
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

    def committed(self, slots: list[int], starts: list[int]) -> list[list[int]]:
        """As AnyLogitsV2Runner reads them."""
        width = max(len(sequence) for sequence in self.held)
        return committed_since(self.tokens, self.total, slots, starts, width)


def _v2_runner_step(engine: SlotEngine) -> Callable[[torch.Tensor], torch.Tensor]:
    """A step as AnyLogitsV2Runner takes it: histories on the device, committed tokens
    read from there for the requests that keep host states."""

    def step(logits: torch.Tensor) -> torch.Tensor:
        slots = DeviceSlots(engine.held)  # the runner's buffers, already on the device
        return engine.gpu.process(
            logits,
            list(range(len(SLOT_SPECS))),
            committed=slots.committed,
            device_history=slots.history(),
        )

    return step


def test_vllm_v2_runner_reads_histories_where_they_are() -> None:
    """Stateless groups gather histories on the device; the stateful request (slot 3)
    reads its committed tokens once per step (its states advance on the host)."""
    transfers = _run_slot_engine(_v2_runner_step)
    assert transfers.blocking_copies == 0, (transfers.summary(), dict(transfers.where))
    assert dict(transfers.kinds).get("d2h tolist") == 1, (transfers.summary(), transfers.where)
    assert transfers.device_reads == 1, (transfers.summary(), dict(transfers.where))


def test_vllm_v2_runner_stateless_requests_read_nothing() -> None:
    engine_specs = [*SLOT_SPECS[:3], SLOT_SPECS[0]]
    with mock.patch(f"{__name__}.SLOT_SPECS", engine_specs):
        transfers = _run_slot_engine(_v2_runner_step)
    assert transfers.blocking_copies == 0, (transfers.summary(), dict(transfers.where))
    assert transfers.device_reads == 0, (transfers.summary(), dict(transfers.where))


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
