"""anylogits against transformers' own warpers on a CUDA device (issue 34).

Each job through anylogits' transformers hook (``for_transformers``: the pipeline, the
first processor writing into a reused output, the scores left as they are) against the
equivalent ``LogitsProcessorList`` of transformers' own processors, called as
``generate`` calls them, on the same peaked logits (V = 128,256, the Llama 3 vocabulary)
and the same 512-token history, both on the device:

- ``top_k``: ``TopK(50)`` / ``TopKLogitsWarper(50)``;
- ``top_p``: ``TopP(0.9)`` / ``TopPLogitsWarper(0.9)``;
- ``repetition_penalty``: ``RepetitionPenalty(1.3)`` / ``RepetitionPenaltyLogitsProcessor(1.3)``;
- ``chain``: :func:`anylogits.engines.native.chain_processors` (RepetitionPenalty 1.3,
  TopK 50, TopP 0.9, MinP 0.05, Temperature 0.8) / transformers' processors for the same
  job in the same order.
- ``bias_and_bans``: ``LogitBias`` on 16 ids and ``SuppressTokens`` of 64 (one id in
  both, every id below 1,024) / ``SequenceBiasLogitsProcessor`` with the same one-token biases and
  ``SuppressTokensLogitsProcessor`` (the kernels' ``anylogits.kernels.sparse``).

Timed with CUDA events around a run of calls (the GPU's time, including any gap where it
waits for the host to launch the next kernel), after a warm-up; the median over samples,
the two sides' samples interleaved. Without CUDA, asv skips the class (``setup`` raises
``NotImplementedError``). ``python tools/gpu_check.py --bench OUT.json`` runs the same
measurement without asv (:func:`run_benchmark`) and writes it as JSON.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .backends import require_backend
from .common import history, peaked_logits

JOBS = ["top_k", "top_p", "repetition_penalty", "chain", "bias_and_bans"]
# bias_and_bans: ids below 1,024 (the smallest vocabulary the benchmark is checked on),
# one (10) both biased and suppressed.
BIASED = {token: (-1.0) ** token * (1.0 + token % 5) for token in range(10, 1_010, 64)}
SUPPRESSED = [*range(2, 1_010, 16), 10]
BATCHES = [1, 32, 128]
VOCAB = 128_256
HISTORY = 512
# Measurement: warm-up calls, then samples of CALLS calls each (median per call).
WARMUP = 5
SAMPLES = 15
CALLS = 10

NO_CUDA = "no CUDA device (torch.cuda.is_available() is False): the GPU benchmark skips"


def jobs(job: str) -> tuple[list[Any], list[Any]]:
    """``(anylogits processors, transformers processors)`` for ``job``, fresh objects."""
    return our_processors(job), their_processors(job)


def our_processors(job: str) -> list[Any]:
    """anylogits' processors for ``job``, fresh objects (transformers not needed)."""
    from anylogits import LogitBias, RepetitionPenalty, SuppressTokens, TopK, TopP
    from anylogits.engines.native import chain_processors

    made = {
        "top_k": lambda: [TopK(50)],
        "top_p": lambda: [TopP(0.9)],
        "repetition_penalty": lambda: [RepetitionPenalty(1.3)],
        "chain": chain_processors,
        "bias_and_bans": lambda: [LogitBias(BIASED), SuppressTokens(SUPPRESSED)],
    }
    if job not in made:
        raise ValueError(f"unknown job {job!r}: one of {JOBS}")
    return made[job]()


