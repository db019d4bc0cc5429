"""vLLM's requests as a persistent batch, without vLLM; the wire format they arrive in is
:mod:`anylogits.core.wire`. The V1 model runner hands each request's *live* list of
generated ids to the processor; it may shrink (tokens discarded after a KV-load failure)
or end in ``-1`` placeholders (tokens still being sampled asynchronously).
:class:`VllmRequests` reads both into the neutral
:class:`~anylogits.core.persistent_batch.PersistentBatch`.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from typing import Any

from anylogits.core.persistent_batch import PersistentBatch
from anylogits.core.specs import parse_specs
from anylogits.core.vocab import Vocabulary
from anylogits.core.wire import SPEC_FIELD, SPEC_KEY


class PrefetchedVocabulary:
    """The engine's vocabulary, built in a background thread from engine start, so that
    the first request with processors does not hold the engine while the tokenizer is
    loaded and read (~1-4 s at 128k tokens). Calling it waits for that build; a failed
    build raises there, and the next call builds again.

    Args:
        build: builds the vocabulary (``None`` when the engine has no tokenizer).
    """

    def __init__(self, build: Callable[[], Vocabulary | None]) -> None:
        self._build = build
        self._future: concurrent.futures.Future[Vocabulary | None] | None = (
            concurrent.futures.Future()
        )
        threading.Thread(target=self._run, name="anylogits-vocabulary", daemon=True).start()

    def _run(self) -> None:
        future = self._future
        assert future is not None
        try:
            future.set_result(self._build())
        except Exception as error:
            future.set_exception(error)

    def __call__(self) -> Vocabulary | None:
        future, self._future = self._future, None
        return future.result() if future is not None else self._build()


class LiveOutputList:
    """Reads the tokens vLLM's V1 model runner appends to a request's output list."""

    __slots__ = ("output", "read_count")

    def __init__(self, output: Sequence[int]) -> None:
        self.output = output
        self.read_count = 0

    def read(self) -> tuple[bool, list[int]]:
        restart = len(self.output) < self.read_count
        if restart:  # vLLM discarded outputs (a KV-load failure): replay from the prompt
            self.read_count = 0
        new = list(self.output[self.read_count :])
        if new and min(new) < 0:
            # Placeholders (-1) of tokens still being sampled asynchronously.
            new = new[: next(i for i, t in enumerate(new) if t < 0)]
        self.read_count += len(new)
        return restart, new


class VllmRequests(PersistentBatch):
    """The requests of one vLLM engine by slot, added as vLLM's model runners add them.

    Example:
        >>> import torch
        >>> from anylogits import LogitBias, to_specs
        >>> requests = VllmRequests()
        >>> extra_args = {"anylogits": to_specs([LogitBias({2: -5.0})])}
        >>> requests.add(1, extra_args, prompt_ids=[0, 1], output_ids=[])
        True
        >>> requests.process(torch.zeros(3, 4))
        tensor([[ 0.,  0.,  0.,  0.],
                [ 0.,  0., -5.,  0.],
                [ 0.,  0.,  0.,  0.]])
    """

    def add(
        self,
        slot: int,
        extra_args: dict[str, Any] | None,
        *,
        prompt_ids: Sequence[int] | None = None,
        prompt_length: int | None = None,
        output_ids: Sequence[int] | None = None,
    ) -> bool:
        """Put a request in ``slot``; see :meth:`PersistentBatch.put`.

        Args:
            slot: the runner's row index for the request.
            extra_args: the request's ``SamplingParams.extra_args``; its specs sit under
                :data:`SPEC_KEY`. Without them the slot has no processors.
            prompt_ids: the prompt; ``None`` with the V2 runner, which supplies committed
                tokens at each call instead.
            prompt_length: the prompt length when ``prompt_ids`` is ``None``.
            output_ids: the V1 runner's *live* list of generated ids.
        """
        raw = (extra_args or {}).get(SPEC_KEY)
        specs, failure = None, None
        try:
            specs = parse_specs(raw, SPEC_FIELD) if raw is not None else None
        except ValueError as error:  # normally refused where vLLM validates requests
            failure = str(error)
        return self.put(
            slot,
            specs,
            failure=failure,
            prompt_ids=prompt_ids,
            prompt_length=prompt_length,
            output=LiveOutputList(output_ids) if output_ids is not None else None,
        )
