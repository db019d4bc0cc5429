"""Each catalogue processor beside its native oracles, per backend, on identical input.

``ORACLES[backend](name)`` builds the backend's own implementation as a callable
``(ids, logits) -> logits``, or raises ``NotImplementedError`` (asv: skipped) when the
backend has none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from anylogits import (
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    MinP,
    NoRepeatNGram,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
)

HISTORY = 256
BIAS = {11: 2.0, 22: -1.5, 33: 0.5}
SUPPRESSED = [5, 6, 7, 8]

PROCESSORS: dict[str, Callable[[], LogitsProcessor]] = {
    "temperature": lambda: Temperature(0.7),
    "top_k": lambda: TopK(50),
    "top_p": lambda: TopP(0.9),
    "min_p": lambda: MinP(0.05),
    "repetition_penalty": lambda: RepetitionPenalty(1.3),
    "no_repeat_ngram": lambda: NoRepeatNGram(3),
    "min_new_tokens": lambda: MinNewTokens(5, eos_token_id=2),
    "logit_bias": lambda: LogitBias(BIAS),
    "suppress_tokens": lambda: SuppressTokens(SUPPRESSED),
}

Oracle = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _transformers(name: str) -> Oracle:
    import transformers as t

    factories: dict[str, Callable[[], Any]] = {
        "temperature": lambda: t.TemperatureLogitsWarper(0.7),
        "top_k": lambda: t.TopKLogitsWarper(50),
        "top_p": lambda: t.TopPLogitsWarper(0.9),
        "min_p": lambda: t.MinPLogitsWarper(0.05),
        "repetition_penalty": lambda: t.RepetitionPenaltyLogitsProcessor(1.3),
        "no_repeat_ngram": lambda: t.NoRepeatNGramLogitsProcessor(3),
        "min_new_tokens": lambda: t.MinNewTokensLengthLogitsProcessor(HISTORY - 2, 5, 2),
        "logit_bias": lambda: t.SequenceBiasLogitsProcessor(
            {(token,): bias for token, bias in BIAS.items()}
        ),
        "suppress_tokens": lambda: t.SuppressTokensLogitsProcessor(SUPPRESSED),
    }
    return factories[name]()


def _llama_cpp(name: str) -> Oracle:
    import llama_cpp

    from test_support.native_samplers import LlamaCppSampler

    makers: dict[str, Callable[[int], Any]] = {
        "temperature": lambda vocab: llama_cpp.llama_sampler_init_temp(0.7),
        "top_k": lambda vocab: llama_cpp.llama_sampler_init_top_k(50),
        "top_p": lambda vocab: llama_cpp.llama_sampler_init_top_p(0.9, 1),
        "min_p": lambda vocab: llama_cpp.llama_sampler_init_min_p(0.05, 1),
        "repetition_penalty": lambda vocab: llama_cpp.llama_sampler_init_penalties(
            vocab, HISTORY, 1.3, 0.0, 0.0
        ),
    }
    if name not in makers:
        raise NotImplementedError(f"llama.cpp has no sampler for {name}")
    samplers: dict[int, LlamaCppSampler] = {}

    def apply(ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        vocab = logits.shape[-1]
        if vocab not in samplers:  # penalties remember the history it was given
            samplers[vocab] = LlamaCppSampler(makers[name](vocab), vocab, ids[0].tolist())
        return torch.from_numpy(samplers[vocab](logits[0].numpy()))[None]

    return apply


def _mlx(name: str) -> Oracle:
    import mlx.core as mx
    from mlx_lm import sample_utils as su

    def logprobs(logits: mx.array) -> mx.array:
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    filters: dict[str, Callable[[mx.array, mx.array], mx.array]] = {
        "top_k": lambda ids, logits: su.apply_top_k(logprobs(logits), 50),
        "top_p": lambda ids, logits: su.apply_top_p(logprobs(logits), 0.9),
        "min_p": lambda ids, logits: su.apply_min_p(logprobs(logits), 0.05),
        "temperature": lambda ids, logits: logits * (1 / 0.7),
    }
    if name in ("repetition_penalty", "logit_bias"):
        options = (
            {"repetition_penalty": 1.3, "repetition_context_size": HISTORY}
            if name == "repetition_penalty"
            else {"logit_bias": BIAS}
        )
        (processor,) = su.make_logits_processors(**options)
        filters[name] = processor
    if name not in filters:
        raise NotImplementedError(f"mlx-lm has no native {name}")

    converted: dict[int, Any] = {}

    def native(tensor: torch.Tensor) -> Any:
        # Time mlx-lm's own op, not our torch -> MLX copy of the benchmark's input.
        if id(tensor) not in converted:
            converted.clear()
            converted[id(tensor)] = (tensor, mx.array(tensor))
        return converted[id(tensor)][1]

    def apply(ids: torch.Tensor, logits: torch.Tensor) -> Any:
        result = filters[name](mx.array(ids[0].to(torch.int32)), native(logits))
        mx.eval(result)
        return result

    return apply


def _vllm(name: str) -> Oracle:
    """vLLM's V1 sampler pieces: its batch-level built-in processors (driven through
    ``BatchUpdate`` like the engine does) and the tensor ops its sampler calls."""
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.model_executor.layers.utils import apply_penalties
    from vllm.v1.sample.logits_processor import (
        BatchUpdate,
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
    )
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    builtin: dict[str, tuple[type, Callable[[], Any]]] = {
        "logit_bias": (LogitBiasLogitsProcessor, lambda: SamplingParams(logit_bias=BIAS)),
        "min_p": (MinPLogitsProcessor, lambda: SamplingParams(min_p=0.05)),
        "min_new_tokens": (
            MinTokensLogitsProcessor,
            lambda: SamplingParams(min_tokens=5, stop_token_ids=[2]),
        ),
    }
    if name in builtin:
        cls, params = builtin[name]
        engines: dict[int, Any] = {}

        def apply(ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
            batch = logits.shape[0]
            if batch not in engines:
                processor = cls(VllmConfig(), torch.device("cpu"), False)
                # Two generated tokens each, so min_tokens=5 still holds EOS back.
                added = [
                    (row, params(), ids[row, :-2].tolist(), ids[row, -2:].tolist())
                    for row in range(batch)
                ]
                processor.update_state(BatchUpdate(batch, [], added, []))
                engines[batch] = processor
            engines[batch].update_state(None)
            return engines[batch].apply(logits)

        return apply

    def per_row(value: float, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda logits: torch.full((logits.shape[0],), value, dtype=dtype)

    temperature, top_k, top_p = (
        per_row(0.7, torch.float32),
        per_row(50, torch.int64),
        per_row(0.9, torch.float32),
    )
    ops: dict[str, Oracle] = {
        "temperature": lambda ids, logits: logits.div_(temperature(logits)[:, None]),
        "top_k": lambda ids, logits: apply_top_k_top_p(logits, top_k(logits), None),
        "top_p": lambda ids, logits: apply_top_k_top_p(logits, None, top_p(logits)),
        # vLLM penalizes prompt and output tokens alike; the history is split in two.
        "repetition_penalty": lambda ids, logits: apply_penalties(
            logits,
            ids[:, : HISTORY // 2],
            ids[:, HISTORY // 2 :],
            torch.zeros(logits.shape[0]),
            torch.zeros(logits.shape[0]),
            torch.full((logits.shape[0],), 1.3),
        ),
    }
    if name not in ops:
        raise NotImplementedError(f"vLLM has no native {name}")
    return ops[name]


ORACLES: dict[str, Callable[[str], Oracle]] = {
    "transformers": _transformers,
    "llama_cpp": _llama_cpp,
    "mlx": _mlx,
    "vllm": _vllm,
}
# Oracles that take one row per call: larger batches are skipped.
ONE_ROW_ORACLES = {"llama_cpp", "mlx"}
