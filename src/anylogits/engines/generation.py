"""Each backend's generation side: the tiny model loaded in the real engine, generating
token ids with anylogits processors.

One class per backend behind :class:`GenerationEngine`, built by the backend classes of
:mod:`anylogits.engines.backends` (``backend.engine(model_dir, scratch)``). The
generation-level conformance suite drives every engine through this protocol; what is
specific to one engine (its own APIs, its own failure modes) is reached through the
engine's attributes by that backend's own tests. Backend libraries are imported when an
engine is built, never by this module.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch

from anylogits.core.processor import LogitsProcessor
from anylogits.core.vocab import Vocabulary
from anylogits.engines.native import (
    Job,
    llama_cpp_parameters,
    mlx_parameters,
    samples,
    transformers_parameters,
    vllm_parameters,
)

NEW_TOKENS = 16  # greedy tokens generated unless told otherwise


class Generated(NamedTuple):
    """One generated sequence: its new token ids without the final EOS, and whether it
    ended with EOS (rather than by the token budget)."""

    ids: list[int]
    finished: bool


def generated(ids: list[int], eos_ids: set[int] | frozenset[int]) -> Generated:
    """Cut ``ids`` at the first EOS."""
    for index, token in enumerate(ids):
        if token in eos_ids:
            return Generated(ids[:index], True)
    return Generated(ids, False)


class GenerationEngine(Protocol):
    """The tiny model in one engine."""

    name: str
    vocabulary: Vocabulary  # the engine's own vocabulary (llama.cpp: read from the GGUF)

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids, BOS included."""
        ...

    def greedy(
        self, prompt: list[int], processors: Sequence[LogitsProcessor] = (), n: int = NEW_TOKENS
    ) -> list[int]:
        """Greedy new token ids under ``processors`` (fresh instances: processors hold bound
        state), up to and including the first EOS, at most ``n``."""
        ...

    def sampled(
        self, prompt: list[int], processors: Sequence[LogitsProcessor], n: int, seed: int
    ) -> list[int]:
        """New token ids sampled with ``seed`` from the logits ``processors`` leave (the
        engine's own sampling at temperature 1, no truncation), as :meth:`greedy` cuts them."""
        ...

    def native(self, prompt: list[int], job: Job, n: int, seed: int = 0) -> list[int]:
        """New token ids of ``job`` (:mod:`anylogits.engines.native`) done by the engine's
        own parameters, greedy, or sampled with ``seed`` when the job samples; raises
        ``NoNative`` when the engine has no parameter for one of its arguments."""
        ...

    def structured(
        self, processor: LogitsProcessor, prompts: list[str], sample: bool, n: int, seed: int
    ) -> list[Generated]:
        """One sequence per prompt, all through one hook (or one request spec), greedy or
        sampled at temperature 1 without truncation, at most ``n`` tokens each."""
        ...


