"""The Triton kernels against the torch processors they replace, on the CPU through
Triton's interpreter (issue 43).

``nox -s kernels`` runs this file with ``TRITON_INTERPRET=1`` (Triton installed); without
both it skips. The reference is the catalogue's processors on their accelerator branch
(host reads forbidden), kernels off. A token within float rounding of a top-p or min-p
boundary may be kept on one side only (the kernel sums masses in its own order): at most
one a row, counted; every other token, and every kept value, must be identical.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any
from unittest import mock

import pytest
import torch

from anylogits import (
    FrequencyPenalty,
    LogitBias,
    LogitsProcessor,
    MinP,
    Pipeline,
    PresencePenalty,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
    from_spec,
)
from anylogits.core.launch_plan import (
    FusedBiasAndBans,
    FusedRepetitionPenalty,
    FusedTruncation,
    launch_plan,
)
from anylogits.core.sync import forbid_host_sync
from anylogits.engines.native import chain_processors, chain_processors_in_generate_order
from anylogits.kernels import ENVIRONMENT_SWITCH, interpreting, kernels_enabled, triton_installed
from test_support.engine_rows import CASES, VOCAB, WIDTH
from test_support.kept_sets import assert_same_logits

# Compiled on a CUDA device (nox -s gpu), else interpreted on CPU tensors (nox -s kernels).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = [
    pytest.mark.skipif(
        not (triton_installed() and (DEVICE.type == "cuda" or interpreting())),
        reason="needs Triton and CUDA or TRITON_INTERPRET=1: nox -s kernels runs these",
    ),
    # The interpreter's numpy arithmetic warns on -inf - -inf (a row of -inf only).
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

# (top_k, top_p, min_p, temperature) per row, cycled over the batch: every parameter off
# in some row, tiny and large k, a nucleus of one token, a temperature above and below 1.
PARAMETERS = [
    (50, 0.9, 0.05, 0.8),
    (0, 0.5, 0.0, 1.0),
    (5, 1.0, 0.2, 1.5),
    (1, 0.95, 0.0, 0.7),
    (10_000, 0.05, 0.01, 1.0),
    (3, 0.99, 0.1, 2.0),
    (0, 1.0, 0.0, 0.5),
]
# The processors' order in a pipeline: top-k / min-p before or after top-p, the
# temperature first (generate's order) or last (the benchmarks' chain).
ORDERS = {
    "chain": ("top_k", "top_p", "min_p", "temperature"),
    "generate": ("temperature", "top_k", "top_p", "min_p"),
    "min-p first": ("min_p", "top_p", "top_k", "temperature"),
    "top-p first": ("temperature", "top_p", "min_p", "top_k"),
}


def assert_kernel_logits(
    actual: torch.Tensor, expected: torch.Tensor, label: str, *, boundary: bool = False
) -> int:
    """:func:`assert_same_logits` on the host. On CUDA, torch divides by a scalar as a
    multiplication by its reciprocal where the kernel divides: one rounding step of the
    dtype apart; the interpreter and the CPU agree bit for bit."""
    rtol = torch.finfo(actual.dtype).eps if DEVICE.type == "cuda" else 0.0
    return assert_same_logits(
        actual.cpu().float(), expected.cpu().float(), label, boundary=boundary, rtol=rtol
    )


@pytest.fixture(autouse=True)
def _kernels_on() -> Iterator[None]:
    with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: "1"}):
        yield


def shaped_logits(rows: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows, and the rows a truncation can trip on: ties at the top, one finite
    token, all -inf, a tail 200 below the head."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, width, generator=generator) * 3
    shapes = [
        lambda row: row[:8].fill_(float(row.max()) + 1.0),
        lambda row: row.fill_(float("-inf")).index_fill_(0, torch.tensor([width // 2]), 0.5),
        lambda row: row.fill_(float("-inf")),
        lambda row: row[width // 3 :].sub_(200.0),
    ]
    for row, shape in zip(logits[1:], shapes, strict=False):
        shape(row)
    return logits.to(DEVICE, dtype)


def processors_of(parameters: tuple[int, float, float, float], order: Sequence[str]) -> list[Any]:
    top_k, top_p, min_p, temperature = parameters
    made = {
        "top_k": TopK(top_k) if top_k else None,
        "top_p": TopP(top_p),
        "min_p": MinP(min_p),
        "temperature": Temperature(temperature),
    }
    return [made[kind] for kind in order if made[kind] is not None]


def kernel_rows(logits: torch.Tensor, order: Sequence[str]) -> torch.Tensor:
    """Every row through one launch, with its own parameters."""
    from anylogits.kernels.truncation import truncate

    rows = [PARAMETERS[row % len(PARAMETERS)] for row in range(logits.shape[0])]
    columns = list(zip(*rows, strict=True))
    return truncate(
        logits,
        top_k=torch.tensor(columns[0], dtype=torch.int64, device=DEVICE),
        top_p=torch.tensor(columns[1], dtype=torch.float32, device=DEVICE),
        min_p=torch.tensor(columns[2], dtype=torch.float32, device=DEVICE),
        temperature=torch.tensor(columns[3], dtype=torch.float32, device=DEVICE),
        k_before_p=order.index("top_k") < order.index("top_p"),
        min_p_before_p=order.index("min_p") < order.index("top_p"),
        temperature_first=order[0] == "temperature",
    )


def reference_rows(logits: torch.Tensor, order: Sequence[str]) -> torch.Tensor:
    """Each row through the torch processors with its parameters (kernels off)."""
    results = []
    with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: "0"}), forbid_host_sync():
        for row in range(logits.shape[0]):
            processors = processors_of(PARAMETERS[row % len(PARAMETERS)], order)
            results.append(Pipeline(processors)(logits[row : row + 1].clone()))
    return torch.cat(results)


def assert_kernel_matches(logits: torch.Tensor, order: Sequence[str], label: str) -> int:
    actual, expected = kernel_rows(logits, order), reference_rows(logits, order)
    assert actual.dtype == expected.dtype
    flips = assert_kernel_logits(actual, expected, label, boundary=True)
    assert flips <= max(1, logits.shape[0] // 8), f"{label}: {flips} boundary flips"
    return flips


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_truncation_kernel_keeps_the_processors_tokens(rows: int, order: str) -> None:
    logits = shaped_logits(rows, 3001, torch.float32, seed=rows)
    assert_kernel_matches(logits, ORDERS[order], f"B={rows}, {order}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_truncation_kernel_on_half_logits(dtype: torch.dtype) -> None:
    logits = shaped_logits(7, 3001, dtype, seed=3)
    for order in ("chain", "generate"):
        assert_kernel_matches(logits, ORDERS[order], f"{dtype}, {order}")


def test_truncation_kernel_across_blocks_and_a_full_vocabulary() -> None:
    """Rows longer than a block, the last block short (V = 3,001 in blocks of 1,024), and
    one row of Llama 3's 128,256."""
    from anylogits.kernels import truncation

    with mock.patch.object(truncation, "BLOCK", 1024):
        assert_kernel_matches(shaped_logits(7, 3001, torch.float32, 5), ORDERS["chain"], "blocks")
    assert_kernel_matches(shaped_logits(1, 128_256, torch.float32, 6), ORDERS["chain"], "128k")


