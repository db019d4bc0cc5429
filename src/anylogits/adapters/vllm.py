"""vLLM adapter: one batch-level processor class per model runner, specs per request.

vLLM builds logits processors itself, from classes registered when the engine starts
(``LLM(model, logits_processors=[AnyLogits])`` or ``--logits-processors
anylogits.adapters.vllm:AnyLogits`` for the server), never through the
``vllm.logits_processors`` entry point: a V1-interface class found there breaks every
engine that runs the V2 model runner. Each request names its processors as specs in
``SamplingParams.extra_args["anylogits"]`` (:func:`for_vllm`) or, over the
OpenAI-compatible server, ``extra_body={"vllm_xargs": anylogits.vllm_xargs(...)}``.

"V1" and "V2" below name vLLM's two *model runners* (both in its V1 engine):

- :class:`AnyLogitsV1Runner`: the V1 model runner (CPU, and CUDA with
  ``VLLM_USE_V2_MODEL_RUNNER=0``). vLLM refuses custom processors there when
  speculative decoding is on.
- :class:`AnyLogitsV2Runner`: the V2 model runner (the CUDA default). Rows are not
  requests (speculative decoding gives a request one row per draft position), so rows are
  mapped to requests through ``LogitsContext.expanded_idx_mapping``.
- :class:`AnyLogits`: both at once, for when the runner is vLLM's choice;
  :func:`vllm_processor_class` picks the one class for a given engine config.

The wire format (``extra_args``, ``vllm_xargs``) is :mod:`anylogits.core.wire`, shared by
every server; vLLM's live output lists are read in :mod:`anylogits.adapters.vllm_requests`,
the processing is the neutral :class:`anylogits.core.persistent_batch.PersistentBatch`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor

from anylogits.adapters.vllm_requests import PrefetchedVocabulary, VllmRequests
from anylogits.core.device_history import CommittedReads, SlotHistory
from anylogits.core.limits import limits
from anylogits.core.logs import configure_logging
from anylogits.core.registry import load_plugins
from anylogits.core.specs import build_specs
from anylogits.core.vocab import Vocabulary, hf_vocabulary
from anylogits.core.wire import (
    SPEC_FIELD,
    SPEC_KEY,
    processor_specs,
    request_specs,
    validate_request,
)
from anylogits.processors.structured.warm import llguidance_installed, prepare_structured
from anylogits.serving import REQUEST_FIELD, log_refusal

try:  # the V2 runner's interface (vLLM >= 0.32)
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor
except ImportError:  # pragma: no cover - older vLLM
    V2LogitsProcessor = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from vllm.config import VllmConfig

SPECULATIVE_DECODING_V1 = (
    "vLLM's V1 model runner does not run custom logits processors when speculative "
    "decoding is on; use the V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1, CUDA) or "
    "turn speculative decoding off"
)


def engine_vocabulary(vllm_config: VllmConfig) -> Vocabulary | None:
    """The vocabulary of the engine's tokenizer (``None`` with ``skip_tokenizer_init``)."""
    model_config = vllm_config.model_config
    if model_config is None or model_config.skip_tokenizer_init:
        return None
    from vllm.tokenizers import cached_tokenizer_from_config

    tokenizer = cached_tokenizer_from_config(model_config)
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    # vLLM also stops on the generation config's EOS ids (Llama 3 has several).
    generation_eos = model_config.try_get_generation_config().get("eos_token_id")
    if isinstance(generation_eos, int):
        eos.add(generation_eos)
    elif generation_eos:
        eos.update(generation_eos)
    return hf_vocabulary(tokenizer, eos_token_ids=sorted(eos))


_STRUCTURED_AVAILABLE = llguidance_installed()


def _prepared_vocabulary(vllm_config: VllmConfig) -> Vocabulary | None:
    """The engine's vocabulary, with what the first structured request would otherwise
    build inside an engine step (llguidance's tokenizer for the vocabulary, the grammar
    checking process) built too; runs in the background thread of
    :class:`~anylogits.adapters.vllm_requests.PrefetchedVocabulary`."""
    vocab = engine_vocabulary(vllm_config)
    if vocab is not None:
        prepare_structured(vocab)
    return vocab


# Engines whose processor runs in this process: only they can run from_transformers
# objects, which exist in this process alone.
_ENGINES_HERE = 0


def _start_engine(vllm_config: VllmConfig) -> VllmRequests:
    """What every runner's processor does at engine start: a bad ``ANYLOGITS_LIMITS`` or
    plugin stops the engine here, not every request; the vocabulary starts building."""
    global _ENGINES_HERE
    configure_logging()
    limits()
    load_plugins()
    _ENGINES_HERE += 1
    return VllmRequests(PrefetchedVocabulary(lambda: _prepared_vocabulary(vllm_config)))


