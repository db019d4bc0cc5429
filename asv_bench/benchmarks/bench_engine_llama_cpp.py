"""Issue 17, end to end on llama.cpp: per-token generation time with anylogits processors
against llama.cpp's own sampler parameters doing the same job.

llama-cpp-python (``Llama.generate``), one thread, 64 new tokens per run from the same
prompt, sampled (not greedy). Models (:data:`common.MODELS`):

- ``tiny``: the tiny model's GGUF (random weights, the real 128k llama-bpe vocabulary),
  from :data:`PROMPT`;
- ``real``: SmolLM2-135M-Instruct as users run it in llama.cpp, the original Q4_1 GGUF
  (:func:`anylogits.engines.real_model.real_model_q4_gguf`, 49,152 tokens; not the
  float32 copy the conformance suite compares engines with), from
  :data:`common.CHAT_MESSAGE` in its chat template.

Ours: ``for_llama_cpp(*processors)`` with every llama.cpp truncation, temperature and
penalty switched off (``top_k=0``, ``top_p=1.0``, ``min_p=0.0``, ``typical_p=1.0``,
``temp=1.0``, ``repeat_penalty=1.0`` are llama.cpp's "off" values), so llama.cpp only
draws from our logits. Native: the same job as ``Llama.generate`` parameters. Runs of
both sides are interleaved in one process. ``Llama.generate`` does not stop at the
end-of-text token: every run makes 64 tokens.

Jobs: ``chain`` (:data:`anylogits.engines.native.CHAIN`) and ``repetition`` (RepetitionPenalty 1.3
alone against llama.cpp's ``repeat_penalty=1.3``, no truncation on either side).
llama.cpp penalizes the last 64 tokens (``last_n_tokens_size``), ours the whole history:
at 64 new tokens after a short prompt that is about the same set.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from anylogits.engines.native import ENGINE_JOBS, llama_cpp_parameters

from . import common

NEW_TOKENS = 64
PROMPT = "Once upon a time, in a land far away, there lived"


def _load(model: str) -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise NotImplementedError("llama-cpp-python is not installed") from None
    if model == "tiny":
        from anylogits.testing.tiny_model import build_tiny_gguf

        path = build_tiny_gguf()
    else:
        from anylogits.engines.real_model import real_model_q4_gguf

        path = real_model_q4_gguf()
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=512,
        n_threads=1,
        n_threads_batch=1,
        seed=0,
        verbose=False,
    )


class EngineVsNativeLlamaCpp:
    """Per-token generation time, anylogits processors / llama.cpp's native parameters."""

    params = (common.MODELS, list(ENGINE_JOBS))
    param_names = ["model", "job"]
    timeout = 600

    def setup(self, model: str, job: str) -> None:
        from anylogits import for_llama_cpp

        self.llm = _load(model)
        if model == "tiny":
            self.prompt = self.llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
        else:  # the chat template's ids, as transformers' tokenizer writes them
            self.prompt = common.chat_ids(common.model_folder(model))
        processors, arguments = ENGINE_JOBS[job]
        native = llama_cpp_parameters(arguments, sample=True)
        ours = llama_cpp_parameters({}, sample=True)  # llama.cpp's sampling switched off

        def run_ours(hook: Any) -> None:
            self._generate(logits_processor=hook, **ours)

        def run_native(_: None) -> None:
            self._generate(**native)

        def fresh_hook() -> Any:
            return for_llama_cpp(*processors(), model=self.llm)

        ours_seconds, native_seconds = common.best_times(
            (run_ours, fresh_hook), (run_native, lambda: None), repeat=5, max_number=3
        )
        self.ours_ms = ours_seconds * 1e3 / NEW_TOKENS
        self.native_ms = native_seconds * 1e3 / NEW_TOKENS

    def _generate(self, **options: Any) -> None:
        self.llm.set_seed(0)
        tokens = list(islice(self.llm.generate(self.prompt, **options), NEW_TOKENS))
        assert len(tokens) == NEW_TOKENS

    def track_ours_over_native(self, model: str, job: str) -> float:
        return self.ours_ms / self.native_ms

    track_ours_over_native.unit = "ratio"

    def track_native_ms_per_token(self, model: str, job: str) -> float:
        return self.native_ms

    track_native_ms_per_token.unit = "ms"

    def track_ours_ms_per_token(self, model: str, job: str) -> float:
        return self.ours_ms

    track_ours_ms_per_token.unit = "ms"
