"""The one implementation every adapter wraps: contract, batch, tracker, arrays, vocab.

Each name is imported from its module on first use, so that a module of this package
that needs no torch (the registry, the limits) is imported without it.

The registry and the spec format are imported with the package (neither needs torch):
they stand above the processor contract (:mod:`~anylogits.core.processor` imports
neither) and install themselves on it, so every processor class is registered, and
``SomeProcessor.from_spec`` works, from the first class defined.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anylogits._lazy import lazy_attributes
from anylogits.core import registry, specs  # noqa: F401  (they install themselves, see above)

if TYPE_CHECKING:
    from anylogits.core.arrays import Converted, from_torch, to_torch
    from anylogits.core.batch import Batch
    from anylogits.core.pipeline import Pipeline
    from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor
    from anylogits.core.registry import load_plugins
    from anylogits.core.specs import from_spec, to_specs
    from anylogits.core.tracker import SequenceNode, SequenceTracker
    from anylogits.core.vocab import Vocabulary

_LAZY = {
    "Batch": "anylogits.core.batch",
    "Converted": "anylogits.core.arrays",
    "LogitsProcessor": "anylogits.core.processor",
    "Pipeline": "anylogits.core.pipeline",
    "SequenceNode": "anylogits.core.tracker",
    "SequenceTracker": "anylogits.core.tracker",
    "StatefulLogitsProcessor": "anylogits.core.processor",
    "Vocabulary": "anylogits.core.vocab",
    "from_spec": "anylogits.core.specs",
    "from_torch": "anylogits.core.arrays",
    "load_plugins": "anylogits.core.registry",
    "to_specs": "anylogits.core.specs",
    "to_torch": "anylogits.core.arrays",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)

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