def their_processors(job: str) -> list[Any]:
    """transformers' processors for ``job``, in the order of anylogits', fresh objects."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        SequenceBiasLogitsProcessor,
        SuppressTokensLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from anylogits.engines.native import CHAIN

    if job == "top_k":
        return [TopKLogitsWarper(50)]
    if job == "top_p":
        return [TopPLogitsWarper(0.9)]
    if job == "repetition_penalty":
        return [RepetitionPenaltyLogitsProcessor(1.3)]
    if job == "chain":
        theirs = {
            "repetition_penalty": RepetitionPenaltyLogitsProcessor(CHAIN["repetition_penalty"]),
            "top_k": TopKLogitsWarper(CHAIN["top_k"]),
            "top_p": TopPLogitsWarper(CHAIN["top_p"]),
            "min_p": MinPLogitsWarper(CHAIN["min_p"]),
            "temperature": TemperatureLogitsWarper(CHAIN["temperature"]),
        }
        # chain_processors' order: the penalty, the truncations, the temperature last.
        order = ("repetition_penalty", "top_k", "top_p", "min_p", "temperature")
        return [theirs[name] for name in order]
    if job == "bias_and_bans":
        sequence_bias = {(token,): bias for token, bias in BIASED.items()}
        return [
            SequenceBiasLogitsProcessor(sequence_bias),
            SuppressTokensLogitsProcessor(SUPPRESSED),
        ]
    raise ValueError(f"unknown job {job!r}: one of {JOBS}")


Call = Callable[[], torch.Tensor]


def build(
    job: str, batch: int, device: torch.device, vocab: int = VOCAB
) -> tuple[Call, Call, Call | None]:
    """``(ours, theirs, kernels)``: calls of both sides on the same logits and history on
    ``device`` (each returns the processed scores and leaves the inputs as they are), and
    ours with the fused kernels (``None`` where they cannot run: no CUDA or no Triton;
    time it within :func:`anylogits.kernels.kernels_forced`)."""
    import transformers

    from anylogits import for_transformers
    from anylogits.kernels import kernels_enabled, kernels_forced

    ours_processors, their_processors = jobs(job)
    hook = for_transformers(*ours_processors)
    fused = for_transformers(*our_processors(job))
    theirs = transformers.LogitsProcessorList(their_processors)
    logits = peaked_logits(batch, vocab).to(device)
    ids = history(batch, HISTORY, vocab).to(device)
    with kernels_forced(True):
        kernels = (lambda: fused(ids, logits)) if kernels_enabled(device) else None
    # Neither side edits the logits in place (transformers' processors return new tensors,
    # the hook writes into its own output): every call sees the same input.
    return (lambda: hook(ids, logits)), (lambda: theirs(ids, logits)), kernels


class Timer:
    """Milliseconds of a run of calls on ``device``: CUDA events there, the host's
    clock elsewhere (a check of this code on the CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, call: Call, calls: int) -> float:
        """Milliseconds per call over ``calls`` calls."""
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                call()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / calls
        began = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - began) * 1e3 / calls

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def compare(ours: torch.Tensor, theirs: torch.Tensor) -> dict[str, Any]:
    """How the two sides' outputs agree: bit for bit, and in which tokens they keep."""
    ours, theirs = ours.float(), theirs.float()
    kept_ours, kept_theirs = torch.isfinite(ours), torch.isfinite(theirs)
    both = kept_ours & kept_theirs
    difference = (ours - theirs).abs()[both]
    return {
        "identical": bool(torch.equal(ours, theirs)),
        "kept_differ": int((kept_ours != kept_theirs).sum()),
        "max_abs_difference": float(difference.max()) if difference.numel() else 0.0,
    }


def measure(
    job: str,
    batch: int,
    device: torch.device,
    *,
    vocab: int = VOCAB,
    warmup: int = WARMUP,
    samples: int = SAMPLES,
    calls: int = CALLS,
) -> dict[str, Any]:
    """One row: median milliseconds per call of each side and their ratio, measured in
    the same run, and how their outputs agree."""
    from anylogits.kernels import kernels_forced

    ours, theirs, kernels = build(job, batch, device, vocab)
    timer = Timer(device)
    agreement = compare(ours(), theirs())
    fused: dict[str, Any] = {"kernels_ms": None, "kernels_ratio": None}
    if kernels is not None:
        with kernels_forced(True):
            fused["kernels_kept_differ"] = compare(kernels(), theirs())["kept_differ"]
    for _ in range(warmup):
        ours()
        theirs()
        if kernels is not None:
            with kernels_forced(True):
                kernels()
    timer.synchronize()
    ours_ms: list[float] = []
    theirs_ms: list[float] = []
    kernels_ms: list[float] = []
    for _ in range(samples):  # interleaved: drift hits every side alike
        ours_ms.append(timer(ours, calls))
        theirs_ms.append(timer(theirs, calls))
        if kernels is not None:
            with kernels_forced(True):
                kernels_ms.append(timer(kernels, calls))
    ours_median, theirs_median = statistics.median(ours_ms), statistics.median(theirs_ms)
    if kernels_ms:
        fused["kernels_ms"] = statistics.median(kernels_ms)
        fused["kernels_ratio"] = fused["kernels_ms"] / theirs_median
    return {
        "job": job,
        "batch": batch,
        "anylogits_ms": ours_median,
        "transformers_ms": theirs_median,
        "ratio": ours_median / theirs_median,
        **agreement,
        **fused,
    }


