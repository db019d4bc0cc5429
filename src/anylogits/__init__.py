"""anylogits: one logits processor, written once in torch, run on every backend.

Importing this package imports nothing else: each name is imported from its module on
first use (torch with the first processor), and each backend library only by its own
adapter, when its factory is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anylogits._lazy import lazy_attributes

if TYPE_CHECKING:
    from anylogits.adapters.from_transformers import from_transformers
    from anylogits.adapters.llama_cpp import for_llama_cpp
    from anylogits.adapters.mlx import for_mlx
    from anylogits.adapters.transformers import for_transformers
    from anylogits.adapters.transformers_cb import for_continuous_batching
    from anylogits.adapters.vllm import for_vllm, vllm_processor_class
    from anylogits.core.batch import Batch
    from anylogits.core.pipeline import Pipeline
    from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor
    from anylogits.core.registry import load_plugins
    from anylogits.core.specs import from_spec, to_specs
    from anylogits.core.vocab import Vocabulary
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

__version__ = "0.1.0.dev0"

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
    "for_continuous_batching",
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

# Every public name lives in its own module and is imported on first access: `import
# anylogits` costs nothing (the command answers --help without torch), and a backend
# library is imported only when its factory is used. The names not listed here are the
# catalogue's, from anylogits.processors.
_MODULES = {
    "Batch": "anylogits.core.batch",
    "LogitsProcessor": "anylogits.core.processor",
    "Pipeline": "anylogits.core.pipeline",
    "StatefulLogitsProcessor": "anylogits.core.processor",
    "Vocabulary": "anylogits.core.vocab",
    "WatermarkDetection": "anylogits.processors.watermark_detection",
    "detect_watermark": "anylogits.processors.watermark_detection",
    "for_continuous_batching": "anylogits.adapters.transformers_cb",
    "for_llama_cpp": "anylogits.adapters.llama_cpp",
    "for_mlx": "anylogits.adapters.mlx",
    "for_transformers": "anylogits.adapters.transformers",
    "for_vllm": "anylogits.adapters.vllm",
    "from_spec": "anylogits.core.specs",
    "from_transformers": "anylogits.adapters.from_transformers",
    "load_plugins": "anylogits.core.registry",
    "to_specs": "anylogits.core.specs",
    "vllm_processor_class": "anylogits.adapters.vllm",
    "vllm_xargs": "anylogits.core.wire",
}
_LAZY = {name: _MODULES.get(name, "anylogits.processors") for name in __all__}
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
