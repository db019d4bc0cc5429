"""anylogits: one logits processor, written once in torch, run on every backend.

Importing this package imports torch and nothing else: each backend library is imported
only by its own adapter, when its factory is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from anylogits.adapters.from_transformers import from_transformers
from anylogits.core import (
    Batch,
    LogitsProcessor,
    Pipeline,
    StatefulLogitsProcessor,
    Vocabulary,
    from_spec,
    load_plugins,
    to_specs,
)
from anylogits.core.wire import vllm_xargs
from anylogits.processors import (
    DRY,
    XTC,
    BadWords,
    Choice,
    CiteFromPrompt,
    EpsilonCutoff,
    EtaCutoff,
    ExponentialDecayLength,
    ForceLastPhrase,
    ForceSequence,
    FrequencyPenalty,
    GenLength,
    Grammar,
    JSONSchema,
    LogitBias,
    MinNewTokens,
    MinP,
    MultipleChoice,
    NoRepeatNGram,
    PresencePenalty,
    Regex,
    RepetitionPenalty,
    SequenceBias,
    StopStrings,
    SuppressTokens,
    Temperature,
    TopH,
    TopK,
    TopNSigma,
    TopP,
    TriggerPhrase,
    TypicalP,
    Watermark,
)
from anylogits.processors.watermark_detection import WatermarkDetection, detect_watermark

if TYPE_CHECKING:
    from anylogits.adapters.llama_cpp import for_llama_cpp
    from anylogits.adapters.mlx import for_mlx
    from anylogits.adapters.transformers import for_transformers
    from anylogits.adapters.vllm import for_vllm, vllm_processor_class

__version__ = "0.1.0.dev0"

# Factories live in their adapter modules and are imported on first access, so that
# `import anylogits` never imports a backend library.
_LAZY_FACTORIES = {
    "for_llama_cpp": "anylogits.adapters.llama_cpp",
    "for_mlx": "anylogits.adapters.mlx",
    "for_transformers": "anylogits.adapters.transformers",
    "for_vllm": "anylogits.adapters.vllm",
    "vllm_processor_class": "anylogits.adapters.vllm",
}


def __getattr__(name: str) -> Any:
    module = _LAZY_FACTORIES.get(name)
    if module is None:
        raise AttributeError(f"module 'anylogits' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY_FACTORIES])


__all__ = [
    "DRY",
    "XTC",
    "BadWords",
    "Batch",
    "Choice",
    "CiteFromPrompt",
    "EpsilonCutoff",
    "EtaCutoff",
    "ExponentialDecayLength",
    "ForceLastPhrase",
    "ForceSequence",
    "FrequencyPenalty",
    "GenLength",
    "Grammar",
    "JSONSchema",
    "LogitBias",
    "LogitsProcessor",
    "MinNewTokens",
    "MinP",
    "MultipleChoice",
    "NoRepeatNGram",
    "Pipeline",
    "PresencePenalty",
    "Regex",
    "RepetitionPenalty",
    "SequenceBias",
    "StatefulLogitsProcessor",
    "StopStrings",
    "SuppressTokens",
    "Temperature",
    "TopH",
    "TopK",
    "TopNSigma",
    "TopP",
    "TriggerPhrase",
    "TypicalP",
    "Vocabulary",
    "Watermark",
    "WatermarkDetection",
    "detect_watermark",
    "for_llama_cpp",
    "for_mlx",
    "for_transformers",
    "for_vllm",
    "from_spec",
    "from_transformers",
    "load_plugins",
    "to_specs",
    "vllm_processor_class",
    "vllm_xargs",
]
