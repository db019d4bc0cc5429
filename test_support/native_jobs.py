"""One job, every engine: each engine's own parameters for it (``engine.native``, through
:mod:`anylogits.engines.native`) against anylogits processors doing the same, on the tiny
model. The generation suite runs every job on every backend; an engine without a
parameter for the job skips it (``NoNative``), and a known difference is a strict xfail
with its reason.

Sampled jobs draw with the same seed on both sides: the engine's own sampling at
temperature 1 without truncation after our processors, its own parameters without ours.
Identical kept logits and the same seed give the same draws, so the sampled ids must be
identical. Our processors run in the order the engine applies its own parameters
(``APPLICATION_ORDER``): a temperature changes what top-p and min-p keep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anylogits import (
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    MinP,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
)
from anylogits.engines.native import Job
from test_support.generation_cases import EOS

# The order each engine applies its own parameters in, read from its source: transformers'
# generate (its warpers list) and vLLM's sampler scale by the temperature before they
# truncate; mlx-lm's make_sampler and llama-cpp-python's sampler chain truncate first and
# scale last, inside the sampler.
APPLICATION_ORDER: dict[str, tuple[str, ...]] = {
    "transformers": ("repetition_penalty", "temperature", "top_k", "top_p", "min_p"),
    # continuous batching converts generate's warpers to per-request ones, in their order
    "transformers_cb": ("repetition_penalty", "temperature", "top_k", "top_p", "min_p"),
    "vllm": ("repetition_penalty", "temperature", "min_p", "top_k", "top_p"),
    "mlx": ("repetition_penalty", "top_p", "min_p", "top_k", "temperature"),
    "llama_cpp": ("repetition_penalty", "top_k", "top_p", "min_p", "temperature"),
}

_PROCESSOR_OF: dict[str, Callable[[Any], LogitsProcessor]] = {
    "repetition_penalty": RepetitionPenalty,
    "temperature": Temperature,
    "top_k": TopK,
    "top_p": TopP,
    "min_p": MinP,
}

# mlx-lm's repetition penalty sees the last 20 tokens (its repetition_context_size), the
# prompt included: RepetitionPenalty's context_size is the same window.
MLX_REPETITION_WINDOW = 20


def in_engine_order(job: Job, engine: str) -> list[LogitsProcessor]:
    """Our processors for ``job``'s repetition penalty and sampling parameters, in the
    order ``engine`` applies its own."""
    processors = []
    for name in APPLICATION_ORDER[engine]:
        if name not in job:
            continue
        if name == "repetition_penalty" and engine == "mlx":
            processors.append(RepetitionPenalty(job[name], context_size=MLX_REPETITION_WINDOW))
        else:
            processors.append(_PROCESSOR_OF[name](job[name]))
    return processors


def _assert_none_of(tokens: list[int], banned: set[int]) -> None:
    assert not set(tokens) & banned, f"a banned token was generated: {set(tokens) & banned}"


def _holds_min_new_tokens(ours: list[int], pushed: list[int]) -> None:
    assert pushed == [EOS], "the EOS bias alone should stop generation at once"
    assert EOS not in ours[:5] and ours[5] == EOS, ours


@dataclass(frozen=True)
class NativeJob:
    """``job(plain)``: the job, given the engine's unprocessed greedy tokens. ``extra``:
    our processors beyond :func:`in_engine_order`'s. ``sampled``: drawn with a seed rather
    than greedy. ``baseline``: the processors whose tokens the job must change (none: the
    unprocessed tokens). ``holds``: checks of our tokens beyond equality, given them and
    the baseline's tokens."""

    job: Callable[[list[int]], Job]
    extra: Callable[[list[int]], list[LogitsProcessor]] = lambda plain: []
    sampled: bool = False
    baseline: Callable[[list[int]], list[LogitsProcessor]] | None = None
    holds: Callable[[list[int], list[int]], None] | None = None
    # (backend name -> reason): where the engine's own parameter does something else.
    known_differences: dict[str, str] = field(default_factory=dict)


