"""The processor catalogue, torch only, one module per mechanism:

- temperature: Temperature
- truncation: TopK, TopP, MinP
- adaptive_truncation: TypicalP, EpsilonCutoff, EtaCutoff, TopNSigma, TopH
- xtc: XTC
- penalties: RepetitionPenalty, PresencePenalty, FrequencyPenalty
- dry: DRY
- bans: SuppressTokens, BadWords, NoRepeatNGram
- bias: LogitBias, SequenceBias, CiteFromPrompt
- length: MinNewTokens, ExponentialDecayLength, GenLength, StopStrings
- forcing: ForceSequence, TriggerPhrase, ForceLastPhrase, MultipleChoice
- structured: Regex, JSONSchema, Choice, Grammar
- watermark: Watermark (its detector: watermark_detection)

Private helpers: ``_ops`` (tensor helpers shared by the modules), ``_checks`` (argument
checks) and ``_greenlist`` (the watermark's seeding, shared with its detector).
``structured`` is a package: its processors, then the rooms on the way from a spec to a
mask (``bounds/``, ``guard``, ``engine``, ``state``, ``mask``).
"""

from anylogits.processors.adaptive_truncation import (
    EpsilonCutoff,
    EtaCutoff,
    TopH,
    TopNSigma,
    TypicalP,
)
from anylogits.processors.bans import BadWords, NoRepeatNGram, SuppressTokens
from anylogits.processors.bias import CiteFromPrompt, LogitBias, SequenceBias
from anylogits.processors.dry import DRY
from anylogits.processors.forcing import (
    ForceLastPhrase,
    ForceSequence,
    MultipleChoice,
    TriggerPhrase,
)
from anylogits.processors.length import (
    ExponentialDecayLength,
    GenLength,
    MinNewTokens,
    StopStrings,
)
from anylogits.processors.penalties import FrequencyPenalty, PresencePenalty, RepetitionPenalty
from anylogits.processors.structured import Choice, Grammar, JSONSchema, Regex
from anylogits.processors.temperature import Temperature
from anylogits.processors.truncation import MinP, TopK, TopP
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
