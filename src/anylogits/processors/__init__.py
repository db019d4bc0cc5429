"""The processor catalogue, torch only, one module per family."""

from anylogits.processors.control import LogitBias, MinNewTokens, SuppressTokens
from anylogits.processors.penalties import NoRepeatNGram, RepetitionPenalty
from anylogits.processors.sampling import MinP, Temperature, TopK, TopP

__all__ = [
    "LogitBias",
    "MinNewTokens",
    "MinP",
    "NoRepeatNGram",
    "RepetitionPenalty",
    "SuppressTokens",
    "Temperature",
    "TopK",
    "TopP",
]
