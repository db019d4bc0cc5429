"""transformers' continuous batching as a generation engine: the tiny model behind running
``init_continuous_batching`` managers, every request carrying its processors as specs
(``add_request(..., anylogits=...)``), several requests in flight at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from anylogits.core.processor import LogitsProcessor
from anylogits.core.specs import to_specs
from anylogits.engines.generation import NEW_TOKENS, Generated, TransformersEngine, generated
from anylogits.engines.native import Job, NoNative, samples

# Enough for the suite's prompts and outputs (a page holds 256 tokens by default).
CACHE_BLOCKS = 64
MAX_BATCH_TOKENS = 512
RESULT_TIMEOUT_S = 120.0
NATIVE_PER_REQUEST = ("temperature", "top_k", "top_p")


class Managers:
    """One running manager per kind of decoding, made on first use: greedy (argmax),
    sampled (transformers' warpers off) and native (its per-request temperature, top-k and
    top-p). Each manager carries the anylogits hook; requests name their processors."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self._running: dict[str, Any] = {}
        self._lock = threading.Lock()
        # A manager's loop is a non-daemon thread: the interpreter waits for it at exit,
        # before atexit runs. threading's own exit hooks run before that wait.
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            register(self.stop)

    def config(self, kind: str) -> tuple[Any, Any]:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        eos = self.model.generation_config.eos_token_id
        common = {"eos_token_id": eos, "pad_token_id": self.tokenizer.eos_token_id}
        per_request = kind == "native"
        if kind == "greedy":
            generation = GenerationConfig(do_sample=False, **common)
        elif kind == "sampled":
            generation = GenerationConfig(
                do_sample=True, temperature=1.0, top_k=None, top_p=1.0, **common
            )
        else:
            # Values other than the neutral ones, so that transformers makes the processors
            # whose per-request versions each request then sets.
            generation = GenerationConfig(
                do_sample=True, temperature=0.5, top_k=len(self.tokenizer), top_p=0.5, **common
            )
        batching = ContinuousBatchingConfig(
            num_blocks=CACHE_BLOCKS,
            max_batch_tokens=MAX_BATCH_TOKENS,
            per_request_processors=per_request,
        )
        return generation, batching

    def __getitem__(self, kind: str) -> Any:
        with self._lock:
            manager = self._running.get(kind)
            if manager is None:
                from anylogits.adapters.transformers_cb import for_continuous_batching

                generation, batching = self.config(kind)
                manager = self.model.init_continuous_batching(
                    generation_config=generation, continuous_batching_config=batching
                )
                for_continuous_batching(manager, tokenizer=self.tokenizer)
                manager.start()
                # Its thread builds the cache and scheduler first: done before a caller
                # seeds the generator the steps then draw from.
                deadline = time.monotonic() + RESULT_TIMEOUT_S
                while manager.batch_processor is None and manager.is_running():
                    if time.monotonic() > deadline:
                        raise TimeoutError("transformers' continuous batching did not start")
                    time.sleep(0.01)
                self._running[kind] = manager
            return manager

    def stop(self) -> None:
        with self._lock:
            for manager in self._running.values():
                manager.stop(block=True, timeout=10)
            self._running.clear()


def results(manager: Any, request_ids: Sequence[str]) -> dict[str, Any]:
    """The finished outputs of ``request_ids`` (raises on a failed one)."""
    wanted, finished = set(request_ids), dict[str, Any]()
    while wanted - finished.keys():
        output = manager.get_result(timeout=RESULT_TIMEOUT_S)
        if output is None:
            if not manager.is_running():
                raise RuntimeError("transformers' continuous batching stopped")
            raise TimeoutError(f"no result in {RESULT_TIMEOUT_S:.0f} s")
        if output.request_id in wanted and output.is_finished():
            if output.error is not None:
                raise RuntimeError(f"request {output.request_id} failed: {output.error}")
            finished[output.request_id] = output
    return finished


class TransformersCBEngine:
    """The tiny model in transformers' continuous batching (float32, synchronous on the
    CPU); requests carry their processors as specs."""

    name = "transformers_cb"

    def __init__(self, model: Any, tokenizer: Any) -> None:
        from anylogits.core.vocab import hf_vocabulary

        self.model = model
        self.tokenizer = tokenizer
        self.vocabulary = hf_vocabulary(tokenizer)
        self.managers = Managers(model, tokenizer)

    @classmethod
    def load(cls, model_dir: Path) -> TransformersCBEngine:
        """The model as :meth:`TransformersEngine.load` loads it (float32)."""
        loaded = TransformersEngine.load(model_dir)
        return cls(loaded.model, loaded.tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def submit(
        self,
        kind: str,
        requests: Sequence[tuple[list[int], Sequence[LogitsProcessor], dict[str, Any]]],
        n: int,
        seed: int | None = None,
    ) -> list[list[int]]:
        """New token ids of each ``(prompt, processors, add_request arguments)`` request,
        all in flight at once in the ``kind`` manager."""
        manager = self.managers[kind]
        if seed is not None:
            torch.manual_seed(seed)  # the manager's thread draws from the global generator
        ids = []
        for prompt, processors, arguments in requests:
            specs = {"anylogits": to_specs(list(processors))} if processors else {}
            ids.append(manager.add_request(prompt, max_new_tokens=n, **specs, **arguments))
        outputs = results(manager, ids)
        return [list(outputs[request_id].generated_tokens) for request_id in ids]

    def greedy(
        self, prompt: list[int], processors: Sequence[LogitsProcessor] = (), n: int = NEW_TOKENS
    ) -> list[int]:
        return self.submit("greedy", [(prompt, processors, {})], n)[0]

    def sampled(
        self, prompt: list[int], processors: Sequence[LogitsProcessor], n: int, seed: int
    ) -> list[int]:
        return self.submit("sampled", [(prompt, processors, {})], n, seed)[0]

    def native(self, prompt: list[int], job: Job, n: int, seed: int = 0) -> list[int]:
        for argument in job:
            if argument not in NATIVE_PER_REQUEST:
                raise NoNative(self.name, argument)
        if not samples(job):
            return self.greedy(prompt, (), n)
        arguments = {
            "temperature": float(job.get("temperature", 1.0)),
            "top_k": int(job.get("top_k", len(self.tokenizer))),
            "top_p": float(job.get("top_p", 1.0)),
        }
        return self.submit("native", [(prompt, (), arguments)], n, seed)[0]

    def structured(
        self, processor: LogitsProcessor, prompts: list[str], sample: bool, n: int, seed: int
    ) -> list[Generated]:
        """Every prompt a request carrying the processor's spec, all in flight at once."""
        requests: list[tuple[list[int], Sequence[LogitsProcessor], dict[str, Any]]] = [
            (self.encode(text), (processor,), {}) for text in prompts
        ]
        outputs = self.submit("sampled" if sample else "greedy", requests, n, seed)
        return [generated(ids, {self.tokenizer.eos_token_id}) for ids in outputs]

    def close(self) -> None:
        self.managers.stop()
