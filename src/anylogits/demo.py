"""``anylogits demo``: the same processors through a backend, next to its own processors.

On the tiny random-weight model (real llama-bpe vocabulary) it prints, for each
processor, the greedy token ids under anylogits and under the backend's native
equivalent (they must be identical, and must differ from unprocessed decoding, or the
comparison proves nothing), then the per-call cost of the adapter against calling the
same processors directly on a torch tensor.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from anylogits import (
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    MinP,
    NoRepeatNGram,
    Pipeline,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
)


@dataclass
class Case:
    """One demo row: our processors, and the native generate() arguments that match."""

    label: str
    ours: list[LogitsProcessor]
    native: dict[str, Any]
    sample: bool = False


def _cases(tokenizer: Any, greedy: list[int]) -> list[Case]:
    eos = tokenizer.eos_token_id
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SequenceBiasLogitsProcessor,
        SuppressTokensLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    def native(*processors: Any) -> dict[str, Any]:
        return {"logits_processor": LogitsProcessorList(list(processors))}

    banned = sorted(set(greedy[:4]))
    favoured = greedy[-1]
    return [
        Case(
            "RepetitionPenalty(1.3)",
            [RepetitionPenalty(1.3)],
            native(RepetitionPenaltyLogitsProcessor(1.3)),
        ),
        Case("NoRepeatNGram(2)", [NoRepeatNGram(2)], native(NoRepeatNGramLogitsProcessor(2))),
        Case(
            f"SuppressTokens({banned})",
            [SuppressTokens(banned)],
            native(SuppressTokensLogitsProcessor(banned)),
        ),
        Case(
            f"LogitBias({{{favoured}: 4.0}})",
            [LogitBias({favoured: 4.0})],
            native(SequenceBiasLogitsProcessor({(favoured,): 4.0})),
        ),
        Case(
            "LogitBias(eos +30) + MinNewTokens(5)",
            [LogitBias({eos: 30.0}), MinNewTokens(5)],
            {"sequence_bias": {(eos,): 30.0}, "min_new_tokens": 5},
        ),
        Case(
            "sampled: Temperature(0.7) TopK(20) TopP(0.9) MinP(0.05)",
            [Temperature(0.7), TopK(20), TopP(0.9), MinP(0.05)],
            native(
                TemperatureLogitsWarper(0.7),
                TopKLogitsWarper(20),
                TopPLogitsWarper(0.9),
                MinPLogitsWarper(0.05),
            ),
            sample=True,
        ),
    ]


def _generate(
    model: Any, inputs: Any, max_new_tokens: int, sample: bool, **kwargs: Any
) -> list[int]:
    if sample:
        torch.manual_seed(0)
    output = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        # Neutral settings, so that only the processors under test shape the logits.
        temperature=1.0,
        top_k=None,
        top_p=1.0,
        **kwargs,
    )
    return output[0, inputs["input_ids"].shape[1] :].tolist()


def _time_per_call(calls: list[Callable[[], object]], repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for call in calls:
            call()
        best = min(best, (time.perf_counter() - start) / len(calls))
    return best


def _overhead(
    model: Any, inputs: Any, tokenizer: Any, max_new_tokens: int
) -> tuple[float, float, int]:
    """Per-call seconds of the transformers hook and of the bare pipeline, same inputs."""
    from transformers import LogitsProcessorList

    from anylogits import for_transformers

    recorded: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Recorder:
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            recorded.append((input_ids.clone(), scores.clone()))
            return scores

    def processors() -> list[LogitsProcessor]:
        return [RepetitionPenalty(1.3), LogitBias({0: 1.0})]

    _generate(
        model, inputs, max_new_tokens, False, logits_processor=LogitsProcessorList([Recorder()])
    )

    def hook_calls() -> list[Callable[[], object]]:
        hook = for_transformers(*processors(), tokenizer=tokenizer)
        return [functools.partial(hook, ids, scores) for ids, scores in recorded]

    def direct_calls() -> list[Callable[[], object]]:
        pipeline = Pipeline(processors())
        owned = [(ids, scores.clone()) for ids, scores in recorded]
        return [functools.partial(pipeline, scores, ids) for ids, scores in owned]

    hook_time = min(_time_per_call(hook_calls(), repeats=1) for _ in range(5))
    direct_time = min(_time_per_call(direct_calls(), repeats=1) for _ in range(5))
    return hook_time, direct_time, recorded[0][1].shape[-1]


def run_demo(
    backend: str = "transformers",
    prompt: str = "1 2 3 4 5 6 7 8 9 10 11 12",
    max_new_tokens: int = 24,
) -> int:
    """Run the demo; returns a process exit code (1 if any row disagrees)."""
    if backend != "transformers":
        raise ValueError(f"backend {backend!r} is not available yet; use 'transformers'")
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

    from anylogits import for_transformers
    from anylogits.testing.tiny_model import build_tiny_model

    folder = build_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    inputs = tokenizer(prompt, return_tensors="pt")
    print("anylogits demo: backend=transformers, tiny random-weight Llama,")
    print(f"  real llama-bpe vocabulary ({len(tokenizer)} tokens), model folder {folder}")
    print(
        f"  prompt {prompt!r} = {inputs['input_ids'].shape[1]} tokens, "
        f"{max_new_tokens} new tokens, greedy unless marked 'sampled' (seed 0)\n"
    )
    plain = _generate(model, inputs, max_new_tokens, False)
    print(f"{'unprocessed greedy':<56} {plain}")
    failures = 0
    for case in _cases(tokenizer, plain):
        hook = for_transformers(*case.ours, tokenizer=tokenizer)
        ours = _generate(
            model, inputs, max_new_tokens, case.sample, logits_processor=LogitsProcessorList([hook])
        )
        native = _generate(model, inputs, max_new_tokens, case.sample, **case.native)
        baseline = _generate(model, inputs, max_new_tokens, case.sample)
        agree = ours == native
        bites = native != baseline
        failures += not (agree and bites)
        verdict = "same as transformers" if agree else "DIFFERS from transformers"
        effect = "changes the output" if bites else "NO EFFECT on this prompt"
        print(f"{case.label:<56} {ours}\n{'':<56} -> {verdict}; {effect}")
    hook_time, direct_time, width = _overhead(model, inputs, tokenizer, max_new_tokens)
    print(
        f"\nper call, V={width}, B=1, RepetitionPenalty + LogitBias, over {max_new_tokens} steps:"
    )
    print(f"  transformers hook {hook_time * 1e6:8.1f} µs")
    print(f"  same processors on a torch tensor {direct_time * 1e6:8.1f} µs")
    print(
        f"  adapter overhead {(hook_time - direct_time) * 1e6:+8.1f} µs "
        f"({hook_time / direct_time:.2f}x; the hook clones the scores, which transformers "
        "keeps)"
    )
    print("\nall rows agree with transformers" if not failures else f"\n{failures} row(s) failed")
    return 1 if failures else 0
