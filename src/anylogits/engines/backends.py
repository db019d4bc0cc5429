"""How each backend calls a logits hook, reproduced exactly.

One small class per backend (einops-style): whether it is installed, how to build its
native hook from anylogits processors, how the backend calls that hook, and its engine
side (:meth:`engine`: the tiny model loaded in the real engine, see
:mod:`anylogits.engines.generation`). The conformance suite and the benchmarks both drive
backends through these classes, so a new backend is one class here, one engine class
there, plus one entry in :data:`BACKENDS`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from anylogits.core.processor import LogitsProcessor

if TYPE_CHECKING:
    from anylogits.engines.generation import GenerationEngine


def _vocabulary(tokenizer: Any) -> Any:
    """The vocabulary a backend builds from the model's HF tokenizer (``None``: none)."""
    if tokenizer is None:
        return None
    from anylogits.core.vocab import hf_vocabulary

    return hf_vocabulary(tokenizer)


class TransformersBackend:
    """``generate`` calls ``hook(input_ids (B, L) int64, scores (B, V) float32)``."""

    name = "transformers"
    module = "transformers"
    # generate keeps the logits it passed in (output_logits): the hook must not edit them.
    preserves_logits = True
    max_batch = None
    dtypes = (torch.float32, torch.float16, torch.bfloat16)

    def engine(self, model_dir: Path, scratch: Path) -> GenerationEngine:
        """The tiny model (HF folder ``model_dir``) in transformers' engine;
        ``scratch``: a folder it may write."""
        from anylogits.engines.generation import TransformersEngine

        return TransformersEngine.load(model_dir)

    def hook(self, processors: list[LogitsProcessor], tokenizer: Any = None) -> Any:
        from anylogits.adapters.transformers import for_transformers

        return for_transformers(*processors, tokenizer=tokenizer)

    def native_arguments(self, token_ids: torch.Tensor, logits: torch.Tensor) -> tuple[Any, ...]:
        """What transformers passes: the very tensors."""
        return token_ids, logits

    def invoke(self, hook: Any, arguments: tuple[Any, ...]) -> Any:
        return hook(*arguments)

    def call(self, hook: Any, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Call ``hook`` as transformers does; ``logits`` is the backend's own tensor."""
        return self.invoke(hook, self.native_arguments(token_ids, logits))


class LlamaCppBackend:
    """llama-cpp-python calls ``scores[:] = hook(input_ids, scores)`` from its sampler
    chain: ``input_ids`` 1-D int32, ``scores`` a 1-D float32 strided view into the
    candidate records ``(id, logit, p)``. One sequence per call."""

    name = "llama_cpp"
    module = "llama_cpp"
    preserves_logits = False  # llama.cpp reads the edited candidates back
    max_batch = 1
    dtypes = (torch.float32,)

    def engine(self, model_dir: Path, scratch: Path) -> GenerationEngine:
        """The tiny model (HF folder ``model_dir``) in llama.cpp's engine;
        ``scratch``: a folder it may write."""
        from anylogits.engines.generation import LlamaCppEngine

        return LlamaCppEngine.load(model_dir)

    def hook(self, processors: list[LogitsProcessor], tokenizer: Any = None) -> Any:
        """The hook around a pipeline without a model (``for_llama_cpp`` needs one)."""
        from anylogits.adapters.llama_cpp import HookFailures, LlamaCppLogitsProcessor
        from anylogits.core.pipeline import Pipeline

        return LlamaCppLogitsProcessor(
            Pipeline(processors, _vocabulary(tokenizer)), 0, HookFailures()
        )

    def native_arguments(self, token_ids: torch.Tensor, logits: torch.Tensor) -> tuple[Any, ...]:
        """llama-cpp-python's int32 history and its ``(id, logit, p)`` candidate records."""
        import numpy as np

        if token_ids.shape[0] != 1:
            raise ValueError("llama.cpp hooks see one sequence at a time")
        records = np.recarray(
            shape=(logits.shape[-1],),
            dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True),
        )
        records.id = np.arange(logits.shape[-1])
        records.logit[:] = logits[0].numpy()
        return token_ids[0].numpy().astype(np.intc), records

    def invoke(self, hook: Any, arguments: tuple[Any, ...]) -> Any:
        input_ids, records = arguments
        records.logit[:] = hook(input_ids, records.logit)
        return records

    def call(self, hook: Any, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        records = self.invoke(hook, self.native_arguments(token_ids, logits))
        return torch.from_numpy(records.logit.copy())[None]


class MlxBackend:
    """mlx-lm calls ``logits = processor(tokens, logits)`` with ``tokens`` the 1-D
    history of one sequence (mx.array) and ``logits`` ``(1, V)`` in the model's dtype."""

    name = "mlx"
    module = "mlx_lm"
    preserves_logits = True  # MLX arrays are immutable: a new array comes back
    max_batch = 1
    dtypes = (torch.float32, torch.float16, torch.bfloat16)

    def engine(self, model_dir: Path, scratch: Path) -> GenerationEngine:
        """The tiny model (HF folder ``model_dir``) in mlx-lm's engine;
        ``scratch``: a folder it may write."""
        from anylogits.engines.generation import MlxEngine

        return MlxEngine.load(model_dir)

    def hook(self, processors: list[LogitsProcessor], tokenizer: Any = None) -> Any:
        """The hook around a pipeline without a tokenizer (``for_mlx`` needs one)."""
        from anylogits.adapters.mlx import MlxLogitsProcessor
        from anylogits.core.pipeline import Pipeline

        return MlxLogitsProcessor(Pipeline(processors, _vocabulary(tokenizer)))

    def native_arguments(self, token_ids: torch.Tensor, logits: torch.Tensor) -> tuple[Any, ...]:
        import mlx.core as mx

        if token_ids.shape[0] != 1:
            raise ValueError("mlx-lm calls processors with one sequence at a time")
        tokens = mx.array(token_ids[0].to(torch.int32))
        native = mx.array(logits)
        mx.eval(tokens, native)
        return tokens, native

    def invoke(self, hook: Any, arguments: tuple[Any, ...]) -> Any:
        import mlx.core as mx

        result = hook(*arguments)
        mx.eval(result)
        return result

    def call(self, hook: Any, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return torch.from_dlpack(self.invoke(hook, self.native_arguments(token_ids, logits)))


class _RequestBook:
    """Which request sits in which slot of an engine's batch, so that successive calls of
    the conformance suite become the engine's request bookkeeping: a row that extends a
    known request by one token continues it, any other row is a new request."""

    def __init__(self) -> None:
        self.slots: dict[int, tuple[list[int], list[int]]] = {}  # slot -> (prompt, output)
        self.known: dict[tuple[int, ...], int] = {}  # every sequence seen -> prompt length
        self.last_token_ids: torch.Tensor | None = None

    def request_for(self, row: list[int]) -> tuple[list[int], list[int]]:
        """A new request for ``row``: resumed (prompt + outputs so far, as vLLM re-adds a
        preempted request) when it continues a known sequence, else all prompt."""
        for length in range(len(row) - 1, 0, -1):
            prompt_length = self.known.get(tuple(row[:length]))
            if prompt_length is not None:
                return row[:prompt_length], row[prompt_length:]
        return row, []

    def remember(self) -> None:
        for prompt, output in self.slots.values():
            self.known[tuple(prompt + output)] = len(prompt)

    def claim_parents(self, rows: list[list[int]]) -> list[int | None]:
        """For each row, the slot whose sequence it extends by one token (each slot once)."""
        free = {tuple(p + o): s for s, (p, o) in self.slots.items()}
        parents: list[int | None] = []
        for row in rows:
            parents.append(free.pop(tuple(row[:-1]), None))
        return parents


class _VllmHook(_RequestBook):
    """A vLLM processor instance and the specs every row's request carries."""

    def __init__(self, processor: Any, specs: list[dict[str, Any]]) -> None:
        super().__init__()
        self.processor = processor
        self.specs = specs

    def params(self) -> Any:
        from vllm import SamplingParams

        return SamplingParams(extra_args={"anylogits": self.specs})


class _ContinuousBatchingRequests(_RequestBook):
    """A :class:`~anylogits.adapters.transformers_cb.ContinuousBatchingHook` and the
    transformers request states of its rows."""

    def __init__(self, hook: Any) -> None:
        super().__init__()
        self.hook = hook
        self.states: dict[int, Any] = {}
        self.next_slot = 0
        self.futures: list[Any] = []

    def step(self, token_ids: torch.Tensor) -> list[Any]:
        """The scheduled requests of a step whose rows are ``token_ids``, as transformers'
        scheduler hands them over: one ``FutureRequestState`` per row that samples."""
        from transformers.generation.continuous_batching.requests import (
            FutureRequestState,
            RequestState,
            RequestStatus,
        )

        if self.last_token_ids is token_ids:
            return self.futures
        rows = token_ids.tolist()
        parents = self.claim_parents(rows)
        futures, used = [], set()
        for row, slot in zip(rows, parents, strict=True):
            if slot is None:
                slot, self.next_slot = self.next_slot, self.next_slot + 1
                prompt, output = self.slots[slot] = self.request_for(row)
                state = RequestState(request_id=f"req_{slot}", initial_tokens=prompt)
                state.generated_tokens = output  # the same list: the book appends to it
                state.status = RequestStatus.DECODING
                self.states[slot] = state
            else:
                self.slots[slot][1].append(row[-1])
            used.add(slot)
            futures.append(FutureRequestState(self.states[slot], True, {}, 1))
        for slot in set(self.slots) - used:  # requests that ended
            self.states.pop(slot).status = RequestStatus.FINISHED
            del self.slots[slot]
        self.remember()
        self.last_token_ids, self.futures = token_ids, futures
        return futures


class VllmBackend:
    """vLLM's V1 model runner: a persistent batch whose row ``i`` is slot ``i``. Before
    each step the engine reports requests removed, added (with their live output-id
    list) and moved through a ``BatchUpdate``, then calls ``apply(logits (B, V))`` with
    float32 logits it lets processors edit in place.

    Successive calls of the conformance suite become engine bookkeeping: a row that
    extends a known request by one token appends to its output list (moving it to the
    row's slot, by swaps and one-way moves that overwrite unreported slots), any other
    row is a new request whose prompt is the whole row.
    """

    name = "vllm"
    module = "vllm"
    preserves_logits = False
    max_batch = None
    dtypes = (torch.float32,)  # both runners cast logits to float32 before processors

    def engine(self, model_dir: Path, scratch: Path) -> GenerationEngine:
        """The tiny model (HF folder ``model_dir``) in vLLM's engine;
        ``scratch``: a folder it may write."""
        from anylogits.engines.generation import VllmEngine

        return VllmEngine.load(model_dir, scratch)

    def hook(self, processors: list[LogitsProcessor], tokenizer: Any = None) -> Any:
        from vllm.config import VllmConfig

        from anylogits.adapters.vllm import AnyLogitsV1Runner
        from anylogits.core.specs import to_specs

        processor = AnyLogitsV1Runner(VllmConfig(), torch.device("cpu"), False)
        if tokenizer is not None:
            # The engine reads its tokenizer from the model config, which a hook-level
            # test has none of: give the requests the vocabulary the engine would build.
            from anylogits.adapters.vllm_requests import VllmRequests

            vocab = _vocabulary(tokenizer)
            processor.requests = VllmRequests(lambda: vocab)
        return _VllmHook(processor, to_specs(processors))

    def batch_update(self, hook: _VllmHook, token_ids: torch.Tensor) -> Any:
        """The ``BatchUpdate`` that turns the previous call's batch into ``token_ids``."""
        from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

        rows = token_ids.tolist()
        size = len(rows)
        parents = hook.claim_parents(rows)
        kept = {slot for slot in parents if slot is not None}
        for row, slot in zip(rows, parents, strict=True):
            if slot is not None:
                hook.slots[slot][1].append(row[-1])  # the engine's live output list
        # Slots a one-way move will overwrite need not be reported removed.
        removed = [s for s in hook.slots if s not in kept and s >= size]
        for slot in removed:
            del hook.slots[slot]
        added = []
        where: dict[int, int] = {}  # target row -> current slot of its request
        spare = max([size, *hook.slots]) + 1
        for row_index, (row, slot) in enumerate(zip(rows, parents, strict=True)):
            if slot is None:
                slot, spare = spare, spare + 1
                hook.slots[slot] = hook.request_for(row)
                added.append((slot, hook.params(), *hook.slots[slot]))
            where[row_index] = slot
        occupant = {slot: target for target, slot in where.items()}
        moved = []
        for target in range(size):
            current = where[target]
            if current == target:
                continue
            displaced = occupant.get(target)
            if displaced is None:
                moved.append((current, target, MoveDirectionality.UNIDIRECTIONAL))
                hook.slots[target] = hook.slots.pop(current)
                occupant.pop(current)
            else:
                moved.append((current, target, MoveDirectionality.SWAP))
                hook.slots[target], hook.slots[current] = hook.slots[current], hook.slots[target]
                where[displaced] = current
                occupant[current] = displaced
            occupant[target] = target
            where[target] = target
        hook.remember()
        return BatchUpdate(batch_size=size, removed=removed, added=added, moved=moved)

    def native_arguments(self, token_ids: torch.Tensor, logits: torch.Tensor) -> tuple[Any, ...]:
        """What ``apply`` gets: the logits (the history reaches vLLM processors through
        ``BatchUpdate``, see :meth:`invoke`)."""
        return token_ids, logits

    def invoke(self, hook: _VllmHook, arguments: tuple[Any, ...]) -> Any:
        token_ids, logits = arguments
        if hook.last_token_ids is token_ids:
            # The same batch again: vLLM's steady state, no BatchUpdate.
            hook.processor.update_state(None)
        else:
            hook.processor.update_state(self.batch_update(hook, token_ids))
            hook.last_token_ids = token_ids
        return hook.processor.apply(logits)

    def call(self, hook: _VllmHook, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return self.invoke(hook, self.native_arguments(token_ids, logits))


class TransformersCBBackend:
    """transformers' continuous batching: before each step its per-request processors get
    the scheduled requests that sample a token (their states: id, prompt, generated
    tokens), in row order, then ``processor(scores (B, V) float32, argument row)``. Rows
    are requests, not sequences: successive calls of the suite become requests that
    continue, start (a fork is a new request with the history so far) or finish."""

    name = "transformers_cb"
    module = "transformers"
    preserves_logits = False  # the step samples from the processed scores only
    max_batch = None
    dtypes = (torch.float32,)  # the step casts logits to float32 before processors

    def engine(self, model_dir: Path, scratch: Path) -> GenerationEngine:
        """The tiny model (HF folder ``model_dir``) in transformers' continuous batching;
        ``scratch``: unused."""
        from anylogits.engines.continuous_batching import TransformersCBEngine

        return TransformersCBEngine.load(model_dir)

    def hook(self, processors: list[LogitsProcessor], tokenizer: Any = None) -> Any:
        from anylogits.adapters.transformers_cb import ContinuousBatchingHook
        from anylogits.core.pipeline import Pipeline

        vocab = _vocabulary(tokenizer)
        return _ContinuousBatchingRequests(
            ContinuousBatchingHook(Pipeline(processors, vocab), vocab)
        )

    def native_arguments(self, token_ids: torch.Tensor, logits: torch.Tensor) -> tuple[Any, ...]:
        """The step's scores (the rows' histories reach the hook as request states, see
        :meth:`invoke`)."""
        return token_ids, logits

    def invoke(self, hook: _ContinuousBatchingRequests, arguments: tuple[Any, ...]) -> Any:
        token_ids, logits = arguments
        argument_row = hook.hook.prepare_tensor_args(hook.step(token_ids))
        return hook.hook(logits, argument_row)

    def call(self, hook: Any, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return self.invoke(hook, self.native_arguments(token_ids, logits))


BACKENDS: dict[str, Any] = {
    backend.name: backend
    for backend in (
        TransformersBackend(),
        TransformersCBBackend(),
        LlamaCppBackend(),
        MlxBackend(),
        VllmBackend(),
    )
}


def installed(name: str) -> bool:
    """Whether backend ``name``'s library can be imported here."""
    return importlib.util.find_spec(BACKENDS[name].module) is not None
