"""Kernel launches per decode step on an accelerator, counted on the emulated device.

On a GPU every operation is a kernel launch with its Python around it (~5-10 us), and at
the batch sizes of decoding launches, not bytes, set what a processor costs (one read and
write pass over 128,256 float32 logits takes 0.3 us at B = 1 on an H100). So the suite
pins how many each catalogue processor launches along transformers' path (``input_ids``
on the device, the first processor writing into the hook's output, the scores left as
they are), at B = 1 and B = 32, V = 128,256, the Llama 3 vocabulary: a count that grows
fails, one that shrinks asks for this table to change. Beside them, transformers' own
processors for the jobs it has, counted the same way.

Counted: every ATen operation on a device tensor that runs a kernel
(:attr:`~test_support.emulated_device.Transfers.launches`; views, allocations and
metadata do not), in the third call of a fixed draw (two warm-up calls fill the caches
of device constants; XTC's coin and CiteFromPrompt's branch depend on the draw, so each
case's count is of this draw). To print the table: ``python -m test_support.op_counts``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from anylogits import LogitsProcessor, Pipeline, from_spec
from test_support import asv_benchmark
from test_support.emulated_device import NO_LAUNCH, EmulatedDevice, on_device
from test_support.engine_rows import CASES, STRUCTURED, VOCAB

LOGITS_WIDTH = 128_256
HISTORY = 512
BATCHES = (1, 32)

# The jobs transformers has processors for: asv_bench/benchmarks/bench_gpu.py's, which
# times the same jobs on a GPU.
_BENCH_GPU = asv_benchmark("bench_gpu")
JOBS: dict[str, Callable[[], list[LogitsProcessor]]] = {
    job: functools.partial(_BENCH_GPU.our_processors, job) for job in _BENCH_GPU.JOBS
}

# Launches per call at (B = 1, B = 32), by catalogue case (test_support.engine_rows.CASES).
LAUNCHES: dict[str, tuple[int, int]] = {
    "bad_words": (11, 11),
    "bad_words (text)": (10, 10),
    "choice": (8, 12),
    "cite_from_prompt": (18, 31),
    "dry": (276, 276),
    "dry (multi-token breakers)": (358, 358),
    "dry (text)": (286, 286),
    "epsilon_cutoff": (7, 7),
    "eta_cutoff": (19, 19),
    "exponential_decay_length": (25, 25),
    "force_last_phrase": (17, 17),
    "force_sequence": (13, 13),
    "force_sequence (text)": (13, 13),
    "force_sequence (zoo)": (20, 20),
    "frequency_penalty": (30, 30),
    "gen_length": (16, 16),
    "grammar": (8, 12),
    "json_schema": (8, 12),
    "logit_bias": (2, 2),
    "min_new_tokens": (11, 11),
    "min_p": (5, 5),
    "multiple_choice": (8, 8),
    "multiple_choice (text)": (8, 8),
    "no_repeat_ngram": (17, 17),
    "presence_penalty": (22, 22),
    "regex": (8, 12),
    "repetition_penalty": (8, 8),
    "sequence_bias": (14, 14),
    "stateful_probe": (8, 8),
    "stop_strings": (5, 5),
    "suppress_tokens": (2, 2),
    "temperature": (1, 1),
    "top_h": (21, 21),
    "top_k": (3, 3),
    "top_n_sigma": (19, 19),
    "top_p": (8, 8),
    "trigger_phrase": (5, 5),
    "trigger_phrase (replacing)": (17, 17),
    "trigger_phrase (text)": (11, 11),
    "typical_p": (25, 25),
    "watermark": (15, 15),
    "watermark (lefthash)": (8, 8),
    "xtc": (14, 16),
}

# transformers' own processors for each job (its version in the transformers session),
# counted the same way; no job of ours may launch more.
TRANSFORMERS_LAUNCHES: dict[str, int] = {
    "top_k": 3,
    "top_p": 8,
    "repetition_penalty": 8,
    "chain": 27,
    "bias_and_bans": 7,
}


def transformers_jobs() -> dict[str, list[Any]]:
    """transformers' processors for each job, in the order of anylogits' (needs
    transformers)."""
    return {job: _BENCH_GPU.their_processors(job) for job in JOBS}


def count_launches(
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], batch: int
) -> tuple[int, dict[str, int]]:
    """Launches of the third call of ``step(input_ids, scores)`` on the emulated device
    (``(B, 512)`` ids that grow by a column each call, ``(B, 128,256)`` float32 scores),
    and the operations by name."""
    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, VOCAB.size - 1, (batch, HISTORY), generator=generator)
    with EmulatedDevice() as device:
        for call in range(3):
            scores = torch.randn(batch, LOGITS_WIDTH, generator=generator) * 3
            if call < 2:
                step(on_device(ids), on_device(scores))
            else:
                with device.counting() as transfers:
                    step(on_device(ids), on_device(scores))
            ids = torch.cat([ids, scores.argmax(-1, keepdim=True) % VOCAB.size], 1)
    ops = {name: n for name, n in sorted(transfers.ops.items()) if name not in NO_LAUNCH}
    return transfers.launches, ops


def hook_step(processors: Sequence[LogitsProcessor]) -> Callable[..., torch.Tensor]:
    """A call of anylogits' transformers hook: the pipeline, its first processor writing
    into an output buffer (the adapter's ReusedOutputs), the scores left as they are."""
    pipeline = Pipeline(processors, VOCAB)
    outputs: list[torch.Tensor] = []

    def step(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not outputs or outputs[0].shape != scores.shape:
            outputs[:] = [torch.empty_like(scores)]
        return pipeline(scores, ids, out=outputs[0])

    return step


def transformers_step(processors: Sequence[Any]) -> Callable[..., torch.Tensor]:
    """A call of transformers' ``LogitsProcessorList`` of ``processors``."""
    from transformers import LogitsProcessorList

    listed = LogitsProcessorList(processors)
    return lambda ids, scores: listed(ids, scores)


def case_launches(name: str) -> tuple[int, int]:
    """Launches of catalogue case ``name`` at each of :data:`BATCHES`."""
    return tuple(  # type: ignore[return-value]
        count_launches(hook_step([from_spec(CASES[name])]), batch)[0] for batch in BATCHES
    )


def runnable_cases() -> list[str]:
    """The cases this machine can build (the structured ones need llguidance)."""
    import importlib.util

    structured = importlib.util.find_spec("llguidance") is not None
    return [n for n in sorted(CASES) if structured or CASES[n]["type"] not in STRUCTURED]


def main() -> None:
    print(f"{'case':36} {'B=1':>5} {'B=32':>5}")
    for name in runnable_cases():
        one, many = case_launches(name)
        print(f"{name:36} {one:5} {many:5}")
    print()
    for job, processors in JOBS.items():
        ours = [count_launches(hook_step(processors()), b)[0] for b in BATCHES]
        print(f"job {job:32} {ours[0]:5} {ours[1]:5}  transformers {TRANSFORMERS_LAUNCHES[job]}")


if __name__ == "__main__":
    sys.exit(main())
