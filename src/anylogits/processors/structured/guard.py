"""A grammar's first validation, in a child process under a memory and a CPU-time budget.

The rules of :mod:`anylogits.processors.structured.bounds` cover every cost we know of;
this guards against the ones nobody thought of, and bounds what a grammar's size costs.
llguidance is Rust: when an allocation fails it aborts the whole process (llguidance 1.7
compiling ``maxItems: 1e9`` asked for 4 GB, and a vLLM API server died with it, for every
client). So the first validation of each grammar runs in a small child process (Python
and llguidance only, no torch) whose address space is capped at its idle size plus
``grammar_check_mb`` and which may spend at most ``grammar_check_ms`` of CPU time on it
(CPU time, not wall clock: on a loaded machine the verdict is the same). A grammar over
either budget is refused with a ``ValueError`` naming the limit; the child is then
replaced, and the process that asked (a server's frontend, an engine) is untouched.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from anylogits.core.limits import ENVIRONMENT_VARIABLE, Limits, limits

STARTUP_TIMEOUT_S = 60.0

# The child: reads one JSON request per line, answers one JSON line. It caps its own
# address space once llguidance is loaded and warm, so the budget is what a grammar adds.
_CHILD = r"""
import ctypes, json, resource, signal, sys
try:  # die with the parent, even when it is killed (the thread that started it, to Linux)
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except Exception:
    pass
import llguidance

def validate(grammar, budget):
    limits = llguidance.LLParserLimits(**budget, verbose_errors=False)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, limits=limits)
    if is_error:
        return messages[0] if messages else "the grammar does not compile"
    return None

validate('start: "a"', {})
with open("/proc/self/status") as status:
    size = next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize:"))
limit = size + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
sys.stdout.write("ready\n")
sys.stdout.flush()
for line in sys.stdin:
    request = json.loads(line)
    try:
        answer = {"error": validate(request["grammar"], request["limits"])}
    except Exception as error:
        answer = {"error": f"the grammar engine failed: {error}"}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