def _validate(sampling_params: SamplingParams) -> None:
    configure_logging()  # the API server's process: its refusals are logged there
    if _STRUCTURED_AVAILABLE:
        # The frontend's grammar checker starts with its first request, of any kind.
        from anylogits.processors.structured.guard import GUARD

        GUARD.warm_in_background()
    try:
        validate_request(sampling_params.extra_args, engine_in_this_process=_ENGINES_HERE > 0)
    except ValueError as error:
        # vLLM's access log shows the 400 only; the route is not known here.
        log_refusal("a request", str(error), {REQUEST_FIELD: sampling_params.extra_args})
        raise


class AnyLogitsV1Runner(V1LogitsProcessor):
    """Every request's anylogits processors, for vLLM's V1 model runner.

    Register the class (``LLM(model, logits_processors=[AnyLogitsV1Runner])``); vLLM
    builds one instance per engine and tells it about requests through ``BatchUpdate``. Requests
    carry their specs in ``extra_args["anylogits"]`` (see :func:`for_vllm`).
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        _validate(sampling_params)

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        self.requests = _start_engine(vllm_config)

    def is_argmax_invariant(self) -> bool:
        # Requests may carry biases and penalties, which move the argmax.
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        requests = self.requests
        for index in batch_update.removed:
            requests.remove(index)
        for index, params, prompt_ids, output_ids in batch_update.added:
            requests.add(
                index, params.extra_args, prompt_ids=prompt_ids or [], output_ids=output_ids
            )
        for source, target, direction in batch_update.moved:
            if direction == MoveDirectionality.SWAP:
                requests.swap(source, target)
            else:
                requests.move(source, target)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return self.requests.process(logits)


class AnyLogitsV1RunnerArgmaxInvariant(AnyLogitsV1Runner):
    """:class:`AnyLogitsV1Runner` restricted to processors that never change the argmax.

    vLLM skips such processors when every request of a step is greedy and runs them after
    its own temperature, like its built-in min-p. Requests that name any other processor
    are rejected.
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        specs: list[dict[str, Any]] = request_specs(sampling_params.extra_args) or []
        for index, processor in enumerate(build_specs(specs)):
            if not processor.argmax_invariant:
                raise ValueError(
                    f"{SPEC_FIELD}[{index}] is {type(processor).__name__}, which can change "
                    f"the argmax; {cls.__name__} only runs processors that cannot "
                    "(register AnyLogitsV1Runner for the others)"
                )

    def is_argmax_invariant(self) -> bool:
        return True


if V2LogitsProcessor is not None:

    class AnyLogitsV2Runner(V2LogitsProcessor):
        """Every request's anylogits processors, for vLLM's V2 model runner.

        Requests live in slots. Processors that read token histories read them where
        the runner keeps them, on the device (``all_token_ids``, this step's draft
        tokens in ``input_ids``, lengths ``pos + 1``): nothing comes back to the host.
        Only requests whose processors keep states on the host (grammars, stateful
        processors) read their new committed tokens, once per step; rows of draft
        positions see the committed sequence plus their draft tokens (states advance
        through the drafts without being committed, so rejected drafts cost nothing to
        undo).
        """

        @classmethod
        def validate_params(cls, sampling_params: SamplingParams) -> None:
            _validate(sampling_params)

        def __init__(self, vllm_config: VllmConfig, req_states: LogitsProcRequestState):
            self.req_states = req_states
            self.requests = _start_engine(vllm_config)
            # vLLM's StagedWriteTensor keeps its .gpu; read it at each use all the same.
            self.committed_reads = CommittedReads(
                lambda: req_states.all_token_ids.gpu, lambda: req_states.total_len.gpu
            )

        def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
            states = self.req_states
            wanted = self.requests.add(
                req_idx,
                sampling_params.extra_args,
                prompt_length=int(states.prompt_len.np[req_idx]),
            )
            if wanted:
                # The prompt, and the outputs of a resumed request: committed now.
                self.committed_reads.admit(req_idx, int(states.prefill_len.np[req_idx]))
            else:
                self.committed_reads.forget(req_idx)
            return wanted

        def apply_staged_writes(self) -> None:
            # Before the forward: the copy of the committed tokens host states need runs
            # ahead of it, and apply() waits for the copy, not for the forward.
            self.committed_reads.start(self.requests.host_state_lengths())

        def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
            requests = self.requests
            request_slots = ctx.idx_mapping_np.tolist()  # on the host: free
            if not any(slot in requests for slot in request_slots):
                return logits
            slots = request_slots
            bounds = ctx.seq_lens_upper_bound_np.tolist()
            draft_rows = logits.shape[0] - len(slots)
            history = SlotHistory(
                self.req_states.all_token_ids.gpu,
                row_slots=ctx.expanded_idx_mapping,
                row_offsets=ctx.expanded_local_pos,
                row_inputs=ctx.input_ids,
                row_positions=ctx.pos,
                # Every row sees at most this many tokens (drafts included).
                width=max(bounds, default=0) + draft_rows,
            )
            drafts = None
            if draft_rows:
                # Speculative decoding: a request owns one row per draft position, and
                # which row is whose is on the device only (LogitsContext has no host
                # copy of expanded_idx_mapping): one read per step, budgeted.
                layout = torch.stack(
                    [
                        ctx.expanded_idx_mapping.to(torch.int64),
                        ctx.expanded_local_pos.to(torch.int64),
                        ctx.input_ids.to(torch.int64),
                    ]
                ).tolist()
                slots, offsets, inputs = layout
                drafts = [_drafts_of(inputs, row, p) for row, p in enumerate(offsets)]
            try:
                return requests.process(
                    logits,
                    slots,
                    drafts=drafts,
                    committed=self.committed_reads.read,
                    device_history=history,
                )
            finally:
                self.committed_reads.grow(request_slots, bounds)

    def _drafts_of(inputs: list[int], row: int, offset: int) -> list[int]:
        """The draft tokens row ``row`` scores after: the inputs of its request's rows at
        offsets 1..``offset``; none for a placeholder (vLLM's -1 for the drafts of a
        request in prefill: the row is rejected, and a state never sees the -1)."""
        drafts = inputs[row - offset + 1 : row + 1]
        return [] if any(token < 0 for token in drafts) else drafts

    class AnyLogits(AnyLogitsV1Runner, AnyLogitsV2Runner):
        """Works under either model runner: register this one when vLLM picks the runner.

        vLLM constructs it with the V1 runner's ``(vllm_config, device, is_pin_memory)``
        or the V2 runner's ``(vllm_config, req_states)`` and calls the matching methods;
        the V2 runner is recognized by its request-state table.
        """

        def __init__(
            self,
            vllm_config: VllmConfig,
            device_or_req_states: torch.device | LogitsProcRequestState,
            is_pin_memory: bool = False,
        ) -> None:
            if isinstance(device_or_req_states, LogitsProcRequestState):
                AnyLogitsV2Runner.__init__(self, vllm_config, device_or_req_states)
            else:
                AnyLogitsV1Runner.__init__(self, vllm_config, device_or_req_states, is_pin_memory)

        def apply(self, logits: torch.Tensor, ctx: LogitsContext | None = None) -> torch.Tensor:
            if ctx is None:
                return AnyLogitsV1Runner.apply(self, logits)
            return AnyLogitsV2Runner.apply(self, logits, ctx)

