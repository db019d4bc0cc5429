"""On a real CUDA device: no synchronizing call in a decode step, and the same logits as
on the CPU (transformers' ``generate`` on the device: ``tests/test_cuda_generate.py``).

Every test here skips without CUDA; ``nox -s gpu`` (``tools/gpu_check.py``) runs them on a
GPU machine, and ``docs/accelerators.md`` says what they prove beyond the CPU suite.
``tests/cuda_fixtures.py`` holds what the GPU suite's modules share: the device, the
report, the checked step and the comparison with the CPU.

The catalogue on ``cuda`` logits (every case of ``tests/test_host_sync.py``, as
``test_support.engine_rows`` defines them: the ``PROCESSOR_SPECS`` and
``VOCABULARY_SPECS`` of ``test_support.catalogue`` and a few other branches), three
decode steps on its ragged ``PROMPTS`` and 4,096-token byte ``VOCAB``, along two
paths:

- ``device history``: ``Pipeline([processor], VOCAB)(logits, input_ids, out=...)``
  with ``input_ids`` on the device, left-padded, as transformers' ``generate`` passes
  them to its hook;
- ``host history``: :class:`~anylogits.core.persistent_batch.PersistentBatch`, one
  request per slot put with its prompt ids and an output feed, as vLLM's V1 runner
  keeps them on the host; also slots that stack different parameters of one kind
  into one call, and ``test_host_sync``'s mix of kinds;
- vLLM's V2 runner: committed tokens in a per-slot device buffer, read there by
  stateless processors; a grammar's copied to pinned memory before the step; drafts
  with -1 placeholders.

Two warm-up steps, then the third under ``torch.cuda.set_sync_debug_mode("error")``:
any synchronizing CUDA call (a blocking copy either way, ``.item()``, ``.tolist()``,
``nonzero``) raises. The steps that read the device by design, as the accelerator
level's budget pins them with their reasons (``test_support/device_budget.py``: the
watermark's seeds, the top-choice states of ForceLastPhrase and the replacing
TriggerPhrase, the prefix tracker's read of ``input_ids``), run under ``"warn"``
instead, and only their result is checked: so this run proves on real hardware what
the emulated device (``tests/test_device_copies.py``) claims. Every step's logits
must equal those of the same processors on the CPU (see :data:`cuda_fixtures.RTOL`).

``ANYLOGITS_GPU_REPORT=path.json`` writes what each case did (synchronizing calls seen,
largest difference from the CPU). ``ANYLOGITS_GPU_TEST_DEVICE=cpu`` runs the same code
with the CPU as the "device" (no sync detection): a check of this harness on a machine
without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from unittest import mock

import pytest
import torch
from cuda_fixtures import (
    CUDA_ONLY_SYNCS,
    DEVICE,
    HAS_LLGUIDANCE,
    REPORT,
    REQUIRES_DEVICE,
    assert_matches_cpu,
    checked_step,
    expected_sync,
    fresh_greenlists,  # noqa: F401 (autouse)
    write_report,  # noqa: F401 (autouse)
)

from anylogits import Pipeline, from_spec
from anylogits.core.persistent_batch import PersistentBatch
from test_support.device_budget import DEVICE_HISTORY, HOST_HISTORY
from test_support.engine_rows import (
    CASES,
    PROMPTS,
    SLOT_SPECS,
    STACK_VARIANTS,
    STRUCTURED,
    VOCAB,
    WIDTH,
)
from test_support.kept_sets import BOUNDARY_TYPES

pytestmark = REQUIRES_DEVICE

STEPS = 3  # two warm-up steps (caches, device constants), then the one checked
# Rows are left-padded with the EOS id, as generate pads with pad_token_id = eos.
PAD = max(VOCAB.eos_token_ids)


def _boundary(spec: dict[str, Any]) -> bool:
    return spec["type"] in BOUNDARY_TYPES


def skip_unrunnable(name: str) -> None:
    if CASES[name]["type"] in STRUCTURED and not HAS_LLGUIDANCE:
        pytest.skip("llguidance is not installed: the structured processors need it")


def step_logits(generator: torch.Generator, rows: int) -> torch.Tensor:
    return torch.randn(rows, WIDTH, generator=generator) * 3


def left_padded(prompts: Sequence[list[int]]) -> torch.Tensor:
    width = max(map(len, prompts))
    return torch.tensor([[PAD] * (width - len(p)) + list(p) for p in prompts])


@pytest.mark.parametrize("name", sorted(CASES))
def test_device_history_path(name: str) -> None:
    """transformers' layout: input_ids on the device, every row the same width."""
    skip_unrunnable(name)
    host = Pipeline([from_spec(CASES[name])], VOCAB)
    device = Pipeline([from_spec(CASES[name])], VOCAB)
    reason = expected_sync(name, DEVICE_HISTORY)
    record = REPORT.setdefault(name, {}).setdefault(DEVICE_HISTORY, {})
    label = f"{name} ({DEVICE_HISTORY})"
    host_ids = left_padded(PROMPTS)
    device_ids = host_ids.to(DEVICE)
    generator = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        logits = step_logits(generator, len(PROMPTS))
        expected = host(logits.clone(), host_ids, out=torch.empty_like(logits))
        device_logits = logits.to(DEVICE)
        out = torch.empty_like(device_logits)

        def run(
            device_logits: torch.Tensor = device_logits,
            device_ids: torch.Tensor = device_ids,
            out: torch.Tensor = out,
        ) -> torch.Tensor:
            return device(device_logits, device_ids, out=out)

        actual = checked_step(label, reason, record, run) if step == STEPS - 1 else run()
        assert_matches_cpu(
            actual, expected, f"{label}, step {step}", record, _boundary(CASES[name])
        )
        tokens = expected.argmax(dim=-1)[:, None]
        host_ids = torch.cat([host_ids, tokens], dim=1)
        device_ids = torch.cat([device_ids, tokens.to(DEVICE)], dim=1)


