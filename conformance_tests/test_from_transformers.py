"""``from_transformers``: transformers' own processor objects, run by every engine, give
transformers' own tokens (the processors read ``input_ids``, so the history must be laid
out as transformers lays it out)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from anylogits import from_transformers
from anylogits.engines.generation import GenerationEngine, TransformersEngine
from test_support.generation_cases import COUNTING

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

# Each builds a fresh transformers processor from the engine's unprocessed greedy tokens.
HF_PROCESSORS: dict[str, Callable[[list[int]], Any]] = {
    "repetition_penalty": lambda plain: transformers.RepetitionPenaltyLogitsProcessor(1.3),
    "no_repeat_ngram": lambda plain: transformers.NoRepeatNGramLogitsProcessor(2),
    "suppress_tokens": lambda plain: transformers.SuppressTokensLogitsProcessor(
        sorted(set(plain[:4]))
    ),
}


def transformers_tokens(reference: TransformersEngine, prompt: list[int], hf: Any) -> list[int]:
    """transformers' ``generate`` with the processor object itself, no anylogits."""
    hooks = transformers.LogitsProcessorList([hf] if hf is not None else [])
    return reference.native_greedy(prompt, hooks)


@pytest.mark.parametrize("name", sorted(HF_PROCESSORS))
def test_a_transformers_processor_gives_transformers_tokens(
    engine: GenerationEngine, reference: TransformersEngine, name: str
) -> None:
    """On vLLM too: the suite's engine runs in this process, where the object lives."""
    prompt = engine.encode(COUNTING)
    plain = engine.greedy(prompt)
    expected = transformers_tokens(reference, prompt, HF_PROCESSORS[name](plain))
    assert expected != transformers_tokens(reference, prompt, None), f"{name} changed nothing"
    ours = engine.greedy(prompt, [from_transformers(HF_PROCESSORS[name](plain))])
    assert ours == expected


def test_vllm_with_its_engine_elsewhere_refuses_it_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("vllm")
    from anylogits import for_vllm
    from anylogits.adapters import vllm

    request = for_vllm(from_transformers(transformers.RepetitionPenaltyLogitsProcessor(1.3)))
    monkeypatch.setattr(vllm, "_ENGINES_HERE", 1)  # as with the engine in this process
    vllm.AnyLogits.validate_params(request)
    monkeypatch.setattr(vllm, "_ENGINES_HERE", 0)  # as in a frontend whose engine is apart
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        vllm.AnyLogits.validate_params(request)