def test_the_chain_tail_is_one_launch_in_a_pipeline() -> None:
    """The benchmarks' chain on a device with kernels on: the penalty as it is, then
    top-k, top-p, min-p and the temperature in one launch; the same tokens as with
    kernels off, in the transformers hook's form (out=)."""
    from anylogits.kernels import truncation

    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 3001, generator=generator) * 3).to(DEVICE)
    ids = torch.randint(0, 3000, (5, 20), generator=generator).to(DEVICE)
    for make in (chain_processors, chain_processors_in_generate_order):
        pipeline = Pipeline(make())
        assert [type(step) for step in pipeline._kernel_plan or ()] == [
            FusedRepetitionPenalty,
            FusedTruncation,
        ]
        with mock.patch.object(truncation, "truncate", wraps=truncation.truncate) as launches:
            actual = pipeline(logits.clone(), ids, out=torch.empty_like(logits))
        with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: "0"}), forbid_host_sync():
            expected = Pipeline(make())(logits.clone(), ids)
        assert launches.call_count == 1
        assert_kernel_logits(actual, expected, make.__name__, boundary=True)


def test_plans_cover_only_what_the_kernel_applies() -> None:
    def kinds(processors: list[LogitsProcessor]) -> list[Any]:
        plan = launch_plan(processors)
        if plan is None:
            return []
        return [
            [type(p).spec_name for p in step.processors]
            if isinstance(step, FusedTruncation)
            else type(step).spec_name
            for step in plan
        ]

    assert kinds([Temperature(0.7)]) == []  # no truncation: nothing to fuse
    assert kinds([TopP(0.9, min_tokens_to_keep=2)]) == []  # min_tokens_to_keep: torch
    assert kinds([TopK(5), Temperature(0.5), TopP(0.9)]) == [["top_k", "temperature"], ["top_p"]]
    assert kinds([TopK(5), TopK(3)]) == [["top_k"], ["top_k"]]
    assert kinds([Temperature(0.5), TopK(5), MinP(0.1), Temperature(2.0)]) == [
        ["temperature", "top_k", "min_p"],
        "temperature",
    ]
    bias, bans = LogitBias({1: 2.0}), SuppressTokens([2])
    plan = launch_plan([bias, bans, LogitBias({3: 1.0}), TopK(5)]) or ()
    assert [type(step) for step in plan] == [FusedBiasAndBans, FusedBiasAndBans, FusedTruncation]
    assert [len(step.processors) for step in plan] == [2, 1, 1]


