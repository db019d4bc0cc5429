"""``check_processor`` on the backends named: what :func:`anylogits.testing.check_processor`
is (the public name; this module is where it is defined).

The check itself (:func:`anylogits.testing.check.check_processor_on`) drives whatever
backends it is handed and imports no engine; this module stands above both, and hands it
the backends of :data:`~anylogits.engines.backends.BACKENDS` that the caller names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from anylogits.core.processor import LogitsProcessor
from anylogits.engines.backends import BACKENDS, installed
from anylogits.testing.check import check_processor_on


def check_processor(
    processor: LogitsProcessor,
    *,
    backends: Iterable[str] | None = None,
    tokenizer: Any = None,
) -> list[str]:
    """Check that ``processor`` gives the same results on every backend, whatever
    happens to the rows; raise ``AssertionError`` naming the backend, the scenario and
    the first differing row and column.

    Every call of every scenario is compared with the truth: each row replayed alone from
    its prompt, one token at a time, by a fresh copy of ``processor`` (built from its
    spec when it has a ``spec_name``, else a deep copy). First on each backend's hook,
    called as that backend calls it, in each dtype it passes (also compared exactly with
    the core pipeline given the same calls); then on the core pipeline with batched rows,
    in float32, float16 and bfloat16. The scenarios: beam fork/reorder, speculative
    rollback, a resumed sequence, vLLM-style row moves and swaps, the rows of each call
    permuted, and (without a tokenizer) the conformance suite's random forks and
    rollbacks. A processor with a ``spec_name`` must also survive
    ``from_spec(to_spec())``.

    Args:
        processor: the processor to check; it is not run itself (processors bind state),
            only copies of it.
        backends: names from :data:`anylogits.engines.backends.BACKENDS` to check on
            (each must be installed); ``None``: every installed backend; ``()``: the
            core pipeline only.
        tokenizer: the Hugging Face tokenizer whose vocabulary the processor needs (its
            logits are then as wide as the vocabulary); ``None``: 64-wide logits, no
            vocabulary.

    Returns:
        What was checked, one line per backend, scenario and dtype (and skipped
        backends, with the reason).

    Example:
        >>> from anylogits import RepetitionPenalty
        >>> done = check_processor(RepetitionPenalty(1.3), backends=())
        >>> done[0]
        'core: beam fork/reorder, torch.float32'
    """
    names = [name for name in BACKENDS if installed(name)] if backends is None else backends
    names = list(names)
    unknown = [name for name in names if name not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}; known: {list(BACKENDS)}")
    missing = [name for name in names if not installed(name)]
    if missing:
        raise ValueError(f"backend(s) {missing} are not installed here")
    return check_processor_on(processor, [BACKENDS[name] for name in names], tokenizer=tokenizer)