def run_benchmark(
    device: str | torch.device = "cuda",
    *,
    vocab: int = VOCAB,
    batches: Sequence[int] = BATCHES,
    job_names: Sequence[str] = JOBS,
    warmup: int = WARMUP,
    samples: int = SAMPLES,
    calls: int = CALLS,
) -> dict[str, Any]:
    """Every job at every batch size on ``device``, as plain JSON values."""
    import transformers

    import anylogits

    device = torch.device(device)
    rows = [
        measure(job, batch, device, vocab=vocab, warmup=warmup, samples=samples, calls=calls)
        for job in job_names
        for batch in batches
    ]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "benchmark": "anylogits (for_transformers) / transformers' own processors, per call",
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "anylogits": anylogits.__version__,
        "vocab": vocab,
        "history": HISTORY,
        "timing": {
            "warmup_calls": warmup,
            "samples": samples,
            "calls_per_sample": calls,
            "statistic": "median ms per call"
            + (", CUDA events" if device.type == "cuda" else ", host clock"),
        },
        "rows": rows,
    }


def table(result: dict[str, Any]) -> str:
    """The rows as a text table."""
    lines = [
        f"{result['benchmark']}: {result['device']}, V={result['vocab']:,}, history "
        f"{result['history']} (torch {result['torch']}, transformers {result['transformers']})",
        f"{'job':<20}{'B':>5}{'anylogits ms':>14}{'transformers ms':>17}{'ratio':>8}  output",
    ]
    for row in result["rows"]:
        output = "identical"
        if not row["identical"]:
            differ, largest = row["kept_differ"], row["max_abs_difference"]
            output = f"{differ} kept differ, max |diff| {largest:.2g}"
        if row["kernels_ms"] is not None:
            output += (
                f"; kernels {row['kernels_ms']:.3f} ms ({row['kernels_ratio']:.2f}x, "
                f"{row['kernels_kept_differ']} kept differ)"
            )
        lines.append(
            f"{row['job']:<20}{row['batch']:>5}{row['anylogits_ms']:>14.3f}"
            f"{row['transformers_ms']:>17.3f}{row['ratio']:>7.2f}x  {output}"
        )
    return "\n".join(lines)


class GpuVsTransformers:
    """ours / transformers per call on CUDA, V = 128,256 (< 1: ours is faster)."""

    params = (JOBS, BATCHES)
    param_names = ["job", "batch"]
    timeout = 600

    def setup(self, job: str, batch: int) -> None:
        if not torch.cuda.is_available():
            raise NotImplementedError(NO_CUDA)
        require_backend("transformers")
        self.device = torch.device("cuda")
        self.ours, self.theirs, _ = build(job, batch, self.device)

    def time_ours(self, job: str, batch: int) -> None:
        self.ours()
        torch.cuda.synchronize()

    def time_transformers(self, job: str, batch: int) -> None:
        self.theirs()
        torch.cuda.synchronize()

    def track_ours_over_transformers(self, job: str, batch: int) -> float:
        return float(measure(job, batch, self.device)["ratio"])

    track_ours_over_transformers.unit = "ratio"

    def track_kernels_over_transformers(self, job: str, batch: int) -> float:
        ratio = measure(job, batch, self.device)["kernels_ratio"]
        if ratio is None:
            raise NotImplementedError("the fused kernels need Triton")
        return float(ratio)

    track_kernels_over_transformers.unit = "ratio"
