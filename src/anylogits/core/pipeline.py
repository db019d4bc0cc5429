"""Several processors run as one: one tracker, one batch, processors in the given order."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from anylogits.core import fast_paths
from anylogits.core.batch import Batch, TokenSource
from anylogits.core.fast_paths import Candidates
from anylogits.core.launch_plan import launch_plan
from anylogits.core.pending import PendingLogits
from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor
from anylogits.core.sync import host_sync_allowed
from anylogits.core.tracker import SequenceTracker, child_maker
from anylogits.core.vocab import Vocabulary
from anylogits.kernels import kernels_enabled

logger = logging.getLogger(__name__)

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def flatten(processors: Iterable[LogitsProcessor | Pipeline]) -> list[LogitsProcessor]:
    """``processors`` in order, with nested pipelines replaced by their processors."""
    flat: list[LogitsProcessor] = []
    for processor in processors:
        if isinstance(processor, Pipeline):
            flat.extend(processor.processors)
        elif isinstance(processor, LogitsProcessor):
            flat.append(processor)
        else:
            raise TypeError(
                f"expected anylogits processors, got {type(processor).__qualname__} ({processor!r})"
            )
    return flat


def end_sequences(rows: torch.Tensor, vocab: Vocabulary | None) -> torch.Tensor:
    """``rows`` (in place) allowing only the vocabulary's first EOS id: how a request whose
    processors failed is ended. Unchanged, with an error logged, when there is no EOS to
    force (the engine then stops at ``max_tokens``)."""
    eos = sorted(vocab.eos_token_ids) if vocab is not None else []
    if not eos or eos[0] >= rows.shape[1]:
        logger.error(
            "anylogits: the model has no EOS token to end a failed request with; its "
            "logits are left unprocessed until it reaches max_tokens"
        )
        return rows
    rows.fill_(float("-inf"))
    rows[:, eos[0]] = 0.0
    return rows


def row_local_ends(processors: Sequence[LogitsProcessor]) -> tuple[int, ...]:
    """For each position ``i``: the end of the run of row-local processors that follows
    it (``i + 1`` when the next one is not row-local)."""
    ends = [len(processors)] * len(processors)
    for index in range(len(processors) - 2, -1, -1):
        follower = processors[index + 1]
        ends[index] = ends[index + 1] if fast_paths.is_row_local(follower) else index + 1
    return tuple(ends)


def run_on_candidates(
    truncation: LogitsProcessor,
    followers: Sequence[LogitsProcessor],
    logits: torch.Tensor,
    batch: Batch,
) -> Candidates | None:
    """``truncation`` then ``followers`` (row-local) applied to ``logits``, the followers
    on the ``(B, K)`` candidates the truncation leaves, which are returned (``logits``
    are not written); ``None`` (nothing done) when it leaves no candidates or a row holds
    more than ``K`` (a tie at the K-th logit).

    The followers see the same finite logits as on the full rows and give the same bits
    (``row_local`` promises it), so the written candidates are the full path's result,
    bit for bit. While the candidates stay in descending order (``keeps_order``) the
    followers get them through ``process_descending``. Whether every row is exact is a
    host read: an accelerator would stall the stream on it, and a fallback that needs no
    read would compute the full path anyway, so there the processors run on the full
    rows.
    """
    if not host_sync_allowed(logits):
        return None
    candidates = fast_paths.candidates(truncation, logits, batch)
    if candidates is None or not bool(candidates.exact.all()):
        return None
    values, descending = candidates.values, candidates.descending
    for follower in followers:
        if descending:
            values = fast_paths.process_descending(follower, values, batch)
            descending = fast_paths.keeps_order(follower)
        else:
            values = follower.process(values, batch)
    return candidates._replace(values=values, descending=descending)


class Pipeline:
    """Processors applied in order to ``(B, V)`` logits; what every adapter wraps.

    Args:
        processors: the processors, applied in the order given. Nested pipelines are
            flattened.
        vocab: the model's vocabulary, bound to every processor now.
        max_idle_calls: see :class:`~anylogits.core.tracker.SequenceTracker`.

    Example:
        >>> import torch
        >>> from anylogits import Pipeline, Temperature, TopK
        >>> pipeline = Pipeline([Temperature(0.5), TopK(2)])
        >>> pipeline(torch.tensor([[1.0, 3.0, 2.0]]), torch.tensor([[7]]))
        tensor([[-inf, 6., 4.]])
    """

    def __init__(
        self,
        processors: Iterable[LogitsProcessor | Pipeline],
        vocab: Vocabulary | None = None,
        *,
        max_idle_calls: int = 64,
    ) -> None:
        flat = flatten(processors)
        if len({id(p) for p in flat}) != len(flat):
            raise ValueError("the same processor object is given twice; pass it once")
        self.processors: tuple[LogitsProcessor, ...] = tuple(flat)
        self._row_local_ends = row_local_ends(self.processors)
        self._kernel_plan = launch_plan(self.processors)
        self.vocab = vocab
        for processor in self.processors:
            processor.bind(vocab)
        self._stateful = tuple(p for p in flat if isinstance(p, StatefulLogitsProcessor))
        self._state_keys = tuple(id(processor) for processor in self._stateful)
        # How an engine that knows its rows (slots) advances their nodes, made once.
        self.child = child_maker(self._stateful)
        needs_tracking = any(p.needs_sequences for p in flat)
        self.tracker = (
            SequenceTracker(self._stateful, max_idle_calls=max_idle_calls)
            if needs_tracking
            else None
        )
        self._checked_layouts: set[tuple[torch.dtype, torch.Size]] = set()

    def reset(self) -> None:
        """Forget every tracked sequence (e.g. between unrelated requests)."""
        if self.tracker is not None:
            self.tracker.reset()

    def __call__(
        self,
        logits: torch.Tensor | PendingLogits,
        token_ids: TokenSource | None = None,
        *,
        lengths: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Process ``(B, V)`` logits in place and return them.

        Args:
            logits: ``(B, V)`` floating logits the pipeline may edit in place, or
                :class:`~anylogits.core.pending.PendingLogits`: the processors then
                :meth:`prepare` before they are waited for.
            token_ids: right-aligned ``(B, L)`` history including the prompt, or a function
                building it (called only if a processor or the tracker needs it).
            lengths: ``(B,)`` real tokens per row, when rows are shorter than ``L``.
            out: for callers that keep their logits: a tensor shaped like ``logits`` that
                does not overlap them. ``logits`` are then left untouched and the first
                processor writes its result to ``out`` (see
                :meth:`~anylogits.core.fast_paths.FastPaths.process_into`).
        """
        if isinstance(logits, PendingLogits):
            batch = self._batch(logits.rows, logits.device, token_ids, lengths)
            self.prepare(batch)
            logits = logits.wait()
            self.check_logits(logits)
            if logits.shape[0] != batch.size:
                raise ValueError(
                    f"the pending logits have {logits.shape[0]} rows, not the {batch.size} "
                    "they were announced with"
                )
        else:
            self.check_logits(logits)
            batch = self._batch(logits.shape[0], logits.device, token_ids, lengths)
        result = self._run(logits, batch, out, compact=False)
        return result  # type: ignore[return-value]  # compact=False: never Candidates

    def prepare(self, batch: Batch) -> None:
        """Each processor's work for ``batch`` that needs no logits
        (:meth:`~anylogits.core.fast_paths.FastPaths.prepare`), before an :meth:`apply`
        of the same ``batch`` in this thread: for engines that compute their logits
        asynchronously."""
        for processor in self.processors:
            fast_paths.prepare(processor, batch)

    def apply(
        self, logits: torch.Tensor, batch: Batch, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run the processors on ``logits`` for rows an adapter already described.

        For engines that know which sequence each row is (slots): they build the
        :class:`Batch`, states included, instead of letting the tracker infer it.
        ``out``: as in :meth:`__call__`.

        Where a truncation returns
        :meth:`~anylogits.core.fast_paths.FastPaths.candidates` and row-local processors
        follow it, those run on the ``(B, K)`` candidates and the rows are written once
        (see :func:`run_on_candidates`).
        """
        result = self._run(logits, batch, out, compact=False)
        assert isinstance(result, torch.Tensor)
        return result

    def compact(
        self,
        logits: torch.Tensor,
        token_ids: TokenSource | None = None,
        *,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor | Candidates:
        """:meth:`__call__`, except that when the last processors ran on a truncation's
        candidates, those :class:`~anylogits.core.fast_paths.Candidates` are returned
        unwritten (``candidates.write(logits)`` gives ``__call__``'s result): for engines
        that keep a list of candidate tokens of their own (llama.cpp), which then need
        neither the full rows written nor scanned for the tokens left. ``logits`` may
        have been edited in place by the processors before that run."""
        self.check_logits(logits)
        batch = self._batch(logits.shape[0], logits.device, token_ids, lengths)
        return self._run(logits, batch, None, compact=True)

    def _run(
        self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None, *, compact: bool
    ) -> torch.Tensor | Candidates:
        processors = self.processors
        if out is not None and not processors:
            return out.copy_(logits)
        if self._kernel_plan is not None and kernels_enabled(logits.device):
            return self._run_planned(logits, batch, out)
        index = 0
        while index < len(processors):
            processor = processors[index]
            end = self._row_local_ends[index]
            if end > index + 1:
                candidates = run_on_candidates(
                    processor, processors[index + 1 : end], logits, batch
                )
                if candidates is not None:
                    if compact and end == len(processors):
                        return candidates
                    logits = candidates.write(logits if out is None else out)
                    index, out = end, None
                    continue
            if out is not None:
                # The first write goes to `out`: the caller's logits stay untouched.
                logits, out = fast_paths.process_into(processor, logits, batch, out), None
                index += 1
                continue
            logits = processor.process(logits, batch)
            index += 1
        return logits

    def _run_planned(
        self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None
    ) -> torch.Tensor:
        """The kernel plan (:mod:`~anylogits.core.launch_plan`): on an accelerator the
        candidates path never runs, so each step runs on the full rows."""
        for step in self._kernel_plan or ():
            if out is not None:
                logits, out = fast_paths.process_into(step, logits, batch, out), None
            else:
                logits = step.process(logits, batch)
        return logits

    @property
    def stateful(self) -> tuple[StatefulLogitsProcessor[Any], ...]:
        """The processors that carry a per-sequence state, in order."""
        return self._stateful

    def _batch(
        self,
        size: int,
        device: torch.device,
        token_ids: TokenSource | None,
        lengths: torch.Tensor | None,
    ) -> Batch:
        if self.tracker is None:
            return Batch(size, token_ids, lengths=lengths, vocab=self.vocab, device=device)
        if token_ids is None:
            raise ValueError(
                "these processors track sequences, so the token history (prompt + "
                "generated ids) must be passed"
            )
        ids = token_ids() if callable(token_ids) else token_ids
        if ids.shape[0] != size:
            raise ValueError(f"token_ids has {ids.shape[0]} rows but logits have {size}")
        nodes = self.tracker.locate(ids, lengths)
        states: dict[int, Sequence[Any]] = {
            key: [node.states[index] for node in nodes]
            for index, key in enumerate(self._state_keys)
        }
        return Batch(
            size,
            ids,
            lengths=lengths,
            prompt_lengths=lambda: torch.tensor([node.prompt_length for node in nodes]),
            states=states,
            vocab=self.vocab,
            device=device,
        )

    def check_logits(self, logits: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``logits`` are ``(B, V)`` floats this vocabulary fits."""
        layout = (logits.dtype, logits.shape[1:])
        if layout in self._checked_layouts:  # checked once per layout: per-token work
            return
        if logits.ndim != 2:
            raise ValueError(f"logits must be (batch, vocab), got shape {tuple(logits.shape)}")
        if logits.dtype not in _FLOAT_DTYPES:
            raise ValueError(
                f"logits dtype {logits.dtype} is not supported; use float32, float16, "
                "bfloat16 or float64"
            )
        if self.vocab is not None:
            self.vocab.check_logits_width(logits.shape[1])
        self._checked_layouts.add(layout)
