"""``anylogits serve`` runs the engine's server as a child process and watches it: a server
that dies (a signal, say llama.cpp's native code faulting on the first completion) or stops
by itself is said in one line naming the signal, the model and what to try, and the
command exits non-zero, where an in-process server would vanish with a connection error
for the client and nothing in its log.

The child inherits the terminal (its log is the server's own), runs with Python's
``faulthandler`` on (``PYTHONFAULTHANDLER``, inherited by its own Python children: a
native crash prints each thread's Python stack first), and stays in
this process's group, so a ``kill`` of the group reaches it; on Linux it also gets SIGTERM
when this process ends however it ends (:func:`dies_with_this_process`: a ``kill -9`` of
the command leaves no server behind). A stop asked of the command
(SIGTERM, SIGHUP, SIGINT) is passed on to the child once: a terminal's Ctrl-C already
reached the whole foreground group, so SIGINT is passed on only where it did not.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_PR_SET_PDEATHSIG = 1  # linux/prctl.h

STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
# Signals with which native code dies (a fault, an illegal instruction, an abort).
CRASH_SIGNALS = frozenset(
    getattr(signal, name)
    for name in ("SIGSEGV", "SIGILL", "SIGBUS", "SIGFPE", "SIGABRT")
    if hasattr(signal, name)
)


@dataclass(frozen=True)
class Watched:
    """What is said of a server's end: ``server`` names it (e.g. "llama-cpp-python's
    server"), ``model`` what it served, ``crash_hint`` what to try when native code
    crashed (``None``: only where the stack is)."""

    command: str  # e.g. "anylogits serve llama-cpp"
    server: str
    model: str | None = None
    crash_hint: str | None = None


def supervise(argv: Sequence[str], watched: Watched) -> int:
    """Run the server ``argv`` until it ends; its end said as :func:`ending` says it (on
    stderr), and the command's exit status."""
    # Every Python process of the server (vLLM's engine core too) prints its threads'
    # stacks when native code crashes.
    process = subprocess.Popen(
        argv,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        preexec_fn=dies_with_this_process(),
    )
    stops: list[int] = []

    def pass_on(signum: int, _frame: object) -> None:
        stops.append(signum)
        if signum == signal.SIGINT and _interrupt_reached_the_group():
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in STOP_SIGNALS}
    try:
        code = process.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    status, line = ending(code, stopped=bool(stops), watched=watched)
    if line is not None:
        # On a line of its own, whatever the server left unfinished.
        print(f"\n{line}", file=sys.stderr, flush=True)
    return status


def dies_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` after which the child gets SIGTERM when
    this process ends, however it ends (Linux's parent-death signal; ``None`` elsewhere).
    A server started by a test dies with the test process, a ``kill -9`` included."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def set_parent_death_signal() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent ended before the signal was set
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal


def ending(code: int, *, stopped: bool, watched: Watched) -> tuple[int, str | None]:
    """``(exit status, the line saying why, or None)`` for a server that ended with
    ``code`` (``Popen.returncode``: negative for a signal), ``stopped`` when asked to."""
    serving = f" serving {watched.model}" if watched.model else ""
    if code < 0 and -code in CRASH_SIGNALS:
        name = signal.Signals(-code).name
        hint = watched.crash_hint or "the Python stack of each thread at the crash is above"
        return 128 - code, (
            f"{watched.command}: {watched.server} died of {name} (signal {-code}){serving}; {hint}"
        )
    if stopped:
        return 0, None
    if code < 0:
        name = signal.Signals(-code).name
        return 128 - code, (
            f"{watched.command}: {watched.server} was killed by {name} (signal {-code}){serving}"
        )
    return max(code, 1), (
        f"{watched.command}: {watched.server} stopped by itself (exit code {code}){serving}; "
        "its log above says why"
    )


def _interrupt_reached_the_group() -> bool:
    """Whether a SIGINT came from this process's terminal (its foreground group, which
    holds the server too)."""
    for stream in (sys.stdin, sys.stderr, sys.stdout):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            if stream is not None and stream.isatty():
                return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
    return False