class Feed:
    """An output feed (:class:`~anylogits.core.slot_requests.OutputFeed`): the tokens the
    engine generated for one request since the last read."""

    def __init__(self) -> None:
        self.pending: list[int] = []

    def read(self) -> tuple[bool, list[int]]:
        tokens, self.pending = self.pending, []
        return False, tokens


def _reraise(self: PersistentBatch, logits: torch.Tensor, row_group: Any, error: Exception) -> None:
    # PersistentBatch ends a failing request and logs why; here the error itself counts.
    raise error


def run_slots(label: str, slot_specs: list[list[dict[str, Any]]], reason: str | None) -> None:
    """Requests in slots ``0..n-1`` (prompts from PROMPTS in turn), on the CPU and on the
    device, through ``STEPS`` decode steps; the last one checked."""
    record = REPORT.setdefault(label, {}).setdefault(HOST_HISTORY, {})
    host, device = PersistentBatch(VOCAB), PersistentBatch(VOCAB)
    feeds = [(Feed(), Feed()) for _ in slot_specs]
    for slot, specs in enumerate(slot_specs):
        prompt = PROMPTS[slot % len(PROMPTS)]
        host.put(slot, specs, prompt_ids=prompt, output=feeds[slot][0])
        device.put(slot, specs, prompt_ids=prompt, output=feeds[slot][1])
    generator = torch.Generator().manual_seed(0)
    with mock.patch.object(PersistentBatch, "_fail", _reraise):
        for step in range(STEPS):
            logits = step_logits(generator, len(slot_specs))
            expected = host.process(logits.clone())
            device_logits = logits.to(DEVICE)

            def run(device_logits: torch.Tensor = device_logits) -> torch.Tensor:
                return device.process(device_logits)

            if step == STEPS - 1:
                actual = checked_step(f"{label} ({HOST_HISTORY})", reason, record, run)
            else:
                actual = run()
            assert_matches_cpu(
                actual,
                expected,
                f"{label} ({HOST_HISTORY}), step {step}",
                record,
                any(_boundary(spec) for specs in slot_specs for spec in specs),
            )
            for (host_feed, device_feed), token in zip(
                feeds, expected.argmax(dim=-1).tolist(), strict=True
            ):
                host_feed.pending.append(token)
                device_feed.pending.append(token)


@pytest.mark.parametrize("name", sorted(CASES))
def test_host_history_path(name: str) -> None:
    """vLLM's V1 layout: one request per slot, histories on the host, logits on the
    device."""
    skip_unrunnable(name)
    specs = [[CASES[name]] for _ in PROMPTS]
    run_slots(name, specs, expected_sync(name, HOST_HISTORY))


