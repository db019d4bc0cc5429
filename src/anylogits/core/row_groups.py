"""The pipelines of an engine's persistent batch: one per distinct specs (kept, least
recently used first out, for the requests to come), and the rows of one call grouped by
pipeline, groups of the same processor kinds stacked into one call."""

from __future__ import annotations

import itertools
import json
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from anylogits.core.cache import LeastRecentlyUsed
from anylogits.core.fast_paths import stack, stacks_states
from anylogits.core.pipeline import Pipeline
from anylogits.core.slot_requests import PipelineGroup, SlotRequest
from anylogits.core.specs import CheckedSpecs, build_specs
from anylogits.core.vocab import Vocabulary

logger = logging.getLogger("anylogits.core.persistent_batch")

# Pipelines kept for specs that no running request uses, and the characters of those
# specs' JSON they may add up to: a pipeline holds its specs (a request's may be 128 KB,
# more where an operator raises 'spec_bytes') and what its processors built from them
# (a grammar's text), so 1,024 of the largest would hold gigabytes.
GROUP_CACHE = 1024
GROUP_CACHE_CHARS = 16 << 20
# Stacked mixes of a step's groups kept: a mix recurs at every step whose layout is built
# again while the same requests run (drafts, rows named anew), and hardly ever once one of
# them leaves. Each holds a bitmask of all its rows (1.5 MB at 32 rows of 128k tokens):
# kept in the groups' cache, a server's churn of requests filled it with mixes no request
# would run again (2.3 GB after 200 replaced requests of 32 at 128k tokens).
STACK_CACHE = 8


def brief(key: str, size: int = 300) -> str:
    """A spec key short enough for a log line (a request's specs may be 128 KB)."""
    return key if len(key) <= size else f"{key[:size]}... ({len(key)} characters)"


class RowGroup:
    """The rows of one call that share a pipeline."""

    __slots__ = ("group", "index", "requests", "rows", "slots", "span")

    def __init__(self, group: PipelineGroup) -> None:
        self.group = group
        self.rows: list[int] = []
        self.slots: list[int] = []
        self.requests: list[SlotRequest] = []
        self.index: torch.Tensor | None = None
        self.span: tuple[int, int] | None = None


