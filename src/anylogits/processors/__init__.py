"""The processor catalogue, torch only, one module per family."""

from anylogits.processors.control import LogitBias, MinNewTokens, SuppressTokens
from anylogits.processors.occurrence_penalties import DRY, FrequencyPenalty, PresencePenalty
from anylogits.processors.penalties import NoRepeatNGram, RepetitionPenalty
from anylogits.processors.phrases import (
    CiteFromPrompt,
    ForceLastPhrase,
    ForceSequence,
    GenLength,
    MultipleChoice,
    TriggerPhrase,
)
from anylogits.processors.sampling import MinP, Temperature, TopK, TopP
from anylogits.processors.sequences import (
    BadWords,
    ExponentialDecayLength,
    SequenceBias,
    StopStrings,
)
from anylogits.processors.structured import Choice, Grammar, JSONSchema, Regex
from anylogits.processors.truncation import EpsilonCutoff, EtaCutoff, TopH, TopNSigma, TypicalP
from anylogits.processors.watermark import Watermark
from anylogits.processors.xtc import XTC

__all__ = [
    "DRY",
    "XTC",
    "BadWords",
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
    "MinNewTokens",
    "MinP",
    "MultipleChoice",
    "NoRepeatNGram",
    "PresencePenalty",
    "Regex",
    "RepetitionPenalty",
    "SequenceBias",
    "StopStrings",
    "SuppressTokens",
    "Temperature",
    "TopH",
    "TopK",
    "TopNSigma",
    "TopP",
    "TriggerPhrase",
    "TypicalP",
    "Watermark",
]
