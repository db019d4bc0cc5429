"""A child process that builds, compiles and advances structured specs under a memory and
a time budget, for the structured-spec fuzzer (``test_structured_fuzz.py``, ``nox -s fuzz``).

The worker loads the tiny model's real 128k-token llama-bpe vocabulary once, then limits
its own address space (``RLIMIT_AS``) to what it holds after loading plus
:data:`MEMORY_BUDGET_BYTES`. Each spec is built with ``from_spec`` (as a server's frontend
does), compiled for the vocabulary (as the engine does) and advanced :data:`STEPS` tokens,
each the allowed token a seeded choice picks. The parent waits at most
:data:`TIME_BUDGET_S` per spec. Outcomes:

- ``refused``: a ``ValueError`` (an HTTP 400 on a server), the expected answer to a spec
  over a limit or that does not compile;
- ``ok``: built, compiled and advanced within both budgets;
- ``failed``: anything else, a process killed (an allocation over the budget aborts Rust
  code: ``SIGABRT``), a wall clock run out, another exception. A failure restarts the
  worker, so the next spec gets a fresh one.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

MEMORY_BUDGET_BYTES = 1536 << 20
TIME_BUDGET_S = 5.0
STEPS = 6
STARTUP_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Outcome:
    kind: str  # "ok", "refused" or "failed"
    detail: str
    seconds: float


def _address_space() -> int:
    """This process's virtual memory size in bytes (``VmSize``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _advance(spec: dict[str, Any], vocab: Any, width: int) -> str:
    """Build ``spec``, compile it for ``vocab`` and take :data:`STEPS` allowed tokens."""
    import torch

    from anylogits import Pipeline, from_spec

    processor = from_spec(spec)
    pipeline = Pipeline([processor], vocab)  # binds: compiles for the vocabulary
    ids = [vocab.bos_token_id or 0]
    generator = torch.Generator().manual_seed(0)
    eos = sorted(vocab.eos_token_ids)
    for _ in range(STEPS):
        out = pipeline(torch.zeros(1, width), torch.tensor([ids]))
        allowed = torch.nonzero(out[0] > float("-inf")).flatten()
        choices = allowed[~torch.isin(allowed, torch.tensor(eos))]
        if len(choices) == 0:
            break
        pick = int(torch.randint(len(choices), (1,), generator=generator))
        ids.append(int(choices[pick]))
    return repr(b"".join(vocab.tokens[token] for token in ids[1:]))


def _serve(connection: Connection, model_dir: str, budget: int) -> None:
    # The suite's probes (a processor that raises) test the harness itself.
    os.environ.setdefault("ANYLOGITS_PLUGINS", "test_support.probes")
    import transformers

    from anylogits.core.vocab import hf_vocabulary

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    vocab = hf_vocabulary(tokenizer)  # holds the tokenizer weakly: keep `tokenizer`
    width = vocab.size
    _advance({"type": "regex", "pattern": "[a-z]+"}, vocab, width)  # llguidance's tokenizer
    limit = _address_space() + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    connection.send(("ready", str(limit)))
    while True:
        spec = connection.recv()
        try:
            detail = _advance(spec, vocab, width)
        except ValueError as error:
            connection.send(("refused", str(error)))
        except BaseException:
            connection.send(("failed", traceback.format_exc()))
        else:
            connection.send(("ok", detail))


class FuzzWorker:
    """The parent's side: one worker at a time, restarted after a failure."""

    def __init__(self, model_dir: Path, *, memory_budget: int = MEMORY_BUDGET_BYTES) -> None:
        self.model_dir = model_dir
        self.memory_budget = memory_budget
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None
        self._connection: Connection | None = None
        self.restarts = 0
        self.outcomes: Counter[str] = Counter()

    def _start(self) -> Connection:
        parent, child = self._context.Pipe()
        self._process = self._context.Process(
            target=_serve, args=(child, str(self.model_dir), self.memory_budget), daemon=True
        )
        self._process.start()
        child.close()
        if not parent.poll(STARTUP_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"the fuzz worker did not start in {STARTUP_TIMEOUT_S} s")
        kind, _ = parent.recv()
        assert kind == "ready"
        self._connection = parent
        return parent

    def run(self, spec: dict[str, Any], time_budget: float = TIME_BUDGET_S) -> Outcome:
        outcome = self._run(spec, time_budget)
        self.outcomes[f"{spec.get('type')} {outcome.kind}"] += 1
        return outcome

    def _run(self, spec: dict[str, Any], time_budget: float) -> Outcome:
        connection = self._connection or self._start()
        started = time.perf_counter()
        connection.send(spec)
        try:
            answered = connection.poll(time_budget)
            reply = connection.recv() if answered else None
        except (EOFError, ConnectionResetError):
            reply = None
            answered = True
        seconds = time.perf_counter() - started
        if reply is not None:
            kind, detail = reply
            if kind != "failed":
                return Outcome(kind, detail, seconds)
            self.stop()
            return Outcome("failed", detail, seconds)
        if not answered:
            self.stop()
            return Outcome("failed", f"no answer within {time_budget} s", seconds)
        self._process.join(5)
        code = self._process.exitcode
        self.stop()
        return Outcome("failed", f"the worker died (exit code {code})", seconds)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def stop(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(10)
        if self._process is not None:
            self.restarts += 1
        self._process = None
        self._connection = None