# Same kept tokens, other draws: llama.cpp's top-k and top-p sort the candidates by logit,
# and its dist sampler draws by position in the candidate array; after our processors (its
# chain neutral) the candidates stay in id order, so the same seed picks another position.
# temperature and min_p keep llama.cpp's order and draw the same tokens.
LLAMA_CPP_SORTS = {
    "llama_cpp": (
        "llama.cpp's top_k/top_p sort the candidates and its dist sampler draws by position: "
        "the same kept set and seed draw other tokens than ours, left in id order"
    )
}
# Measured on the tiny model (first step: mlx-lm keeps 1,329 tokens, ours 1,332, and the
# exact float64 mass of mlx-lm's 1,329 is 0.79995, below 0.8).
MLX_TOP_P_SUM = (
    "mlx-lm's apply_top_p sums the ~1,300-token nucleus of top_p=0.8 as a float32 running "
    "sum that reaches 0.8 about 3 tokens before the exact mass does; ours keeps them"
)

_PUSH_EOS = {(EOS,): 30.0}  # the tiny model then stops at once, unless EOS is held back

NATIVE_JOBS: dict[str, NativeJob] = {
    # llama-cpp-python's repeat_penalty never sees the prompt (RepetitionPenalty does): on
    # this prompt the tiny model's greedy tokens do not tell them apart; the array oracle
    # (test_oracles_penalties) pins the difference.
    "repetition_penalty": NativeJob(lambda plain: {"repetition_penalty": 1.3}),
    "logit_bias": NativeJob(
        lambda plain: {"sequence_bias": {(plain[0],): -5.0, (plain[-1],): 4.0}},
        extra=lambda plain: [LogitBias({plain[0]: -5.0, plain[-1]: 4.0})],
    ),
    "suppress_tokens": NativeJob(
        lambda plain: {"suppress_tokens": sorted(set(plain[:6]))},
        extra=lambda plain: [SuppressTokens(sorted(set(plain[:6])))],
        holds=lambda ours, plain: _assert_none_of(ours, set(plain[:6])),
    ),
    "min_new_tokens": NativeJob(
        lambda plain: {"min_new_tokens": 5, "sequence_bias": _PUSH_EOS},
        extra=lambda plain: [MinNewTokens(5, eos_token_id=EOS), LogitBias({EOS: 30.0})],
        baseline=lambda plain: [LogitBias({EOS: 30.0})],
        holds=_holds_min_new_tokens,
    ),
    # Without eos_token_id, MinNewTokens takes the EOS ids from the engine's tokenizer.
    "min_new_tokens_engine_eos": NativeJob(
        lambda plain: {"min_new_tokens": 5, "sequence_bias": _PUSH_EOS},
        extra=lambda plain: [MinNewTokens(5), LogitBias({EOS: 30.0})],
        baseline=lambda plain: [LogitBias({EOS: 30.0})],
        holds=_holds_min_new_tokens,
    ),
    "temperature": NativeJob(lambda plain: {"temperature": 0.5}, sampled=True),
    "temperature_hot": NativeJob(lambda plain: {"temperature": 1.7}, sampled=True),
    "top_k": NativeJob(lambda plain: {"top_k": 5}, sampled=True, known_differences=LLAMA_CPP_SORTS),
    "top_p": NativeJob(
        lambda plain: {"top_p": 0.8},
        sampled=True,
        known_differences={**LLAMA_CPP_SORTS, "mlx": MLX_TOP_P_SUM},
    ),
    "min_p": NativeJob(lambda plain: {"min_p": 0.2}, sampled=True),
    # At temperature 1 the tiny model's nucleus for 0.8 holds ~1300 tokens; at 0.5 about
    # 8, so there the top-p boundary decides draws.
    "temperature_top_p": NativeJob(
        lambda plain: {"temperature": 0.5, "top_p": 0.8},
        sampled=True,
        known_differences=LLAMA_CPP_SORTS,
    ),
    "temperature_min_p_top_k_top_p": NativeJob(
        lambda plain: {"temperature": 0.7, "min_p": 0.05, "top_k": 12, "top_p": 0.9},
        sampled=True,
        known_differences=LLAMA_CPP_SORTS,
    ),
}

SEEDS = (7, 1234)
SAMPLED_TOKENS = 24

# (job, seed): greedy jobs once, sampled jobs with each seed.
NATIVE_RUNS = [
    (name, seed)
    for name, native_job in NATIVE_JOBS.items()
    for seed in (SEEDS if native_job.sampled else (None,))
]
