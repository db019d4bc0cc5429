"""The same job through each engine's own parameters: what ``anylogits demo`` and the
engine benchmarks (``asv_bench/benchmarks/bench_engine_*.py``) compare anylogits with.

A *job* is a dict of ``model.generate`` arguments as transformers names them
(``repetition_penalty``, ``no_repeat_ngram_size``, ``suppress_tokens``, ``sequence_bias``,
``min_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``min_p``): transformers is
the reference every engine is compared with, so a job runs there as it is written. Each
``<engine>_parameters(job, sample)`` translates it into that engine's own settings, with
the engine's own sampling switched off where the job does not set it (greedy, or
sampling at temperature 1 without truncation when ``sample``), or raises
:class:`NoNative` naming the argument the engine has no parameter for. ``sample`` with an
empty job is what anylogits processors run under: the engine then only draws from the
logits they leave.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Job = dict[str, Any]

SAMPLING = ("temperature", "top_k", "top_p", "min_p")

# Issue 17's end-to-end sampling job: the same job through anylogits processors and
# through each engine's own parameters (written in transformers' order of application).
CHAIN: Job = {
    "repetition_penalty": 1.3,
    "temperature": 0.8,
    "top_k": 50,
    "top_p": 0.9,
    "min_p": 0.05,
}

# Issue 17's second job: the chain's repetition penalty alone, no truncation.
REPETITION: Job = {"repetition_penalty": CHAIN["repetition_penalty"]}

# What an engine that lacks suppress_tokens bans tokens with: a logit bias of -100, the
# OpenAI API's "ban" (vLLM clamps its logit_bias to [-100, 100]).
BAN = -100.0


def _chain(order: tuple[str, ...]) -> list[Any]:
    from anylogits import MinP, RepetitionPenalty, Temperature, TopK, TopP

    classes = {
        "repetition_penalty": RepetitionPenalty,
        "temperature": Temperature,
        "top_k": TopK,
        "top_p": TopP,
        "min_p": MinP,
    }
    return [classes[name](CHAIN[name]) for name in order]


def chain_processors() -> list[Any]:
    """The anylogits processors for :data:`CHAIN`, fresh objects each call, Temperature
    last: after the truncations it scales only their few survivors (the benchmarks'
    order; engines apply their own parameters in their own order)."""
    return _chain(("repetition_penalty", "top_k", "top_p", "min_p", "temperature"))


def repetition_processors() -> list[Any]:
    """The anylogits processors for :data:`REPETITION`, fresh objects each call."""
    from anylogits import RepetitionPenalty

    return [RepetitionPenalty(REPETITION["repetition_penalty"])]


# The engine benchmarks' jobs, by name: fresh anylogits processors, and the job as
# transformers' arguments (each benchmark translates it into its engine's parameters).
ENGINE_JOBS: dict[str, tuple[Callable[[], list[Any]], Job]] = {
    "chain": (chain_processors, CHAIN),
    "repetition": (repetition_processors, REPETITION),
}


def chain_processors_in_generate_order() -> list[Any]:
    """:data:`CHAIN` in the order transformers' ``generate`` applies it (Temperature
    before the truncations it changes), so that both sample the same tokens."""
    return _chain(tuple(CHAIN))


class NoNative(LookupError):
    """The engine has no parameter for one argument of a job."""

    def __init__(self, engine: str, argument: str) -> None:
        super().__init__(f"{engine} has no native parameter for {argument}")
        self.engine = engine
        self.argument = argument


def samples(job: Job) -> bool:
    """Whether ``job`` samples (sets a sampling parameter) rather than decoding greedily."""
    return any(name in job for name in SAMPLING)


def _single_token_bias(engine: str, job: Job) -> dict[int, float]:
    """``sequence_bias`` and ``suppress_tokens`` as one ``{token: bias}`` dict."""
    bias = {}
    for sequence, value in job.get("sequence_bias", {}).items():
        if len(sequence) != 1:
            raise NoNative(engine, f"sequence_bias of {len(sequence)} tokens")
        bias[sequence[0]] = value
    bias.update(dict.fromkeys(job.get("suppress_tokens", ()), BAN))
    return bias


def _check(engine: str, job: Job, supported: set[str]) -> None:
    for argument in job:
        if argument not in supported:
            raise NoNative(engine, argument)


def transformers_parameters(job: Job, sample: bool) -> dict[str, Any]:
    """``model.generate`` arguments: the job itself, transformers' warpers off otherwise."""
    return {"do_sample": sample, "temperature": 1.0, "top_k": None, "top_p": 1.0, **job}


def llama_cpp_parameters(job: Job, sample: bool) -> dict[str, Any]:
    """``Llama.generate`` arguments. Its ``repeat_penalty`` sees the last 64 tokens it
    generated (``last_n_tokens_size``), not the prompt: llama-cpp-python never feeds the
    prompt to its penalties sampler (llama.cpp's own server does). RepetitionPenalty counts
    the prompt, so on a chat prompt the two jobs differ from the first token."""
    _check("llama_cpp", job, {"repetition_penalty", *SAMPLING})
    options = {"repeat_penalty": job.get("repetition_penalty", 1.0)}
    if not sample:
        return {**options, "temp": 0.0}
    return {
        **options,
        "temp": job.get("temperature", 1.0),
        "top_k": job.get("top_k", 0),
        "top_p": job.get("top_p", 1.0),
        "min_p": job.get("min_p", 0.0),
        "typical_p": 1.0,
    }


def mlx_parameters(job: Job, sample: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(make_logits_processors arguments, make_sampler arguments)`` of mlx-lm. Its
    repetition penalty sees the last 20 tokens (``repetition_context_size``)."""
    supported = {"repetition_penalty", "sequence_bias", "suppress_tokens", *SAMPLING}
    _check("mlx", job, supported)
    processors: dict[str, Any] = {}
    if "repetition_penalty" in job:
        processors["repetition_penalty"] = job["repetition_penalty"]
    bias = _single_token_bias("mlx", job)
    if bias:
        processors["logit_bias"] = bias
    if not sample:
        return processors, {"temp": 0.0}
    sampler = {"temp": job.get("temperature", 1.0)}
    sampler.update({name: job[name] for name in ("top_k", "top_p", "min_p") if name in job})
    return processors, sampler


def vllm_parameters(job: Job, sample: bool) -> dict[str, Any]:
    """``SamplingParams`` arguments (``max_tokens`` and ``seed`` aside)."""
    supported = {"repetition_penalty", "sequence_bias", "suppress_tokens", "min_new_tokens"}
    _check("vllm", job, supported | set(SAMPLING))
    options: dict[str, Any] = {"temperature": 1.0 if sample else 0.0}
    options.update({name: job[name] for name in ("repetition_penalty", *SAMPLING) if name in job})
    bias = _single_token_bias("vllm", job)
    if bias:
        options["logit_bias"] = bias
    if "min_new_tokens" in job:
        options["min_tokens"] = job["min_new_tokens"]
    return options
