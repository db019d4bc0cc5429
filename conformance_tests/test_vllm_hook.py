"""vLLM hook level: both runner classes driven by vLLM's own bookkeeping objects.

V1: random sequences of requests added (fresh or resumed), removed, moved and swapped,
told to :class:`AnyLogitsV1Runner` through vLLM's ``BatchUpdate`` with live output lists, as
the persistent batch does. V2: requests admitted into recycled slots with
``add_request``, steps laid out by vLLM's ``LogitsContext`` with rows in any order and
speculative-decoding rows (one per draft position) whose drafts are partly rejected.

Every row must equal a core :class:`Pipeline` that sees only that request's token
history (its own tracker infers states from prefixes), and rows without processors must
stay untouched.

The V2 runner's buffers (``StagedWriteTensor`` / ``UvaBackedTensor``) need pinned
memory and Triton, which a CPU-only machine lacks, so the request-state object is vLLM's
own ``LogitsProcRequestState`` holding plain tensors with the same ``.gpu`` / ``.np``
attributes. Generation under the V2 runner needs a CUDA GPU.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

vllm = pytest.importorskip("vllm")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import VllmConfig  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from anylogits import Pipeline, to_specs, vllm_xargs  # noqa: E402
from anylogits.adapters.vllm import (  # noqa: E402
    SPECULATIVE_DECODING_V1,
    AnyLogits,
    AnyLogitsV1Runner,
    AnyLogitsV1RunnerArgmaxInvariant,
    AnyLogitsV2Runner,
    for_vllm,
    vllm_processor_class,
)
from test_support.catalogue import PROCESSOR_SPECS, build  # noqa: E402
from test_support.device_budget import V2_READS  # noqa: E402

pytestmark = pytest.mark.only_backend("vllm")

V2_INTERFACE = pytest.importorskip("vllm.v1.worker.gpu.sample.logits_processor")

VOCAB = 48
SPEC_SETS: list[list[str] | None] = [
    None,
    ["repetition_penalty"],
    ["stateful_probe"],
    ["min_new_tokens", "logit_bias"],
    ["temperature", "top_k"],
    ["no_repeat_ngram", "stateful_probe"],
]
ALWAYS_CHANGES = ["min_new_tokens", "logit_bias"]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def params(spec_set: list[str] | None) -> SamplingParams:
    if spec_set is None:
        return SamplingParams()
    return SamplingParams(extra_args={"anylogits": [PROCESSOR_SPECS[n] for n in spec_set]})


class Oracle:
    """One request as the core sees it: its own pipeline, fed its history alone."""

    def __init__(self, spec_set: list[str] | None, prompt: list[int]) -> None:
        self.pipeline = None if spec_set is None else Pipeline([build(n) for n in spec_set])
        if self.pipeline is not None and self.pipeline.tracker is not None:
            # The tracker takes the first history it sees as the prompt.
            self.pipeline(torch.zeros(1, VOCAB), torch.tensor([prompt]))

    def expected(self, row: torch.Tensor, history: list[int]) -> torch.Tensor:
        if self.pipeline is None:
            return row
        return self.pipeline(row[None].clone(), torch.tensor([history]))[0]


# --------------------------------------------------------------------------- V1 runner


class V1Engine:
    """vLLM's persistent batch: rows 0..n-1 occupied, holes filled by one-way moves."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.processor = AnyLogitsV1Runner(VllmConfig(), torch.device("cpu"), False)
        self.rows: list[dict[str, Any]] = []  # row -> request
        self.finished: list[dict[str, Any]] = []

    def step(self) -> None:
        """One step of vLLM's InputBatch: removals, additions into the lowest holes (or
        appended), holes left over condensed by one-way moves from the end, a swap."""
        draw = self.data.draw
        removed, added, moved = [], [], []
        for row in sorted(draw(st.sets(st.integers(0, max(len(self.rows) - 1, 0))))):
            if row < len(self.rows):
                self.finished.append(self.rows[row])
                self.rows[row] = None  # type: ignore[call-overload]
                removed.append(row)
        holes = list(removed)
        first_step = not self.rows and not self.finished
        for index in range(draw(st.integers(1 if first_step else 0, 3))):
            # The first request always biases a token, so every example proves something.
            request = self.new_request(ALWAYS_CHANGES if first_step and index == 0 else None)
            if holes:
                row = holes.pop(0)
                self.rows[row] = request
            else:
                self.rows.append(request)
                row = len(self.rows) - 1
            added.append((row, params(request["specs"]), request["prompt"], request["output"]))
        for hole in holes:
            while self.rows and self.rows[-1] is None:
                self.rows.pop()
            if hole < len(self.rows):
                # A one-way move onto a slot that was reported removed.
                moved.append((len(self.rows) - 1, hole, MoveDirectionality.UNIDIRECTIONAL))
                self.rows[hole] = self.rows.pop()
        while self.rows and self.rows[-1] is None:
            self.rows.pop()
        if len(self.rows) >= 2 and draw(st.booleans()):
            a, b = draw(st.permutations(range(len(self.rows))))[:2]
            self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
            moved.append((a, b, MoveDirectionality.SWAP))
        update = BatchUpdate(len(self.rows), removed=removed, added=added, moved=moved)
        self.processor.update_state(update if (removed or added or moved) else None)

    def new_request(self, spec_set: list[str] | None = None) -> dict[str, Any]:
        draw = self.data.draw
        spec_set = spec_set or draw(st.sampled_from(SPEC_SETS))
        if self.finished and draw(st.booleans()):
            # Preempted and resumed: re-added with its prompt and the outputs so far.
            old = self.finished.pop()
            request = dict(old, output=list(old["output"]))
            return request
        prompt = draw(st.lists(st.integers(0, 7), min_size=1, max_size=6))
        return {
            "specs": spec_set,
            "prompt": prompt,
            "output": [],
            "oracle": Oracle(spec_set, prompt),
        }

    def run(self, steps: int) -> bool:
        changed = False
        generator = torch.Generator().manual_seed(self.data.draw(st.integers(0, 1000)))
        for _ in range(steps):
            self.step()
            if not self.rows:
                continue
            logits = torch.randn(len(self.rows), VOCAB, generator=generator)
            expected = torch.stack(
                [
                    r["oracle"].expected(logits[i], r["prompt"] + r["output"])
                    for i, r in enumerate(self.rows)
                ]
            )
            actual = self.processor.apply(logits.clone())
            torch.testing.assert_close(actual, expected, rtol=0, atol=0)
            changed |= not torch.equal(actual, logits)
            for request in self.rows:
                request["output"].append(self.data.draw(st.integers(0, 7)))
        return changed


