"""A progress indicator for the demo's long steps, on stderr, without a dependency.

On a terminal, a step is one line that a spinner and the elapsed seconds rewrite until it
ends, then say how long it took; elsewhere (a pipe, a CI log) a step is a line when it
starts and one when it ends, so a log shows where the time went.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

_FRAMES = "|/-\\"
_CLEAR_TO_END = "\x1b[K"


class Outcome:
    """What a step found, said on its last line instead of "done" (set it in the block)."""

    said: str | None = None


@contextmanager
def step(what: str, detail: str | None = None, stream: TextIO | None = None) -> Iterator[Outcome]:
    """Show that ``what`` (a short line) is under way while the block runs; ``detail``,
    printed once before it, says more (it may be longer than a terminal line, which a
    spinner could not rewrite). The block may set what it found on the :class:`Outcome`
    it is given: the last line says it."""
    stream = stream or sys.stderr
    found = Outcome()
    if detail:
        print(detail, file=stream, flush=True)
    start = time.perf_counter()
    spinner = _Spinner(what, start, stream) if stream.isatty() else None
    if spinner is None:
        print(f"{what} ...", file=stream, flush=True)
    else:
        spinner.start()
    outcome = "failed after"
    try:
        yield found
        outcome = "done in"
    finally:
        seconds = time.perf_counter() - start
        line = f"{what}: {outcome} {seconds:.1f} s"
        if outcome == "done in" and found.said is not None:
            line = f"{what}: {found.said} ({seconds:.1f} s)"
        if spinner is not None:
            spinner.stop()
            line = f"\r{line}{_CLEAR_TO_END}"
        print(line, file=stream, flush=True)


class _Spinner(threading.Thread):
    """Rewrites ``what``'s line ten times a second until :meth:`stop`."""

    def __init__(self, what: str, start: float, stream: TextIO) -> None:
        super().__init__(daemon=True)
        self.what = what
        self.started_at = start
        self.stream = stream
        self.done = threading.Event()

    def run(self) -> None:
        frame = 0
        while not self.done.wait(0.1):
            elapsed = time.perf_counter() - self.started_at
            glyph = _FRAMES[frame % len(_FRAMES)]
            self.stream.write(f"\r{glyph} {self.what} {elapsed:.0f} s{_CLEAR_TO_END}")
            self.stream.flush()
            frame += 1

    def stop(self) -> None:
        self.done.set()
        self.join()
