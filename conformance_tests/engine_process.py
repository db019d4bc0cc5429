"""A backend's engine in a child process, driven through the engine protocol.

vLLM keeps process-wide state (its distributed group, the compiled-graph caches) from the
first ``LLM`` a process starts, and the vLLM session already holds one on the tiny
model; a second model runs in its own process instead. Processors cross as their specs
(``to_spec``), as they cross vLLM's own process boundary; results come back as JSON
lines on a stream of their own (the child's stdout is its stderr: engines log there).

Run as ``python -m conformance_tests.engine_process BACKEND MODEL_DIR SCRATCH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from anylogits.core.specs import from_spec, to_specs
from anylogits.core.vocab import Vocabulary
from anylogits.engines.generation import NEW_TOKENS, Generated
from anylogits.engines.native import Job
from test_support import child_environment

ROOT = Path(__file__).resolve().parents[1]
START_SECONDS = 600  # vLLM's start on a CPU takes ~30-60 s; a busy machine, more
CALL_SECONDS = 600


class EngineProcess:
    """The engine of ``backend`` on ``model_dir``, in a child process. Implements the
    calls of :class:`~anylogits.engines.generation.GenerationEngine` that the real-model
    level makes (``encode``, ``greedy``, ``sampled``, ``native``, ``structured``)."""

    def __init__(self, backend: str, model_dir: Path, scratch: Path, vocabulary: Vocabulary):
        self.name = backend
        self.vocabulary = vocabulary  # the same tokenizer's, read in this process
        self._log = scratch / f"{backend}-engine.log"
        with self._log.open("w") as log:  # the child keeps its own copy of the descriptor
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, backend, str(model_dir), str(scratch)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                cwd=ROOT,
                env=child_environment(),
            )
        self._call("ready")

    def _call(self, method: str, **arguments: Any) -> Any:
        assert self._process.stdin is not None and self._process.stdout is not None
        if self._process.poll() is None:
            self._process.stdin.write(json.dumps({"method": method, **arguments}) + "\n")
            self._process.stdin.flush()
            line = self._process.stdout.readline()
            if line:
                answer = json.loads(line)
                if "error" in answer:
                    raise RuntimeError(f"{self.name} engine process: {answer['error']}")
                return answer["result"]
        tail = self._log.read_text()[-4000:]
        raise RuntimeError(f"the {self.name} engine process ended; its log ends:\n{tail}")

    def encode(self, text: str) -> list[int]:
        return list(self._call("encode", text=text))

    def greedy(
        self, prompt: list[int], processors: Sequence[Any] = (), n: int = NEW_TOKENS
    ) -> list[int]:
        return list(self._call("greedy", prompt=prompt, specs=to_specs(list(processors)), n=n))

    def sampled(self, prompt: list[int], processors: Sequence[Any], n: int, seed: int) -> list[int]:
        specs = to_specs(list(processors))
        return list(self._call("sampled", prompt=prompt, specs=specs, n=n, seed=seed))

    def native(self, prompt: list[int], job: Job, n: int, seed: int = 0) -> list[int]:
        return list(self._call("native", prompt=prompt, job=job, n=n, seed=seed))

    def structured(
        self, processor: Any, prompts: list[str], sample: bool, n: int, seed: int
    ) -> list[Generated]:
        rows = self._call(
            "structured",
            spec=processor.to_spec(),
            prompts=prompts,
            sample=sample,
            n=n,
            seed=seed,
        )
        return [Generated(list(ids), bool(finished)) for ids, finished in rows]

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def _serve(backend: str, model_dir: Path, scratch: Path) -> None:
    """Answer one JSON line per request on the stdout this process started with."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the engine prints goes to the log, not into the answers
    from anylogits.engines.backends import BACKENDS

    engine: Any = BACKENDS[backend].engine(model_dir, scratch)
    for line in sys.stdin:
        request = json.loads(line)
        method = request.pop("method")
        try:
            if "specs" in request:
                request["processors"] = [from_spec(spec) for spec in request.pop("specs")]
            if "spec" in request:
                request["processor"] = from_spec(request.pop("spec"))
            result = None if method == "ready" else getattr(engine, method)(**request)
            answer: dict[str, Any] = {"result": result}
        except Exception as error:  # the caller's test fails with it; the engine goes on
            answer = {"error": f"{type(error).__name__}: {error}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    backend_name, model_folder, scratch_folder = sys.argv[1:4]  # before vLLM rewrites argv
    _serve(backend_name, Path(model_folder), Path(scratch_folder))