"""


# The checker's CPU time is read from /proc: nanoseconds from each thread's schedstat
# where the kernel keeps it, else clock ticks (10 ms at USER_HZ=100) from stat.
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# A check that got less CPU than its budget in this long is not the grammar's fault.
STARVED_AFTER_S = 60.0
_OVER_BUDGET = object()
_STARVED = object()


def _cpu_seconds(pid: int) -> float:
    """CPU time process ``pid`` has used, all its threads."""
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as schedstat:
                total += int(schedstat.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    with open(f"/proc/{pid}/stat", "rb") as stat:
        # Fields after the command name (which may hold spaces and parentheses).
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def _answer(process: subprocess.Popen[bytes], cpu_before: float, budget_s: float) -> object:
    """The checker's answer line; :data:`_OVER_BUDGET` once it has used ``budget_s`` of CPU
    time on this grammar, answered or not, :data:`_STARVED` if it could not use that much
    in :data:`STARVED_AFTER_S` (load, not the grammar). CPU time, not wall clock: on a
    loaded machine the same grammar gets the same verdict."""
    assert process.stdout is not None
    started = time.monotonic()
    wait = budget_s
    while True:
        ready, _, _ = select.select([process.stdout], [], [], wait)
        # Read before the answer is taken too: on a loaded machine the checker can use
        # its budget and answer before this thread runs again.
        used = _cpu_seconds(process.pid) - cpu_before
        if used >= budget_s:
            return _OVER_BUDGET
        if ready:
            return process.stdout.readline()
        if time.monotonic() - started > STARVED_AFTER_S:
            return _STARVED
        wait = max(budget_s - used, 0.001)


class GrammarCheckFailed(ValueError):
    """The grammar went over the memory or CPU-time budget of its validation, or
    (``transient``) the machine was too loaded to tell."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class GuardedValidator:
    """One checking child per process, started on first use, replaced after a failure;
    a forked process forgets its parent's (the pipes and the lock are the parent's)."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._budget = 0
        self._warming = False
        self._starter: ThreadPoolExecutor | None = None

    def validate(self, grammar: str, budget: dict[str, int]) -> str | None:
        """llguidance's error for ``grammar`` under ``budget`` (``None`` if it compiles).

        Raises:
            GrammarCheckFailed: the validation needed more memory or time than allowed.
        """
        current = limits()
        for _ in range(2):
            outcome = self._ask(grammar, budget, current)
            if not isinstance(outcome, int):
                break
            if outcome != -signal.SIGKILL:
                # Its own death: an allocation over the address-space cap aborts llguidance.
                raise GrammarCheckFailed(
                    f"the grammar needs more than {current.grammar_check_mb} MB to compile "
                    f"(anylogits limit 'grammar_check_mb'; raise it with {ENVIRONMENT_VARIABLE}="
                    "'{\"grammar_check_mb\": N}')"
                )
            # Killed from outside (the kernel's OOM killer, an operator): not the
            # grammar's doing; once more, with a new checker.
        else:
            raise GrammarCheckFailed(
                "the grammar checking process was killed twice while checking this grammar "
                "(SIGKILL, not a limit of the grammar's: the machine may be out of memory); "
                "send it again",
                transient=True,
            )
        if outcome is _OVER_BUDGET:
            raise GrammarCheckFailed(
                f"the grammar takes more than {current.grammar_check_ms} ms of CPU time to "
                f"compile (anylogits limit 'grammar_check_ms'; raise it with "
                f"{ENVIRONMENT_VARIABLE}='{{\"grammar_check_ms\": N}}')"
            )
        if outcome is _STARVED:
            raise GrammarCheckFailed(
                f"the grammar check got less than {current.grammar_check_ms} ms of CPU time in "
                f"{STARVED_AFTER_S:.0f} s: this machine is overloaded (not a limit of the "
                "grammar's); send it again",
                transient=True,
            )
        assert isinstance(outcome, tuple)
        return outcome[0]

    def _ask(self, grammar: str, budget: dict[str, int], current: Limits) -> object:
        """The checker's verdict as ``(error,)``; :data:`_OVER_BUDGET` or :data:`_STARVED`
        (the checker replaced); or the exit status of a checker that died without
        answering."""
        with self._lock:
            process = self._running(current.grammar_check_mb << 20)
            assert process.stdin is not None and process.stdout is not None
            request = json.dumps({"grammar": grammar, "limits": budget}) + "\n"
            try:
                cpu_before = _cpu_seconds(process.pid)
                process.stdin.write(request.encode())
                process.stdin.flush()
                line = _answer(process, cpu_before, current.grammar_check_ms / 1000)
            except (BrokenPipeError, OSError):
                line = b""
            if isinstance(line, bytes) and line.endswith(b"\n"):
                return (json.loads(line)["error"],)
            self._stop()
            return process.returncode if isinstance(line, bytes) else line

    def warm(self) -> None:
        """Start the checking process now, so that the first structured request
        does not pay for it; servers call it from a background thread at start."""
        with self._lock:
            self._running(limits().grammar_check_mb << 20)

    def warm_in_background(self) -> None:
        """:meth:`warm` in a daemon thread, once per process."""
        if not self._warming:
            self._warming = True
            threading.Thread(target=self.warm, name="anylogits-grammar-check", daemon=True).start()

    def _running(self, budget: int) -> subprocess.Popen[bytes]:
        if self._process is not None and (
            self._budget != budget or self._process.poll() is not None
        ):
            self._stop()
        if self._process is None:
            # Linux kills the checker when the *thread* that started it ends (its
            # parent-death signal): started from a server's request thread or a warming
            # thread, it would die in the middle of another thread's check. One thread
            # that lasts as long as the process starts them all.
            if self._starter is None:
                self._starter = ThreadPoolExecutor(1, thread_name_prefix="anylogits-grammar-check")
            self._process = self._starter.submit(self._start, budget).result()
            self._budget = budget
        return self._process

    @staticmethod
    def _start(budget: int) -> subprocess.Popen[bytes]:
        environment = {**os.environ, "MALLOC_ARENA_MAX": "2"}
        process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(budget)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # An abort's message (Rust's "memory allocation failed") is not the server's.
            stderr=subprocess.DEVNULL,
            env=environment,
        )
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], STARTUP_TIMEOUT_S)
        if not ready or process.stdout.readline() != b"ready\n":
            _end(process)
            raise RuntimeError(
                "the grammar checking process did not start (is llguidance installed?)"
            )
        return process

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            _end(process)

    def close(self) -> None:
        with self._lock:
            self._stop()


def _end(process: subprocess.Popen[bytes]) -> None:
    """Kill a checking process and close its pipes (a replaced one's, too)."""
    process.kill()
    process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            # A request may still be buffered for a checker that died.
            with contextlib.suppress(OSError):
                pipe.close()


GUARD = GuardedValidator()
atexit.register(GUARD.close)
os.register_at_fork(after_in_child=GUARD._forget)