@SETTINGS
@given(st.data())
def test_v1_rows_follow_batch_updates(data: Any) -> None:
    assert V1Engine(data).run(steps=8), "no processor changed any logits"


# --------------------------------------------------------------------------- V2 runner


class V2Engine:
    """vLLM's V2 runner: slots recycled, rows per step in any order, draft rows."""

    max_slots = 6
    max_len = 64

    def __init__(self, data: Any) -> None:
        self.data = data
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.int32)  # noqa: E731
        self.prompt_len = SimpleNamespace(np=zeros(self.max_slots).numpy())
        self.prompt_len.gpu = torch.from_numpy(self.prompt_len.np)
        self.states = V2_INTERFACE.LogitsProcRequestState(
            device=torch.device("cpu"),
            max_num_reqs=self.max_slots,
            vocab_size=VOCAB,
            all_token_ids=SimpleNamespace(gpu=zeros(self.max_slots, self.max_len)),
            prompt_len=self.prompt_len,
            prefill_len=SimpleNamespace(np=zeros(self.max_slots).numpy()),
            total_len=SimpleNamespace(gpu=zeros(self.max_slots)),
        )
        self.processor = AnyLogitsV2Runner(VllmConfig(), self.states)
        self.active: dict[int, dict[str, Any]] = {}

    def committed(self, slot: int) -> list[int]:
        total = int(self.states.total_len.gpu[slot])
        return self.states.all_token_ids.gpu[slot, :total].tolist()

    def admit(self, spec_set: list[str] | None = None) -> None:
        draw = self.data.draw
        free = [s for s in range(self.max_slots) if s not in self.active]
        if not free:
            return
        slot = draw(st.sampled_from(free))
        spec_set = spec_set or draw(st.sampled_from(SPEC_SETS))
        prompt = draw(st.lists(st.integers(0, 7), min_size=1, max_size=6))
        resumed = draw(st.lists(st.integers(0, 7), max_size=3))  # outputs before preemption
        tokens = prompt + resumed
        self.prompt_len.np[slot] = len(prompt)
        self.states.prefill_len.np[slot] = len(tokens)
        self.states.all_token_ids.gpu[slot, : len(tokens)] = torch.tensor(tokens)
        self.states.total_len.gpu[slot] = len(tokens)
        wants = self.processor.add_request(slot, params(spec_set))
        assert wants == (spec_set is not None)
        self.active[slot] = {"oracle": Oracle(spec_set, prompt)}

    def step(self, generator: torch.Generator) -> bool:
        draw = self.data.draw
        order = draw(st.permutations(sorted(self.active)))
        slots, offsets, inputs, histories = [], [], [], []
        drafts_of: dict[int, list[int]] = {}
        bounds = []
        for slot in order:
            committed = self.committed(slot)
            drafts = draw(st.lists(st.integers(0, 7), max_size=2))
            # A request still in its prefill: vLLM feeds placeholders (-1) as its drafts,
            # and rejects them; its rows see the committed tokens only.
            placeholder = bool(drafts) and draw(st.booleans())
            drafts_of[slot] = [] if placeholder else drafts
            bounds.append(len(committed) + len(drafts))
            for p in range(len(drafts) + 1):
                slots.append(slot)
                offsets.append(p)
                inputs.append(committed[-1] if p == 0 else -1 if placeholder else drafts[p - 1])
                histories.append(committed + drafts_of[slot][:p])
        logits = torch.randn(len(slots), VOCAB, generator=generator)
        expected = torch.stack(
            [
                self.active[s]["oracle"].expected(logits[i], histories[i])
                for i, s in enumerate(slots)
            ]
        )
        ctx = V2_INTERFACE.LogitsContext(
            expanded_idx_mapping=torch.tensor(slots, dtype=torch.int32),
            idx_mapping=torch.tensor(order, dtype=torch.int32),
            idx_mapping_np=torch.tensor(order, dtype=torch.int32).numpy(),
            expanded_local_pos=torch.tensor(offsets, dtype=torch.int32),
            input_ids=torch.tensor(inputs, dtype=torch.int32),
            pos=torch.tensor(
                [len(self.committed(s)) - 1 + p for s, p in zip(slots, offsets, strict=True)],
                dtype=torch.int32,
            ),
            seq_lens_upper_bound_np=np.array(bounds, dtype=np.int32),
        )
        if draw(st.booleans()):  # vLLM calls it every step; an older caller may not
            self.processor.apply_staged_writes()
        actual = self.processor.apply(logits.clone(), ctx)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        # Accept a prefix of each request's drafts plus one sampled token.
        for slot, drafts in drafts_of.items():
            accepted = [*drafts[: draw(st.integers(0, len(drafts)))], draw(st.integers(0, 7))]
            total = int(self.states.total_len.gpu[slot])
            self.states.all_token_ids.gpu[slot, total : total + len(accepted)] = torch.tensor(
                accepted
            )
            self.states.total_len.gpu[slot] = total + len(accepted)
        return not torch.equal(actual, logits)

    def run(self, steps: int) -> bool:
        draw = self.data.draw
        generator = torch.Generator().manual_seed(draw(st.integers(0, 1000)))
        changed = False
        self.admit(ALWAYS_CHANGES)
        for step in range(steps):
            if step:
                for slot in draw(st.sets(st.sampled_from(sorted(self.active) or [None]))):
                    self.active.pop(slot, None)  # finished: V2 has no removal callback
            for _ in range(draw(st.integers(0, 2))):
                self.admit()
            if self.active:
                changed |= self.step(generator)
        return changed