@pytest.mark.parametrize("name", sorted(STACK_VARIANTS))
def test_host_history_path_stacked(name: str) -> None:
    """Slots of one kind with different parameters: one stacked call, as vLLM groups
    its rows."""
    specs = [[(CASES[name], STACK_VARIANTS[name])[slot % 2]] for slot in range(4)]
    run_slots(f"{name} stacked", specs, CUDA_ONLY_SYNCS.get((f"{name} stacked", HOST_HISTORY)))


def test_host_history_path_mixed_slots() -> None:
    """test_host_sync's slots: stacked penalties, biases and DRY, and a row tracking
    its sequence (stop strings, min new tokens)."""
    run_slots("slot mix", SLOT_SPECS, CUDA_ONLY_SYNCS.get(("slot mix", HOST_HISTORY)))


ROW_SLOTS = (0, 1, 2)  # the stateless slots of SLOT_SPECS, one row each


def test_device_slot_history_path() -> None:
    """vLLM's V2 layout: committed tokens in a per-slot device buffer, lengths ``pos + 1``
    on the device; the stateless slots of SLOT_SPECS gather their histories there
    (:class:`~anylogits.core.device_history.SlotHistory`) and read nothing back."""
    from anylogits.core.device_history import SlotHistory

    slot_specs = SLOT_SPECS[: len(ROW_SLOTS)]
    label = "slot mix, device-resident histories"
    record = REPORT.setdefault(label, {}).setdefault("device slots", {})
    held = [list(PROMPTS[slot % len(PROMPTS)]) for slot in range(len(slot_specs))]
    host, device = PersistentBatch(VOCAB), PersistentBatch(VOCAB)
    for slot, specs in enumerate(slot_specs):
        host.put(slot, specs, prompt_length=len(held[slot]))
        device.put(slot, specs, prompt_length=len(held[slot]))

    def committed(slots: list[int], starts: list[int]) -> list[list[int]]:
        return [held[slot][start:] for slot, start in zip(slots, starts, strict=True)]

    tokens = torch.zeros(len(slot_specs), 64, dtype=torch.int32, device=DEVICE)
    generator = torch.Generator().manual_seed(0)
    with mock.patch.object(PersistentBatch, "_fail", _reraise):
        for step in range(STEPS):
            for slot, sequence in enumerate(held):  # the runner's own staged writes
                tokens[slot, : len(sequence)] = torch.tensor(sequence, dtype=torch.int32)
            lengths = torch.tensor([len(s) for s in held], dtype=torch.int32)
            rows = len(held)
            history = SlotHistory(
                tokens,
                row_slots=torch.arange(rows, dtype=torch.int32).to(DEVICE),
                row_offsets=torch.zeros(rows, dtype=torch.int32).to(DEVICE),
                row_inputs=torch.tensor([s[-1] for s in held], dtype=torch.int32).to(DEVICE),
                row_positions=(lengths - 1).to(DEVICE),
                width=int(lengths.max()),
            )
            logits = step_logits(generator, rows)
            expected = host.process(logits.clone(), committed=committed)
            device_logits = logits.to(DEVICE)

            def run(
                device_logits: torch.Tensor = device_logits,
                history: SlotHistory = history,
            ) -> torch.Tensor:
                return device.process(device_logits, ROW_SLOTS, device_history=history)

            actual = checked_step(label, None, record, run) if step == STEPS - 1 else run()
            assert_matches_cpu(actual, expected, f"{label}, step {step}", record)
            for sequence, token in zip(held, expected.argmax(dim=-1).tolist(), strict=True):
                sequence.append(token)


V2_LONG_PROMPT = 4_000  # beside a short grammar request: its reads must not follow this one
V2_DRAFTS = {1: [4, 5]}  # the long request's drafts each step
V2_PLACEHOLDERS = 2  # slot 2 is still in prefill: vLLM feeds -1 as its drafts


def _v2_requests() -> list[tuple[list[dict[str, Any]], list[int]]]:
    """The V2 step's requests: (processor specs, prompt) per slot."""
    grammar = CASES["regex"] if HAS_LLGUIDANCE else CASES["force_sequence"]
    generator = torch.Generator().manual_seed(1)
    long_prompt = torch.randint(8, VOCAB.size, (V2_LONG_PROMPT,), generator=generator)
    return [
        ([grammar], list(PROMPTS[0])),
        ([CASES["repetition_penalty"], CASES["no_repeat_ngram"]], long_prompt.tolist()),
        ([CASES["force_sequence"], CASES["repetition_penalty"]], list(PROMPTS[2])),
    ]


