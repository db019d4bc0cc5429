"""Each catalogue processor beside its native oracles, per backend, on identical input.

``ORACLES[name][backend]`` builds the backend's own implementation as a callable
``(ids, logits) -> logits``; backends add entries as their issues land (vLLM's sampler
ops, mlx-lm's compiled ops, llama.cpp's samplers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from anylogits import (
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    MinP,
    NoRepeatNGram,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
)

HISTORY = 256
BIAS = {11: 2.0, 22: -1.5, 33: 0.5}
SUPPRESSED = [5, 6, 7, 8]

PROCESSORS: dict[str, Callable[[], LogitsProcessor]] = {
    "temperature": lambda: Temperature(0.7),
    "top_k": lambda: TopK(50),
    "top_p": lambda: TopP(0.9),
    "min_p": lambda: MinP(0.05),
    "repetition_penalty": lambda: RepetitionPenalty(1.3),
    "no_repeat_ngram": lambda: NoRepeatNGram(3),
    "min_new_tokens": lambda: MinNewTokens(5, eos_token_id=2),
    "logit_bias": lambda: LogitBias(BIAS),
    "suppress_tokens": lambda: SuppressTokens(SUPPRESSED),
}

Oracle = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _transformers(name: str) -> Oracle:
    import transformers as t

    factories: dict[str, Callable[[], Any]] = {
        "temperature": lambda: t.TemperatureLogitsWarper(0.7),
        "top_k": lambda: t.TopKLogitsWarper(50),
        "top_p": lambda: t.TopPLogitsWarper(0.9),
        "min_p": lambda: t.MinPLogitsWarper(0.05),
        "repetition_penalty": lambda: t.RepetitionPenaltyLogitsProcessor(1.3),
        "no_repeat_ngram": lambda: t.NoRepeatNGramLogitsProcessor(3),
        "min_new_tokens": lambda: t.MinNewTokensLengthLogitsProcessor(HISTORY - 2, 5, 2),
        "logit_bias": lambda: t.SequenceBiasLogitsProcessor(
            {(token,): bias for token, bias in BIAS.items()}
        ),
        "suppress_tokens": lambda: t.SuppressTokensLogitsProcessor(SUPPRESSED),
    }
    return factories[name]()


ORACLES: dict[str, Callable[[str], Oracle]] = {"transformers": _transformers}