@SETTINGS
@given(st.data())
def test_v2_rows_follow_slots_and_draft_positions(data: Any) -> None:
    assert V2Engine(data).run(steps=6), "no processor changed any logits"


# --------------------------------------------------------------------------- API


def test_validate_params_names_the_bad_field() -> None:
    bad = SamplingParams(extra_args={"anylogits": [{"type": "top_k", "top_k": 0}]})
    for cls in (AnyLogitsV1Runner, AnyLogitsV2Runner, AnyLogits):
        with pytest.raises(ValueError, match=r"extra_args\['anylogits'\]\[0\].*top_k"):
            cls.validate_params(bad)
    with pytest.raises(ValueError, match="unknown field"):
        AnyLogitsV1Runner.validate_params(
            SamplingParams(extra_args={"anylogits": [{"type": "top_k", "k": 3}]})
        )
    with pytest.raises(ValueError, match="not valid JSON"):
        AnyLogitsV1Runner.validate_params(SamplingParams(extra_args={"anylogits": "[{"}))
    AnyLogitsV1Runner.validate_params(SamplingParams())  # no specs: nothing to check


def test_for_vllm_and_vllm_xargs_carry_the_same_specs() -> None:
    processors = [build("repetition_penalty"), build("top_k")]
    sampling = for_vllm(*processors, max_tokens=7, extra_args={"user": 1})
    assert sampling.max_tokens == 7 and sampling.extra_args["user"] == 1
    assert sampling.extra_args["anylogits"] == to_specs(processors)
    xargs = vllm_xargs(*processors)
    assert isinstance(xargs["anylogits"], str)  # the server only carries flat values
    AnyLogitsV1Runner.validate_params(SamplingParams(extra_args=xargs))
    with pytest.raises(ValueError, match="already has"):
        for_vllm(*processors, extra_args={"anylogits": []})