def test_kernels_are_off_unless_asked_for() -> None:
    assert kernels_enabled(DEVICE)  # the fixture's ANYLOGITS_KERNELS=1
    for value in ("0", ""):
        with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: value}):
            assert not kernels_enabled(DEVICE)
    with mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
        assert not kernels_enabled(torch.device("cpu"))  # CPU tensors: the interpreter only


@pytest.mark.parametrize(
    "name", [n for n in sorted(CASES) if CASES[n]["type"] in ("top_k", "top_p", "min_p")]
)
def test_catalogue_cases_through_the_kernel(name: str) -> None:
    """Each catalogue truncation alone, as a pipeline plans it (min_tokens_to_keep > 1
    stays on torch), on the catalogue's rows."""
    logits = shaped_logits(7, WIDTH, torch.float32, seed=11)
    pipeline = Pipeline([from_spec(CASES[name])], VOCAB)
    actual = pipeline(logits.clone())
    with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: "0"}), forbid_host_sync():
        expected = Pipeline([from_spec(CASES[name])], VOCAB)(logits.clone())
    assert_kernel_logits(actual, expected, name, boundary=True)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="a synchronizing call exists on CUDA only")
def test_the_planned_chain_does_not_synchronize() -> None:
    """The chain with its tail in one launch, a decode step after warm-up, under
    ``torch.cuda.set_sync_debug_mode("error")``: the kernel's parameters are device
    constants, the launch reads nothing back."""
    pipeline = Pipeline(chain_processors())
    logits = shaped_logits(4, 3001, torch.float32, seed=2)
    ids = torch.randint(0, 3000, (4, 20), device=DEVICE)
    out = torch.empty_like(logits)
    for _ in range(2):
        pipeline(logits, ids, out=out)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pipeline(logits, ids, out=out)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_repetition_penalty_kernel_penalizes_as_the_processor(
    rows: int, dtype: torch.dtype
) -> None:
    """Every row's history, repeats and ids past the logits included (a wider embedding),
    with a window too: the processor's logits exactly."""
    from anylogits.kernels import penalties

    generator = torch.Generator().manual_seed(rows)
    logits = shaped_logits(rows, 3001, dtype, seed=rows)
    ids = torch.randint(0, 3010, (rows, 700), generator=generator)
    ids[:, 600:] = ids[:, :100]  # repeats, across the kernel's blocks of ids
    ids = ids.to(DEVICE)
    for context_size in (None, 64):
        processor = RepetitionPenalty(1.3, context_size=context_size)
        with mock.patch.object(penalties, "BLOCK", 1024):
            actual = Pipeline([processor])(logits.clone(), ids, out=torch.empty_like(logits))
        with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: "0"}), forbid_host_sync():
            expected = Pipeline([RepetitionPenalty(1.3, context_size)])(logits.clone(), ids)
        assert not torch.equal(expected.cpu(), logits.cpu())  # the penalty did something
        assert_kernel_logits(actual, expected, f"B={rows}, window {context_size}")