class PipelineGroups:
    """The pipelines of the specs an engine's requests carry, built for the vocabulary
    ``vocab()`` returns.

    A server meets endless distinct specs: pipelines no running request uses are dropped,
    least recently used first (requests still running keep theirs).
    """

    def __init__(self, vocab: Callable[[], Vocabulary | None]) -> None:
        self.vocab = vocab
        self._groups: LeastRecentlyUsed[str, PipelineGroup] = LeastRecentlyUsed(
            GROUP_CACHE, max_weight=GROUP_CACHE_CHARS
        )
        # Keyed by the tuple of the members' spec keys: those strings hash once (their
        # hash is kept). One key joined from them was built and hashed at every layout a
        # step builds anew: 32 requests with 2.5 M characters of schemas took 580 us a
        # layout instead of 42.
        self._stacks: LeastRecentlyUsed[tuple[str, ...], PipelineGroup] = LeastRecentlyUsed(
            STACK_CACHE
        )
        # Groups of pipelines built elsewhere, while a request holds them: such a pipeline
        # is its caller's (one per request on mlx-lm's server), and comes back only with it.
        self._given: weakref.WeakValueDictionary[int, PipelineGroup] = weakref.WeakValueDictionary()
        self._given_numbers = itertools.count()

    def __len__(self) -> int:
        """The pipelines kept: of specs, stacked mixes, and given ones still held."""
        return len(self._groups) + len(self._stacks) + len(self._given)

    def group(self, specs: Sequence[dict[str, Any]]) -> PipelineGroup:
        """The group of ``specs`` (a failed one, which ends its requests, when they cannot
        be built here; built as checked where :func:`~anylogits.core.specs.parse_specs`
        checked them)."""
        # Specs a request's check returned are keyed by the text they were checked as,
        # which determines them: a schema's JSON costs 240 us on average over the
        # real-schema corpus, in the engine's step.
        if isinstance(specs, CheckedSpecs):
            key = specs.text
        else:
            key = json.dumps(specs, sort_keys=True, separators=(",", ":"))
        group = self._groups.get(key)
        if group is None:
            try:
                pipeline = Pipeline(build_specs(specs), self.vocab())
            except Exception as error:  # e.g. an id beyond the vocabulary: end the request
                return self.failed(f"processors {brief(key)} cannot run here: {error}")
            group = self._groups.put(key, PipelineGroup(key, pipeline, None), weight=len(key))
        return group

    def given(self, pipeline: Pipeline) -> PipelineGroup:
        """The group of a pipeline built elsewhere (processor objects, no specs)."""
        group = self._given.get(id(pipeline))
        if group is None or group.pipeline is not pipeline:
            # Numbered: a stacked mix is cached by its groups' keys, and a freed
            # pipeline's id comes back with the next one made.
            key = f"pipeline:{next(self._given_numbers)}"
            group = self._given[id(pipeline)] = PipelineGroup(key, pipeline, None)
        return group

    def failed(self, error: str) -> PipelineGroup:
        """A group that ends its requests' sequences, ``error`` logged."""
        logger.error("anylogits: %s; the request's sequence is ended", error)
        return PipelineGroup(f"error:{error}", None, error)

    def stack_same_kinds(self, layout: list[RowGroup]) -> list[RowGroup]:
        """Merge groups that run the same kinds of processors with different parameters
        into one group whose pipeline processes every row with its own parameters (and,
        for stateful kinds that stack states, its own request's states)."""
        if len(layout) < 2:
            return layout
        by_kinds: dict[tuple[type, ...], list[RowGroup]] = {}
        merged_layout: list[RowGroup] = []  # failed or stateful groups stay as they are
        for row_group in layout:
            pipeline = row_group.group.pipeline
            if pipeline is None or not all(map(stacks_states, pipeline.stateful)):
                merged_layout.append(row_group)
                continue
            kinds = tuple(type(p) for p in pipeline.processors)
            by_kinds.setdefault(kinds, []).append(row_group)
        for groups in by_kinds.values():
            merged = None
            if len(groups) > 1:
                try:
                    merged = self._stacked(groups)
                except Exception:  # a processor's stack() failed: run the groups apart
                    logger.exception("anylogits: stacking %d groups failed", len(groups))
            merged_layout.extend([merged] if merged is not None else groups)
        return merged_layout

    def _stacked(self, groups: list[RowGroup]) -> RowGroup | None:
        members = sorted(
            (row, slot, request)
            for row_group in groups
            for row, slot, request in zip(
                row_group.rows, row_group.slots, row_group.requests, strict=True
            )
        )
        keys = tuple(member[2].group.key for member in members)
        group = self._stacks.get(keys)
        if group is None:
            pipelines: list[Pipeline] = []
            for member in members:
                assert member[2].group.pipeline is not None  # failed groups never stack
                pipelines.append(member[2].group.pipeline)
            stacked = []
            for position, kind in enumerate(type(p) for p in pipelines[0].processors):
                processor = stack(kind, [p.processors[position] for p in pipelines])
                if processor is None:
                    return None
                stacked.append(processor)
            # The group's own key names it in a log line, briefly.
            name = f"stack of {len(keys)} rows: " + "|".join(brief(key, 100) for key in keys[:3])
            pipeline = Pipeline(stacked, self.vocab())
            group = self._stacks.put(keys, PipelineGroup(name, pipeline, None))
        merged = RowGroup(group)
        for row, slot, request in members:
            merged.rows.append(row)
            merged.slots.append(slot)
            merged.requests.append(request)
        return merged