class TransformersEngine:
    """``model.generate`` on one unpadded prompt; batches left-padded by hand (the shared
    reference tokenizer has no pad token to change). Inputs go to the model's device:
    ``engine.model.to("cuda")`` runs it there (``anylogits demo --device cuda``)."""

    name = "transformers"

    def __init__(self, model: Any, tokenizer: Any) -> None:
        from anylogits.core.vocab import hf_vocabulary

        self.model = model
        self.tokenizer = tokenizer
        self.vocabulary = hf_vocabulary(tokenizer)

    @classmethod
    def load(cls, model_dir: Path) -> TransformersEngine:
        """The tiny model in float32, the precision every other engine is compared in."""
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return cls(model.eval(), transformers.AutoTokenizer.from_pretrained(model_dir))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def hooks(self, processors: Sequence[LogitsProcessor]) -> Any:
        import transformers

        from anylogits import for_transformers

        return transformers.LogitsProcessorList(
            [for_transformers(*processors, tokenizer=self.tokenizer)] if processors else []
        )

    def greedy(
        self, prompt: list[int], processors: Sequence[LogitsProcessor] = (), n: int = NEW_TOKENS
    ) -> list[int]:
        return self.native_greedy(prompt, self.hooks(processors), n)

    def native_greedy(self, prompt: list[int], hooks: Any, n: int = NEW_TOKENS) -> list[int]:
        """``generate``'s greedy new tokens with ``hooks``, a ``LogitsProcessorList`` (of
        transformers' own processors, or anylogits' hook)."""
        return self.run(prompt, hooks, n, **transformers_parameters({}, sample=False))

    def sampled(
        self, prompt: list[int], processors: Sequence[LogitsProcessor], n: int, seed: int
    ) -> list[int]:
        torch.manual_seed(seed)
        options = transformers_parameters({}, sample=True)
        return self.run(prompt, self.hooks(processors), n, **options)

    def native(self, prompt: list[int], job: Job, n: int, seed: int = 0) -> list[int]:
        torch.manual_seed(seed)
        return self.run(prompt, None, n, **transformers_parameters(job, samples(job)))

    def run(self, prompt: list[int], hooks: Any, n: int, **options: Any) -> list[int]:
        """``generate``'s new tokens of one prompt with ``hooks`` (a
        ``LogitsProcessorList`` or ``None``) and ``options`` (generation arguments)."""
        device = self.model.device
        output = self.model.generate(
            torch.tensor([prompt], device=device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
            max_new_tokens=n,
            logits_processor=hooks,
            pad_token_id=self.tokenizer.eos_token_id,
            **options,
        )
        return output[0, len(prompt) :].tolist()

    def step_by_step(
        self, prompt: list[int], processors: Sequence[LogitsProcessor] = (), n: int = NEW_TOKENS
    ) -> list[int]:
        """Greedy new token ids from a plain loop: the model's last-position logits of the
        whole sequence through ``Pipeline(processors)``, argmax, until EOS or ``n`` tokens.

        Independent of every engine's hook wiring (``generate`` included), so it is the
        reference that the transformers hook is compared with.
        """
        from anylogits import Pipeline

        pipeline = Pipeline(list(processors), self.vocabulary)
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(n):
                history = torch.tensor([ids], device=self.model.device)
                logits = self.model(history).logits[:, -1, :].to(torch.float32)
                token = int(pipeline(logits, history).argmax(-1))
                ids.append(token)
                if token == self.tokenizer.eos_token_id:
                    break
        return ids[len(prompt) :]

    def generate(
        self, prompts: list[str], processor: LogitsProcessor, n: int, **options: Any
    ) -> list[list[int]]:
        """New token ids of each prompt, left-padded into one batch, each row cut after
        its EOS; ``options`` go to ``generate`` (sampling, beams, assisted decoding)."""
        eos = self.tokenizer.eos_token_id
        rows = [self.tokenizer.encode(prompt) for prompt in prompts]
        width = max(map(len, rows))
        device = self.model.device
        input_ids = torch.tensor([[eos] * (width - len(r)) + r for r in rows], device=device)
        attention_mask = torch.tensor(
            [[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device
        )
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=n,
            logits_processor=self.hooks([processor]),
            pad_token_id=eos,
            **options,
        )
        new = output[:, width:].tolist()
        return [row[: row.index(eos) + 1] if eos in row else row for row in new]

    def structured(
        self, processor: LogitsProcessor, prompts: list[str], sample: bool, n: int, seed: int
    ) -> list[Generated]:
        torch.manual_seed(seed)
        sampling = {"do_sample": True, "top_k": 0} if sample else {"do_sample": False}
        outputs = self.generate(prompts, processor, n, **sampling)
        return [generated(ids, {self.tokenizer.eos_token_id}) for ids in outputs]


class LlamaCppEngine:
    """llama-cpp-python's ``Llama`` on the tiny model's GGUF form, one thread, float32 KV
    cache; one sequence at a time."""

    name = "llama_cpp"

    def __init__(self, llm: Any) -> None:
        from anylogits.adapters.llama_cpp import vocabulary_of

        self.llm = llm
        self.vocabulary = vocabulary_of(llm)

    @classmethod
    def load(cls, model_dir: Path) -> LlamaCppEngine:
        import llama_cpp

        from anylogits.testing.tiny_model import GGUF_FILENAME, build_tiny_gguf

        # A prepared folder holds its float32 GGUF (the real model's); the tiny model's is
        # written on first use.
        path = model_dir / GGUF_FILENAME
        llm = llama_cpp.Llama(
            model_path=str(path if path.is_file() else build_tiny_gguf()),
            n_ctx=512,
            n_threads=1,
            seed=0,
            type_k=0,  # GGML_TYPE_F32: an f16 KV cache would drift from transformers
            type_v=0,
            verbose=False,
        )
        return cls(llm)

    def encode(self, text: str) -> list[int]:
        # special: a chat template's markers are its special tokens, as HF tokenizers read them
        return self.llm.tokenize(text.encode(), add_bos=True, special=True)

    def hook(self, *processors: LogitsProcessor) -> Any:
        from anylogits import for_llama_cpp

        return for_llama_cpp(*processors, model=self.llm)

    def generate(
        self, prompt: list[int], hook: Any = None, n: int = NEW_TOKENS, **sampling: Any
    ) -> list[int]:
        """Token ids from llama.cpp's own generate loop (greedy unless ``sampling`` says),
        up to and including the first end-of-generation token."""
        import llama_cpp

        tokens: list[int] = []
        options = {"temp": 0.0, "repeat_penalty": 1.0, **sampling}
        # Evaluate the whole prompt again: generate() would reuse the KV cache of the
        # longest prefix shared with the last run, and a quantized model's logits depend
        # on how its tokens were split into batches (Q4_1: a 0.17 logit swing seen).
        self.llm.reset()
        for token in self.llm.generate(prompt, logits_processor=hook, **options):
            tokens.append(token)
            if len(tokens) == n or llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, token):
                break
        return tokens

    def greedy(
        self, prompt: list[int], processors: Sequence[LogitsProcessor] = (), n: int = NEW_TOKENS
    ) -> list[int]:
        return self.generate(prompt, self.hook(*processors) if processors else None, n)

    def sampled(
        self, prompt: list[int], processors: Sequence[LogitsProcessor], n: int, seed: int
    ) -> list[int]:
        self.llm.set_seed(seed)
        hook = self.hook(*processors) if processors else None
        return self.generate(prompt, hook, n, **llama_cpp_parameters({}, sample=True))

    def native(self, prompt: list[int], job: Job, n: int, seed: int = 0) -> list[int]:
        options = llama_cpp_parameters(job, samples(job))
        self.llm.set_seed(seed)
        return self.generate(prompt, None, n, **options)

    def structured(
        self, processor: LogitsProcessor, prompts: list[str], sample: bool, n: int, seed: int
    ) -> list[Generated]:
        """Row ``i`` sampled with seed ``seed + i``."""
        hook = self.hook(processor)
        sampling = {"temp": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0} if sample else {}
        outputs = []
        for row, text in enumerate(prompts):
            self.llm.set_seed(seed + row)
            tokens = self.generate(self.encode(text), hook, n, **sampling)
            outputs.append(generated(tokens, self.vocabulary.eos_token_ids))
        return outputs


class MlxEngine:
    """mlx-lm on the tiny model's HF folder (which it loads directly): ``generate_step``
    for one sequence, ``batch_generate`` for several."""

    name = "mlx"

    def __init__(self, model: Any, tokenizer: Any) -> None:
        from anylogits.core.vocab import hf_vocabulary

        self.model = model
        self.tokenizer = tokenizer
        self.vocabulary = hf_vocabulary(tokenizer._tokenizer)

    @classmethod
    def load(cls, model_dir: Path) -> MlxEngine:
        import mlx_lm

        return cls(*mlx_lm.load(str(model_dir)))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def hooks(self, *processors: LogitsProcessor) -> Any:
        from anylogits import for_mlx

        return for_mlx(*processors, tokenizer=self.tokenizer)

    @staticmethod
    def steps(
        model: Any,
        prompt: list[int],
        hooks: Any = None,
        n: int = NEW_TOKENS,
        sampler: Any = None,
        stop: Collection[int] = (),
    ) -> list[int]:
        """``n`` tokens of ``generate_step`` on ``model`` (greedy unless ``sampler``), or
        fewer, ending with the first one in ``stop``: ``generate_step`` does not stop at
        EOS by itself (mlx-lm's ``generate`` does)."""
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        tokens: list[int] = []
        steps = generate_step(
            mx.array(prompt), model, max_tokens=n, logits_processors=hooks, sampler=sampler
        )
        for (token, _), _ in zip(steps, range(n), strict=False):
            tokens.append(int(token))
            if tokens[-1] in stop:
                break
        return tokens

    def greedy(
        self, prompt: list[int], processors: Sequence[LogitsProcessor] = (), n: int = NEW_TOKENS
    ) -> list[int]:
        hooks = self.hooks(*processors) if processors else None
        return self.steps(self.model, prompt, hooks, n, stop=self.tokenizer.eos_token_ids)

    def sampled(
        self, prompt: list[int], processors: Sequence[LogitsProcessor], n: int, seed: int
    ) -> list[int]:
        from mlx_lm.sample_utils import make_sampler

        hooks = self.hooks(*processors) if processors else None
        return self._seeded(prompt, hooks, n, make_sampler(**mlx_parameters({}, True)[1]), seed)

    def native(self, prompt: list[int], job: Job, n: int, seed: int = 0) -> list[int]:
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        processors, sampler = mlx_parameters(job, samples(job))
        hooks = make_logits_processors(**processors)
        return self._seeded(prompt, hooks, n, make_sampler(**sampler), seed)

    def _seeded(self, prompt: list[int], hooks: Any, n: int, sampler: Any, seed: int) -> list[int]:
        import mlx.core as mx

        mx.random.seed(seed)
        return self.steps(self.model, prompt, hooks, n, sampler, self.tokenizer.eos_token_ids)

    def structured(
        self, processor: LogitsProcessor, prompts: list[str], sample: bool, n: int, seed: int
    ) -> list[Generated]:
        import mlx.core as mx
        from mlx_lm.generate import batch_generate
        from mlx_lm.sample_utils import make_sampler

        hooks = self.hooks(processor)
        sampler = make_sampler(temp=1.0) if sample else None
        mx.random.seed(seed)
        ids = [self.encode(text) for text in prompts]
        if len(ids) == 1:
            tokens = self.steps(self.model, ids[0], hooks, n, sampler)
            return [generated(tokens, set(self.tokenizer.eos_token_ids))]
        result = batch_generate(
            self.model,
            self.tokenizer,
            ids,
            max_tokens=n,
            return_token_ids=True,
            logits_processors=hooks,
            sampler=sampler,
        )
        # batch_generate leaves out the EOS that finished a sequence.
        return [Generated(list(row), len(row) < n) for row in result.token_ids]


VLLM_MAX_NUM_SEQS = 4  # fewer than a batch of 8: later requests join as rows free up


def vllm_environment(scratch: Path) -> dict[str, str]:
    """The environment settings of every vLLM process the suite starts on the tiny model
    (an offline engine, a server, a script): a small KV cache, caches under ``scratch``,
    nothing fetched or reported over the network."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


class VllmEngine:
    """vLLM's offline ``LLM`` with the V1 model runner in this process (CPU, float32), the
    anylogits processor class registered (one that counts the batch updates it gets),
    structured outputs through llguidance as under ours."""

    name = "vllm"

    def __init__(self, llm: Any, tokenizer: Any) -> None:
        from anylogits.core.vocab import hf_vocabulary

        self.llm = llm
        self.tokenizer = tokenizer
        self.vocabulary = hf_vocabulary(tokenizer)

    @classmethod
    def load(cls, model_dir: Path, scratch: Path) -> VllmEngine:
        import transformers
        from vllm import LLM

        from anylogits.engines.vllm_recording import RecordingAnyLogits

        settings = {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this process: a fast start
            **vllm_environment(scratch),
        }
        # Set while the engine starts only: a vLLM server started later inherits os.environ.
        added = {name: value for name, value in settings.items() if name not in os.environ}
        os.environ.update(added)
        try:
            llm = LLM(
                str(model_dir),
                dtype="float32",
                max_model_len=256,
                max_num_seqs=VLLM_MAX_NUM_SEQS,
                seed=0,
                enforce_eager=True,
                logits_processors=[RecordingAnyLogits],
                # Structured-output oracles: llguidance, as under ours. xgrammar (vLLM's
                # "auto" choice) allows every tokenization of forced text, llguidance
                # only the canonical one (see test_llama_cpp's grammar-sampler tests).
                structured_outputs_config={"backend": "guidance"},
            )
        finally:
            for name in added:
                del os.environ[name]
        return cls(llm, transformers.AutoTokenizer.from_pretrained(model_dir))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def params(self, *processors: LogitsProcessor, **kwargs: Any) -> Any:
        """``SamplingParams`` carrying ``processors``' specs (plain ones without)."""
        from vllm import SamplingParams

        from anylogits import for_vllm

        return for_vllm(*processors, **kwargs) if processors else SamplingParams(**kwargs)

    def generate(self, requests: list[tuple[list[int], Any]]) -> list[list[int]]:
        """Token ids of each ``(prompt, SamplingParams)`` request, all submitted in one
        ``llm.generate`` call."""
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids, _ in requests],
            [params for _, params in requests],
            use_tqdm=False,
        )
        return [list(output.outputs[0].token_ids) for output in outputs]

    def greedy(
        self,
        prompt: list[int],
        processors: Sequence[LogitsProcessor] = (),
        n: int = NEW_TOKENS,
        **kwargs: Any,
    ) -> list[int]:
        """``kwargs``: more sampling parameters (vLLM's own processors, as oracles)."""
        params = self.params(*processors, **{"max_tokens": n, "temperature": 0.0, **kwargs})
        return self.generate([(prompt, params)])[0]

    def sampled(
        self, prompt: list[int], processors: Sequence[LogitsProcessor], n: int, seed: int
    ) -> list[int]:
        params = self.params(*processors, max_tokens=n, seed=seed, **vllm_parameters({}, True))
        return self.generate([(prompt, params)])[0]

    def native(self, prompt: list[int], job: Job, n: int, seed: int = 0) -> list[int]:
        params = self.params(max_tokens=n, seed=seed, **vllm_parameters(job, samples(job)))
        return self.generate([(prompt, params)])[0]

    def structured(
        self, processor: LogitsProcessor, prompts: list[str], sample: bool, n: int, seed: int
    ) -> list[Generated]:
        """One request per prompt in one ``generate`` call, each carrying the processor's
        spec (more requests than ``max_num_seqs``: rows join as others finish); request
        ``i`` sampled with seed ``seed + i``."""
        requests = []
        for row, text in enumerate(prompts):
            sampling = {"temperature": 1.0, "seed": seed + row} if sample else {"temperature": 0.0}
            params = self.params(processor, max_tokens=n, **sampling)
            requests.append(({"prompt_token_ids": self.encode(text)}, params))
        outputs = self.llm.generate(
            [prompt for prompt, _ in requests], [params for _, params in requests], use_tqdm=False
        )
        results = []
        for output in outputs:
            completion = output.outputs[0]
            ids = generated(list(completion.token_ids), {self.tokenizer.eos_token_id}).ids
            results.append(Generated(ids, completion.finish_reason == "stop"))
        return results