def test_argmax_invariance_is_reported_per_processor_set() -> None:
    assert not AnyLogitsV1Runner(VllmConfig(), torch.device("cpu"), False).is_argmax_invariant()
    invariant = AnyLogitsV1RunnerArgmaxInvariant(VllmConfig(), torch.device("cpu"), False)
    assert invariant.is_argmax_invariant()
    AnyLogitsV1RunnerArgmaxInvariant.validate_params(for_vllm(build("top_k"), build("temperature")))
    with pytest.raises(ValueError, match=r"\[1\] is RepetitionPenalty"):
        AnyLogitsV1RunnerArgmaxInvariant.validate_params(
            for_vllm(build("top_k"), build("repetition_penalty"))
        )
    # The processors it accepts really leave every row's argmax in place.
    logits = torch.randn(4, VOCAB)
    invariant.update_state(
        BatchUpdate(1, removed=[], added=[(0, for_vllm(build("top_p")), [1], [])], moved=[])
    )
    assert torch.equal(invariant.apply(logits.clone()).argmax(-1), logits.argmax(-1))


def test_processor_class_matches_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert vllm_processor_class() is AnyLogitsV2Runner
    assert vllm_processor_class(speculative=True) is AnyLogitsV2Runner
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert vllm_processor_class() is AnyLogitsV1Runner
    assert vllm_processor_class(argmax_invariant=True) is AnyLogitsV1RunnerArgmaxInvariant
    with pytest.raises(ValueError, match="speculative decoding") as error:
        vllm_processor_class(speculative=True)
    assert str(error.value) == SPECULATIVE_DECODING_V1
    assert vllm_processor_class(VllmConfig()) is AnyLogitsV1Runner  # no Triton on this machine


def test_one_class_serves_both_runners() -> None:
    v1 = AnyLogits(VllmConfig(), torch.device("cpu"), False)
    v1.update_state(
        BatchUpdate(1, removed=[], added=[(0, params(["logit_bias"]), [1], [])], moved=[])
    )
    logits = torch.zeros(1, VOCAB)
    assert v1.apply(logits.clone())[0, 2] == 3.0
    engine = V2Engine(None)
    engine.processor = AnyLogits(VllmConfig(), engine.states)
    engine.prompt_len.np[0] = 1
    engine.states.total_len.gpu[0] = 1
    assert engine.processor.add_request(0, params(["logit_bias"]))
    ctx = V2_INTERFACE.LogitsContext(
        expanded_idx_mapping=torch.tensor([0]),
        idx_mapping=torch.tensor([0]),
        idx_mapping_np=torch.tensor([0]).numpy(),
        expanded_local_pos=torch.tensor([0]),
        input_ids=torch.tensor([0]),
        pos=torch.tensor([0]),
        seq_lens_upper_bound_np=torch.tensor([1]).numpy(),
    )
    assert engine.processor.apply(logits.clone(), ctx)[0, 2] == 3.0


def test_the_unreleased_first_class_names_are_gone() -> None:
    """``AnyLogitsV1`` / ``AnyLogitsV2`` read as engine versions; they are runners, and
    no release had them."""
    from anylogits.adapters import vllm

    for name in ("AnyLogitsV1", "AnyLogitsV1ArgmaxInvariant", "AnyLogitsV2"):
        assert not hasattr(vllm, name), name


# --------------------------------------------------------------------------- V2 on a device


