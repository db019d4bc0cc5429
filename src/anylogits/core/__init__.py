"""The one implementation every adapter wraps: contract, batch, tracker, arrays, vocab."""

from anylogits.core.arrays import Converted, from_torch, to_torch
from anylogits.core.batch import Batch
from anylogits.core.pipeline import Pipeline
from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor
from anylogits.core.registry import load_plugins
from anylogits.core.specs import from_spec, to_specs
from anylogits.core.tracker import SequenceNode, SequenceTracker
from anylogits.core.vocab import Vocabulary

__all__ = [
    "Batch",
    "Converted",
    "LogitsProcessor",
    "Pipeline",
    "SequenceNode",
    "SequenceTracker",
    "StatefulLogitsProcessor",
    "Vocabulary",
    "from_spec",
    "from_torch",
    "load_plugins",
    "to_specs",
    "to_torch",
]
