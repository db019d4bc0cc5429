"""The processor catalogue, torch only, one module per family."""

from anylogits.processors.control import LogitBias, MinNewTokens, SuppressTokens
from anylogits.processors.penalties import NoRepeatNGram, RepetitionPenalty
from anylogits.processors.sampling import MinP, Temperature, TopK, TopP
from anylogits.processors.structured import Choice, Grammar, JSONSchema, Regex
from anylogits.processors.truncation import EpsilonCutoff, EtaCutoff, TopH, TopNSigma, TypicalP
from anylogits.processors.watermark import Watermark
from anylogits.processors.xtc import XTC

__all__ = [
    "XTC",
    "Choice",
    "EpsilonCutoff",
    "EtaCutoff",
    "Grammar",
    "JSONSchema",
    "LogitBias",
    "MinNewTokens",
    "MinP",
    "NoRepeatNGram",
    "Regex",
    "RepetitionPenalty",
    "SuppressTokens",
    "Temperature",
    "TopH",
    "TopK",
    "TopNSigma",
    "TopP",
    "TypicalP",
    "Watermark",
]