def test_the_planned_chain_is_two_launches() -> None:
    """The benchmarks' chain on full device rows: the penalty, then the truncations and
    the temperature, one launch each."""
    from anylogits.kernels import penalties, truncation

    logits = shaped_logits(5, 3001, torch.float32, seed=9)
    ids = torch.randint(0, 3000, (5, 40), generator=torch.Generator().manual_seed(9))
    ids = ids.to(DEVICE)
    pipeline = Pipeline(chain_processors())
    with (
        mock.patch.object(penalties, "repetition_penalty", wraps=penalties.repetition_penalty) as a,
        mock.patch.object(truncation, "truncate", wraps=truncation.truncate) as b,
    ):
        actual = pipeline(logits.clone(), ids, out=torch.empty_like(logits))
    assert (a.call_count, b.call_count) == (1, 1)
    with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: "0"}), forbid_host_sync():
        expected = Pipeline(chain_processors())(logits.clone(), ids)
    assert_kernel_logits(actual, expected, "chain", boundary=True)


def through_stacked_requests(
    specs_per_slot: list[list[dict[str, Any]]], width: int, module: Any, kernel: str
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """vLLM's grouped requests, a slot each, on shaped rows: ``(logits with kernels on,
    with kernels off, the calls of module.kernel)``; the processors changed the rows."""
    from anylogits.core.persistent_batch import PersistentBatch

    def batch() -> PersistentBatch:
        made = PersistentBatch()
        for slot, specs in enumerate(specs_per_slot):
            made.put(slot, specs, prompt_ids=[1, 2, 3])
        return made

    logits = shaped_logits(len(specs_per_slot), width, torch.float32, seed=width)
    with mock.patch.object(module, kernel, wraps=getattr(module, kernel)) as launches:
        actual = batch().process(logits.clone())
    with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: "0"}), forbid_host_sync():
        expected = batch().process(logits.clone())
    assert not torch.equal(expected.cpu(), logits.cpu())
    return actual, expected, launches


def test_stacked_requests_run_in_one_launch() -> None:
    """vLLM's grouped requests: rows of the same kinds with different parameters are
    stacked into one pipeline (top-k, min-p and temperature a value per row, top-p
    shared), which the plan runs as one launch with per-row parameters."""
    from anylogits.kernels import truncation

    parameters = [(5, 0.1, 0.7), (50, 0.0, 1.0), (1, 0.3, 1.5), (200, 0.05, 0.9)]

    specs_per_slot = [
        [
            {"type": "top_k", "top_k": top_k},
            {"type": "top_p", "top_p": 0.9},
            {"type": "min_p", "min_p": min_p},
            {"type": "temperature", "temperature": temperature},
        ]
        for top_k, min_p, temperature in parameters
    ]
    actual, expected, launches = through_stacked_requests(
        specs_per_slot, 3001, truncation, "truncate"
    )
    assert launches.call_count == 1
    assert launches.call_args.kwargs["top_k"].numel() == len(parameters)
    assert_kernel_logits(actual, expected, "stacked", boundary=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_penalties_kernel_penalizes_as_the_processors(dtype: torch.dtype) -> None:
    """Presence then frequency (and the other order) over steps of a generation: only
    the generated tokens count, repeats counted, ids past the logits skipped; the
    processors' logits exactly, in one launch a step."""
    from anylogits.kernels import penalties

    generator = torch.Generator().manual_seed(8)
    prompts = torch.randint(0, 3010, (7, 30), generator=generator)
    for kinds in (("presence", "frequency"), ("frequency", "presence")):
        made = {"presence": PresencePenalty(0.4), "frequency": FrequencyPenalty(0.3)}
        pipeline = Pipeline([made[kind] for kind in kinds])
        with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: "0"}):
            again = {"presence": PresencePenalty(0.4), "frequency": FrequencyPenalty(0.3)}
            reference = Pipeline([again[kind] for kind in kinds])
        ids = prompts
        for step in range(4):
            logits = shaped_logits(7, 3001, dtype, seed=step)
            with mock.patch.object(
                penalties, "output_penalties", wraps=penalties.output_penalties
            ) as launches:
                actual = pipeline(logits.clone(), ids.to(DEVICE), out=torch.empty_like(logits))
            with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: "0"}), forbid_host_sync():
                expected = reference(logits.clone(), ids.to(DEVICE))
            assert launches.call_count == 1
            if step:
                assert not torch.equal(expected.cpu(), logits.cpu())  # generated tokens count
            assert_kernel_logits(actual, expected, f"{kinds}, step {step}")
            # The next token: a repeat of the last generated one in some rows.
            following = torch.randint(0, 3010, (7, 1), generator=generator)
            following[::2] = ids[::2, -1:]
            ids = torch.cat([ids, following], dim=1)


