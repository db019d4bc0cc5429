"""The accelerator level through each engine's own hook: a decode step on an emulated
device (``test_support/emulated_device/``), called as the engine calls it, makes no
blocking host->device copy and only the device reads pinned in
``test_support/device_budget.py``; every result equals the core pipeline's on the CPU.

transformers hands ``input_ids`` and ``scores`` on the model's device; rows are beams
(reordered and forked every call) and assisted-decoding candidates (rolled back).
vLLM's V1 runner hands device logits and keeps histories in host lists it reports
through ``BatchUpdate``; transformers' continuous batching hands device scores and keeps
histories in its request states on the host (its manager runs synchronously with the
hook: no CUDA graph replays a step without it). llama.cpp and mlx-lm hand host arrays
(numpy; MLX's unified memory): they have no torch device to copy to, so the level does
not apply there.
vLLM's V2 runner (device-resident histories) is driven in ``test_vllm_hook.py``.
"""

from __future__ import annotations

import pytest
import torch

from anylogits import Pipeline
from anylogits.testing.check import VOCAB_SIZE, call_sequence
from test_support.catalogue import PROCESSOR_SPECS, build
from test_support.device_budget import DEVICE_HISTORY, HOST_HISTORY, expected_device_reads
from test_support.emulated_device import EmulatedDevice, Transfers, host_values, on_device

# Where each engine keeps the token history it hands its hook.
LAYOUT = {"transformers": DEVICE_HISTORY, "vllm": HOST_HISTORY, "transformers_cb": HOST_HISTORY}
BATCH = 3
WARM_UP = 2  # calls before the counted ones: device constants are made once


@pytest.mark.parametrize("name", sorted(PROCESSOR_SPECS))
def test_hook_step_on_a_device_copies_without_blocking(backend, name: str) -> None:
    if backend.name not in LAYOUT:
        pytest.skip(f"{backend.name} hands its hook host arrays: no device to copy to")
    if name in ("json_schema", "regex", "choice", "grammar"):
        pytest.importorskip("llguidance")
    layout = LAYOUT[backend.name]
    hook = backend.hook([build(name)])
    core = Pipeline([build(name)])
    generator = torch.Generator().manual_seed(0)
    steps: list[Transfers] = []
    with EmulatedDevice() as device:
        for ids in call_sequence(BATCH, seed=3):
            logits = torch.randn(BATCH, VOCAB_SIZE, generator=generator)
            expected = core(logits.clone(), ids)
            history = on_device(ids) if layout == DEVICE_HISTORY else ids
            with device.counting() as transfers:
                actual = backend.call(hook, history, on_device(logits))
            torch.testing.assert_close(host_values(actual), expected, rtol=0, atol=0)
            steps.append(transfers)
    budget, reason = expected_device_reads(name, build(name), layout)
    for index, transfers in enumerate(steps[WARM_UP:], start=WARM_UP):
        where = f"{name} on {backend.name}, call {index}: {transfers.summary()}"
        assert not transfers.unclassified, f"unclassified device operations: {where}"
        assert transfers.blocking_copies == 0, f"blocking copies: {where} at {transfers.where}"
        # A processor reads only on the calls where its state needs a decision (the
        # exact counts per case: tests/test_device_copies.py).
        assert transfers.device_reads <= budget, f"over {budget} ({reason}): {where}"