def _v2_step_on_device(
    spec_sets: list[list[str]],
    drafts: list[list[int]],
    steps: int = 3,
    placeholders: frozenset[int] = frozenset(),
) -> list[tuple[int, int, int]]:
    """AnyLogitsV2Runner with the runner's buffers and the step's LogitsContext on an
    emulated device (test_support.emulated_device), each result checked against the core
    oracle: ``(blocking host->device copies, device reads, event waits)`` of each step's
    ``apply``, after ``apply_staged_writes`` as vLLM calls it before the forward. The slots
    in ``placeholders`` are in prefill: vLLM feeds -1 as their drafts."""
    from test_support.emulated_device import EmulatedDevice, host_values, on_device

    slots, max_len = len(spec_sets), 64
    prompts = [[1 + slot, 2, 3, 1 + slot][: 2 + slot] for slot in range(slots)]
    held = [list(p) for p in prompts]
    generator = torch.Generator().manual_seed(0)
    counts = []
    with EmulatedDevice() as device:
        tokens = on_device(torch.zeros(slots, max_len, dtype=torch.int32))
        total = on_device(torch.zeros(slots, dtype=torch.int32))
        prompt_len = SimpleNamespace(np=torch.zeros(slots, dtype=torch.int32).numpy())
        prefill_len = SimpleNamespace(np=torch.zeros(slots, dtype=torch.int32).numpy())
        states = V2_INTERFACE.LogitsProcRequestState(
            device=device.device,
            max_num_reqs=slots,
            vocab_size=VOCAB,
            all_token_ids=SimpleNamespace(gpu=tokens),
            prompt_len=prompt_len,
            prefill_len=prefill_len,
            total_len=SimpleNamespace(gpu=total),
        )
        runner = AnyLogitsV2Runner(VllmConfig(), states)
        oracles = []
        for slot, spec_set in enumerate(spec_sets):
            prompt_len.np[slot] = prefill_len.np[slot] = len(prompts[slot])
            host_values(tokens)[slot, : len(prompts[slot])] = torch.tensor(prompts[slot])
            host_values(total)[slot] = len(prompts[slot])
            assert runner.add_request(slot, params(spec_set))
            oracles.append(Oracle(spec_set, prompts[slot]))
        for _ in range(steps):
            for slot, sequence in enumerate(held):  # the runner's staged writes
                host_values(tokens)[slot, : len(sequence)] = torch.tensor(sequence)
                host_values(total)[slot] = len(sequence)
            rows, offsets, inputs, histories = [], [], [], []
            for slot, sequence in enumerate(held):
                placeholder = slot in placeholders
                for p in range(len(drafts[slot]) + 1):
                    rows.append(slot)
                    offsets.append(p)
                    if p == 0:
                        inputs.append(sequence[-1])
                    else:
                        inputs.append(-1 if placeholder else drafts[slot][p - 1])
                    histories.append(sequence + ([] if placeholder else drafts[slot][:p]))
            logits = torch.randn(len(rows), VOCAB, generator=generator)
            expected = torch.stack(
                [oracles[s].expected(logits[i], histories[i]) for i, s in enumerate(rows)]
            )
            as_int = lambda values: on_device(torch.tensor(values, dtype=torch.int32))  # noqa: E731
            ctx = V2_INTERFACE.LogitsContext(
                expanded_idx_mapping=as_int(rows),
                idx_mapping=as_int(list(range(slots))),
                idx_mapping_np=torch.arange(slots, dtype=torch.int32).numpy(),
                expanded_local_pos=as_int(offsets),
                input_ids=as_int(inputs),
                # A row's position counts its drafts, placeholders too.
                pos=as_int([len(held[s]) - 1 + p for s, p in zip(rows, offsets, strict=True)]),
                seq_lens_upper_bound_np=torch.tensor(
                    [len(s) + len(d) for s, d in zip(held, drafts, strict=True)]
                ).numpy(),
            )
            with device.counting() as staged:
                runner.apply_staged_writes()  # before the forward
            assert staged.blocking_copies == staged.device_reads == 0, staged.summary()
            with device.counting() as transfers:
                actual = runner.apply(on_device(logits), ctx)
            torch.testing.assert_close(host_values(actual), expected, rtol=0, atol=0)
            assert not transfers.unclassified, transfers.unclassified
            counts.append(
                (transfers.blocking_copies, transfers.device_reads, transfers.event_waits)
            )
            for slot, sequence in enumerate(held):
                sequence.append(int(expected[rows.index(slot)].argmax()))
    return counts