def bias_and_bans_processors(width: int, bans_first: bool) -> list[LogitsProcessor]:
    """A bias and a ban list at the edges of the kernel's blocks and the row, one id in
    both, one banned twice."""
    edges = sorted({0, 1, 4095, 4096, 4097, width // 2, width - 2, width - 1} & set(range(width)))
    bias = LogitBias({token: (-1.0) ** token * (0.5 + token % 7) for token in edges})
    bans = SuppressTokens([3, width // 2, 4096 % width, 3, width - 1])
    return [bans, bias] if bans_first else [bias, bans]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [3001, 128_256])
def test_bias_and_bans_kernel_as_the_processors(dtype: torch.dtype, width: int) -> None:
    """A logit bias and suppressed tokens, in both orders and in place or into the
    hook's output: the processors' logits exactly, in one launch."""
    from anylogits.kernels import sparse

    logits = shaped_logits(7, width, dtype, seed=width)
    for bans_first in (False, True):
        pipeline = Pipeline(bias_and_bans_processors(width, bans_first))
        assert [type(step) for step in pipeline._kernel_plan or ()] == [FusedBiasAndBans]
        with mock.patch.dict(os.environ, {ENVIRONMENT_SWITCH: "0"}), forbid_host_sync():
            expected = Pipeline(bias_and_bans_processors(width, bans_first))(logits.clone())
        assert not torch.equal(expected.cpu(), logits.cpu())
        for out in (None, torch.empty_like(logits)):
            with mock.patch.object(sparse, "bias_and_bans", wraps=sparse.bias_and_bans) as launches:
                actual = pipeline(logits.clone(), out=out)
            assert launches.call_count == 1
            assert_kernel_logits(actual, expected, f"bans first {bans_first}, out {out is None}")


def test_stacked_bias_and_bans_run_in_one_launch() -> None:
    """vLLM's grouped requests: each row its own bias and banned ids (one row without
    either), stacked into one pipeline, one launch."""
    from anylogits.kernels import sparse

    rows = [
        ({"5": 3.0, "4096": -2.5}, [7, 4096]),
        ({"4999": 1.25}, []),
        ({}, [0, 1, 2]),
        ({"0": -0.75, "1500": 4.0, "3000": 2.0}, [1500]),
    ]

    specs_per_slot = [
        [
            {"type": "logit_bias", "bias": bias},
            {"type": "suppress_tokens", "token_ids": banned},
        ]
        for bias, banned in rows
    ]
    actual, expected, launches = through_stacked_requests(
        specs_per_slot, 5000, sparse, "bias_and_bans"
    )
    assert launches.call_count == 1
    assert launches.call_args.kwargs["bias"].offsets.numel() == len(rows) + 1
    assert_kernel_logits(actual, expected, "stacked bias and bans")


@pytest.mark.skipif(DEVICE.type == "cuda", reason="on CUDA every test above compiles them")
def test_every_kernel_compiles_for_cuda_without_a_gpu() -> None:
    """The interpreter runs a kernel's Python; the compiler checks more (annotations,
    types, what the backend supports). Each kernel variant is built for sm_90, PTX and
    cubin, in a child process without the interpreter."""
    import subprocess
    import sys

    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environment["TRITON_DEFAULT_FP_FUSION"] = "0"
    done = subprocess.run(
        [sys.executable, "-m", "test_support.kernel_compile"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("cubin") == 10, done.stdout
