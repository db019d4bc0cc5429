"""How each backend calls a logits hook, reproduced exactly.

One small class per backend (einops-style): whether it is installed, how to build its
native hook from anylogits processors, and how the backend calls that hook. The
conformance suite and the benchmarks both drive backends through these classes, so a
new backend is one class here plus one entry in :data:`BACKENDS`.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from anylogits.core.processor import LogitsProcessor


class TransformersBackend:
    """``generate`` calls ``hook(input_ids (B, L) int64, scores (B, V) float32)``."""

    name = "transformers"
    module = "transformers"
    # generate keeps the logits it passed in (output_logits): the hook must not edit them.
    preserves_logits = True
    max_batch = None
    dtypes = (torch.float32, torch.float16, torch.bfloat16)

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

    def hook(self, processors: list[LogitsProcessor], tokenizer: Any = None) -> Any:
        """The hook around a pipeline without a model (``for_llama_cpp`` needs one)."""
        from anylogits.adapters.llama_cpp import LlamaCppLogitsProcessor, _Failures
        from anylogits.core.pipeline import Pipeline

        return LlamaCppLogitsProcessor(Pipeline(processors), 0, _Failures())

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

    def hook(self, processors: list[LogitsProcessor], tokenizer: Any = None) -> Any:
        """The hook around a pipeline without a tokenizer (``for_mlx`` needs one)."""
        from anylogits.adapters.mlx import MlxLogitsProcessor
        from anylogits.core.pipeline import Pipeline

        return MlxLogitsProcessor(Pipeline(processors))

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


BACKENDS: dict[str, Any] = {
    backend.name: backend for backend in (TransformersBackend(), LlamaCppBackend(), MlxBackend())
}


def installed(name: str) -> bool:
    """Whether backend ``name``'s library can be imported here."""
    return importlib.util.find_spec(BACKENDS[name].module) is not None