def _budget(*layouts: str) -> tuple[int, int, int]:
    """(blocking copies, reads, event waits) the budget allows for these layouts."""
    return (
        0,
        sum(V2_READS[layout][0] for layout in layouts),
        sum(V2_READS[layout][1] for layout in layouts),
    )


def test_v2_runner_reads_no_history_back_for_stateless_requests() -> None:
    """Penalties and n-gram bans read ``all_token_ids`` on the device: nothing comes back."""
    counts = _v2_step_on_device(
        [["repetition_penalty"], ["no_repeat_ngram", "min_new_tokens"]], [[], []]
    )
    assert set(counts[1:]) == {_budget("stateless requests")}, counts


def test_v2_runner_waits_for_committed_tokens_copied_before_the_forward() -> None:
    """A stateful processor advances on the host: its new tokens were copied (pinned,
    non-blocking) in ``apply_staged_writes``; ``apply`` waits on that copy's event and
    reads nothing itself."""
    counts = _v2_step_on_device([["repetition_penalty"], ["stateful_probe"]], [[], []])
    assert set(counts) == {_budget("stateless requests", "host states")}, counts


def test_v2_runner_speculative_rows_read_the_layout_once() -> None:
    """Draft rows: which row belongs to which request is known on the device only, one
    read; stateless groups still gather their histories (drafts included) there."""
    counts = _v2_step_on_device(
        [["repetition_penalty"], ["no_repeat_ngram"], ["logit_bias"]], [[4, 5], [], [6]]
    )
    assert set(counts[1:]) == {_budget("draft rows")}, counts


def test_v2_runner_takes_placeholder_drafts_without_a_device_assert() -> None:
    """vLLM's -1 placeholders (the drafts of a request in prefill) never reach a gather:
    on the emulated device a -1 index asserts as CUDA's kernels do (the engine dies)."""
    counts = _v2_step_on_device(
        [["repetition_penalty"], ["no_repeat_ngram"], ["stateful_probe", "dry"]],
        [[4, 5], [6], [7, 8]],
        placeholders=frozenset({0, 1, 2}),
    )
    assert set(counts) == {_budget("draft rows", "host states")}, counts


def test_v2_interface_fields_the_adapter_uses_are_in_the_installed_vllm() -> None:
    """The V2 buffers need CUDA to construct, so the tests stand in for them; this reads
    the installed vLLM's source and fails when a field or call the adapter relies on is
    renamed or moved."""
    import dataclasses
    import inspect

    from vllm.v1.worker.gpu import buffer_utils, states
    from vllm.v1.worker.gpu.sample import sampler
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler

    context = {field.name for field in dataclasses.fields(V2_INTERFACE.LogitsContext)}
    assert context >= {
        "expanded_idx_mapping",
        "idx_mapping_np",
        "expanded_local_pos",
        "input_ids",
        "pos",
        "seq_lens_upper_bound_np",
    }, context
    request = {field.name for field in dataclasses.fields(V2_INTERFACE.LogitsProcRequestState)}
    assert request >= {"all_token_ids", "prompt_len", "prefill_len", "total_len"}, request
    staged = inspect.getsource(buffer_utils.StagedWriteTensor)
    assert "self.gpu = " in staged, "StagedWriteTensor.gpu (all_token_ids, total_len)"
    uva = inspect.getsource(buffer_utils.UvaBackedTensor)
    assert "self.np = " in uva, "UvaBackedTensor.np (prompt_len, prefill_len on the host)"
    assert "prompt_len = UvaBackedTensor" in inspect.getsource(states.RequestState)
    assert "prefill_len = UvaBackedTensor" in inspect.getsource(states.RequestState)
    # apply_staged_writes runs every step, before the forward, for custom processors too.
    flush = inspect.getsource(sampler.Sampler.apply_staged_writes)
    assert "processor.apply_staged_writes()" in flush, flush
    # The placeholders this adapter guards against: -1 at positive offsets.
    gather = inspect.getsource(rejection_sampler._gather_draft_sampled_kernel)
    assert "is_placeholder = (local_pos > 0)" in gather and "-1" in gather, gather
    # The bound each request's read window grows by: seq_lens_upper_bound + 1.
    assert "seq_lens_cpu_upper_bound" in inspect.getsource(sampler.Sampler.__call__)