def test_v2_runner_step_on_the_device() -> None:
    """vLLM's V2 runner's step as AnyLogitsV2Runner takes it, on the device: committed
    tokens in a per-slot device buffer (``all_token_ids``; vLLM's dense layout), a grammar
    request beside a 4,000-token one, speculative rows with real drafts and a request in
    prefill whose drafts are vLLM's -1 placeholders. ``apply_staged_writes`` starts the
    copy of the grammar's committed tokens into pinned memory before the "forward";
    the step itself, under ``set_sync_debug_mode("error")``, must not synchronize (the
    adapter's one budgeted read, the row layout under speculative decoding, is made
    here on the host, as LogitsContext's host fields would give it). Every row must
    equal vLLM V1's host path on the CPU (histories built on the host, drafts as lists)."""
    from anylogits.core.device_history import CommittedReads, SlotHistory

    requests = _v2_requests()
    label = "vLLM V2 step: grammar beside a long request, placeholder drafts"
    record = REPORT.setdefault(label, {}).setdefault("device slots", {})
    record["grammar"] = requests[0][0][0]["type"]
    held = [list(prompt) for _, prompt in requests]
    host, device = PersistentBatch(VOCAB), PersistentBatch(VOCAB)
    tokens = torch.zeros(len(held), V2_LONG_PROMPT + 64, dtype=torch.int32, device=DEVICE)
    total = torch.zeros(len(held), dtype=torch.int32, device=DEVICE)
    reads = CommittedReads(lambda: tokens, lambda: total)
    for slot, (specs, prompt) in enumerate(requests):
        host.put(slot, specs, prompt_length=len(prompt))
        device.put(slot, specs, prompt_length=len(prompt))
        reads.admit(slot, len(prompt))

    def committed(slots: list[int], starts: list[int]) -> list[list[int]]:
        return [held[slot][start:] for slot, start in zip(slots, starts, strict=True)]

    generator = torch.Generator().manual_seed(0)
    with mock.patch.object(PersistentBatch, "_fail", _reraise):
        for step in range(STEPS + 1):
            for slot, sequence in enumerate(held):  # the runner's staged writes
                tokens[slot, : len(sequence)] = torch.tensor(sequence, dtype=torch.int32)
                total[slot] = len(sequence)
            reads.start(device.host_state_lengths())  # apply_staged_writes
            slots, offsets, inputs, drafts = [], [], [], []
            for slot, sequence in enumerate(held):
                placeholder = slot == 2
                request_drafts = [-1] * V2_PLACEHOLDERS if placeholder else V2_DRAFTS.get(slot, [])
                for offset in range(len(request_drafts) + 1):
                    slots.append(slot)
                    offsets.append(offset)
                    inputs.append(request_drafts[offset - 1] if offset else sequence[-1])
                    drafts.append([] if placeholder else request_drafts[:offset])
            positions = [len(held[s]) - 1 + o for s, o in zip(slots, offsets, strict=True)]
            bounds = [len(s) + len(V2_DRAFTS.get(n, [])) for n, s in enumerate(held)]
            as_device = lambda values: torch.tensor(values, dtype=torch.int32).to(DEVICE)  # noqa: E731
            history = SlotHistory(
                tokens,
                row_slots=as_device(slots),
                row_offsets=as_device(offsets),
                row_inputs=as_device(inputs),
                row_positions=as_device(positions),
                width=max(bounds) + len(slots) - len(held),
            )
            logits = step_logits(generator, len(slots))
            expected = host.process(logits.clone(), slots, drafts=drafts, committed=committed)
            device_logits = logits.to(DEVICE)

            def run(
                device_logits: torch.Tensor = device_logits,
                history: SlotHistory = history,
                slots: list[int] = slots,
                drafts: list[list[int]] = drafts,
                bounds: list[int] = bounds,
            ) -> torch.Tensor:
                try:
                    return device.process(
                        device_logits,
                        slots,
                        drafts=drafts,
                        committed=reads.read,
                        device_history=history,
                    )
                finally:
                    reads.grow(list(range(len(held))), bounds)

            actual = checked_step(label, None, record, run) if step >= STEPS - 1 else run()
            assert_matches_cpu(actual, expected, f"{label}, step {step}", record)
            for slot, sequence in enumerate(held):
                sequence.append(int(expected[slots.index(slot)].argmax()))
