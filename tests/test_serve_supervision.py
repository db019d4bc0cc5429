"""``anylogits serve`` watches the engine's server as its child: a crash or a stop of its own
is said (signal, model, what to try) and the command exits non-zero; a stop asked of the
command reaches the server once. The servers themselves: each engine's session
(``server_suite``, ``test_vllm_server``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from anylogits.cli.serve import quiet_llama_cpp, watched
from anylogits.cli.supervision import Watched, ending
from anylogits.installation import llama_cpp_rebuild
from test_support import child_environment

WATCHED = Watched("anylogits serve llama-cpp", "llama-cpp-python's server", "m.gguf", "rebuild")


def test_a_crash_names_the_signal_the_model_and_the_hint() -> None:
    status, line = ending(-int(signal.SIGSEGV), stopped=False, watched=WATCHED)
    assert status == 128 + signal.SIGSEGV
    assert line == (
        "anylogits serve llama-cpp: llama-cpp-python's server died of SIGSEGV (signal 11) "
        "serving m.gguf; rebuild"
    )
    # Native code crashing while the server stops is still a crash.
    assert ending(-int(signal.SIGILL), stopped=True, watched=WATCHED)[0] == 128 + signal.SIGILL


def test_a_server_that_stops_by_itself_is_a_failure_and_a_stop_asked_for_is_not() -> None:
    status, line = ending(0, stopped=False, watched=WATCHED)
    assert status == 1 and line is not None and "stopped by itself (exit code 0)" in line
    assert ending(2, stopped=False, watched=WATCHED)[0] == 2
    assert ending(-int(signal.SIGKILL), stopped=False, watched=WATCHED) == (
        128 + signal.SIGKILL,
        "anylogits serve llama-cpp: llama-cpp-python's server was killed by SIGKILL "
        "(signal 9) serving m.gguf",
    )
    for code in (0, 1, -int(signal.SIGTERM), -int(signal.SIGINT)):
        assert ending(code, stopped=True, watched=WATCHED) == (0, None)


def test_llama_cpps_server_is_quiet_unless_asked() -> None:
    """llama-cpp-python's --verbose default prints every llama.cpp loader line."""
    assert quiet_llama_cpp(["--model", "m.gguf"]) == ["--model", "m.gguf", "--verbose", "false"]
    for given in (["--verbose", "true"], ["--verbose=true"]):
        assert quiet_llama_cpp(["--model", "m.gguf", *given]) == ["--model", "m.gguf", *given]


def test_llama_cpps_crash_hint_names_the_portable_build() -> None:
    said = watched("llama-cpp", ["--model", "/models/q4.gguf", "--port", "8000"])
    assert said.model == "/models/q4.gguf"
    assert said.crash_hint is not None
    # The command itself: tests/test_installation.py (with the installed version, if any).
    assert said.crash_hint.endswith(f"the portable build: {llama_cpp_rebuild()}")
    # What is known (a signal, the stacks above), the build offered as one possible cause:
    # a kill -SEGV from outside ends a portable server the same way.
    assert said.crash_hint.startswith("the Python stack of each thread at the end is above")
    assert "one possible cause" in said.crash_hint
    assert 'CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF"' in said.crash_hint
    assert "--force-reinstall --no-deps" in said.crash_hint
    assert watched("mlx", ["--model=folder"]) == Watched(
        "anylogits serve mlx", "mlx-lm's server", "folder", None
    )


def _supervised(server_code: str, tmp_path: Path) -> subprocess.Popen[str]:
    """``supervise`` in a child process, watching a Python server running ``server_code``."""
    server = tmp_path / "server.py"
    server.write_text(textwrap.dedent(server_code))
    supervisor = (
        "import sys\n"
        "from anylogits.cli.supervision import Watched, supervise\n"
        f"sys.exit(supervise([sys.executable, {str(server)!r}], "
        "Watched('anylogits serve llama-cpp', 'the server', 'm.gguf', 'rebuild it')))\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", supervisor],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_environment(),
    )


def test_a_server_killed_by_a_fault_is_said_and_the_command_fails(tmp_path: Path) -> None:
    supervisor = _supervised(
        """
        import os, signal
        print("serving", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
        """,
        tmp_path,
    )
    stdout, stderr = supervisor.communicate(timeout=60)
    assert supervisor.returncode == 128 + signal.SIGSEGV, stderr
    assert stdout == "serving\n"
    # faulthandler's stack: the supervisor turned it on in its child.
    assert "Fatal Python error: Segmentation fault" in stderr
    assert stderr.splitlines()[-1] == (
        "anylogits serve llama-cpp: the server died of SIGSEGV (signal 11) serving m.gguf; "
        "rebuild it"
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_asked_of_the_command_reaches_the_server_once(
    tmp_path: Path, stop: signal.Signals
) -> None:
    received = tmp_path / "received"
    supervisor = _supervised(
        f"""
        import signal, sys, time
        seen = []
        signal.signal({int(stop)}, lambda number, frame: seen.append(number))
        print("ready", flush=True)
        while not seen:
            time.sleep(0.05)
        time.sleep(0.5)  # a second signal would arrive by now
        open({str(received)!r}, "w").write(str(len(seen)))
        """,
        tmp_path,
    )
    assert supervisor.stdout is not None
    assert supervisor.stdout.readline() == "ready\n"
    time.sleep(0.2)  # the supervisor's handlers are in place once the server runs
    supervisor.send_signal(stop)
    _, stderr = supervisor.communicate(timeout=60)
    assert supervisor.returncode == 0, stderr
    assert received.read_text() == "1"
    assert stderr == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_a_server_ends_with_the_command_however_the_command_ends(tmp_path: Path) -> None:
    """A ``kill -9`` of ``anylogits serve`` (or of a test process that started a server)
    runs no handler: the server gets SIGTERM from the kernel and ends, where it used to
    run on, re-parented to PID 1."""
    ended = tmp_path / "ended"
    supervisor = _supervised(
        f"""
        import signal, sys, time
        def stop(number, frame):
            open({str(ended)!r}, "w").write(str(number))
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
        """,
        tmp_path,
    )
    assert supervisor.stdout is not None
    assert supervisor.stdout.readline() == "ready\n"
    supervisor.kill()
    supervisor.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while not ended.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended.exists() and ended.read_text() == str(int(signal.SIGTERM))