else:  # pragma: no cover - older vLLM
    AnyLogitsV2Runner = None  # type: ignore[assignment,misc]
    AnyLogits = AnyLogitsV1Runner  # type: ignore[assignment,misc]


def uses_v2_model_runner(vllm_config: VllmConfig | None = None) -> bool:
    """Whether an engine will run the V2 model runner.

    Exact with the engine's ``vllm_config``; otherwise follows vLLM's rule without the
    model: ``VLLM_USE_V2_MODEL_RUNNER`` when set, else V2 where Triton runs (CUDA).
    """
    if vllm_config is not None:
        return bool(vllm_config.use_v2_model_runner)
    setting = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if setting is not None:
        return setting.strip().lower() in ("1", "true")
    from vllm.triton_utils import HAS_TRITON

    return bool(HAS_TRITON) and torch.cuda.is_available()


def vllm_processor_class(
    vllm_config: VllmConfig | None = None,
    *,
    speculative: bool | None = None,
    argmax_invariant: bool = False,
) -> type:
    """The processor class to register for the engine's model runner.

    Args:
        vllm_config: the engine's config, for an exact runner choice (see
            :func:`uses_v2_model_runner`).
        speculative: whether speculative decoding will be on (read from ``vllm_config``
            when not given).
        argmax_invariant: the V1 class that only accepts processors which never change
            the argmax (vLLM then skips it for all-greedy batches).

    Raises ``ValueError`` when the V1 runner would run with speculative decoding, which
    vLLM refuses for custom processors.
    """
    if speculative is None:
        speculative = vllm_config is not None and vllm_config.speculative_config is not None
    if uses_v2_model_runner(vllm_config):
        if AnyLogitsV2Runner is None:  # pragma: no cover - older vLLM
            raise ValueError("this vLLM has no V2 model runner logits-processor interface")
        return AnyLogitsV2Runner
    if speculative:
        raise ValueError(SPECULATIVE_DECODING_V1)
    return AnyLogitsV1RunnerArgmaxInvariant if argmax_invariant else AnyLogitsV1Runner


def for_vllm(*processors: Any, **sampling_kwargs: Any) -> SamplingParams:
    """``vllm.SamplingParams`` whose request runs ``processors`` (register :class:`AnyLogits`).

    Args:
        processors: anylogits processors (or pipelines), applied in order.
        sampling_kwargs: any other ``SamplingParams`` argument (``max_tokens``,
            ``temperature``, ``extra_args`` ...).

    The specs are checked to be plain JSON here, before they reach the engine (a non-JSON
    value in ``extra_args`` hangs vLLM's engine).
    """
    extra_args = dict(sampling_kwargs.pop("extra_args", None) or {})
    if SPEC_KEY in extra_args:
        raise ValueError(
            f"extra_args already has an {SPEC_KEY!r} entry; pass the processors to for_vllm instead"
        )
    extra_args[SPEC_KEY] = processor_specs(*processors)
    request_specs(extra_args)
    return SamplingParams(**sampling_kwargs, extra_args=extra_args)
