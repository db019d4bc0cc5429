"""Each engine's own OpenAI-compatible server serving per-request anylogits processors,
started as a user starts it (``anylogits serve vllm|llama-cpp|mlx``, the suite's probes as
``ANYLOGITS_PLUGINS``) once per test session, for the modules that use the ``server`` and
``client`` fixtures. A module names its server with a ``server_backend`` fixture (vLLM's
by default) or parametrizes it.

Imported by ``conftest.py``; imports no engine and no openai until a fixture runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from anylogits.cli.supervision import dies_with_this_process
from anylogits.engines.backends import installed
from anylogits.engines.generation import vllm_environment
from anylogits.testing.pytest_plugin import selected_backends
from test_support import child_environment

MODEL_NAME = "tiny"  # vLLM's served model name
# What a request names as its model: mlx-lm's server calls the one given with --model this.
# transformers' server takes the model folder's path (None: the folder it serves).
MODEL_NAMES: dict[str, str | None] = {
    "vllm": MODEL_NAME,
    "llama_cpp": MODEL_NAME,
    "mlx": "default_model",
    "transformers": None,
    "transformers_cb": None,
}
# Answers 200 once the server serves (llama-cpp-python's has no /health).
READY_PATHS = {
    "vllm": "/health",
    "llama_cpp": "/v1/models",
    "mlx": "/health",
    "transformers": "/health",
    "transformers_cb": "/health",
}
# The anylogits serve engine of each server backend (transformers' server runs both).
SERVE_ENGINES = {"transformers_cb": "transformers"}
# transformers' own server on its continuous-batching path, cache sized for the suite.
CONTINUOUS_BATCHING = [
    "--continuous-batching",
    "--cb-num-blocks",
    "64",
    "--cb-max-batch-tokens",
    "512",
]
SERVER_BACKENDS = tuple(MODEL_NAMES)
STARTUP_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 120.0
LOG_TAIL_CHARS = 6000

# The suite's probes are unpackaged processor types: the operator's module list makes them
# known to the server's frontend and engine alike. Installed plugins (the example
# package's ban_two_back) need nothing at all.
SERVER_PLUGINS = {"ANYLOGITS_PLUGINS": "test_support.probes"}

# Minimal chat template (the tiny model's tokenizer has none): "role: content" lines.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    backend: str
    model: str
    startup_s: float = 0.0

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as error:
            return f"<cannot read {self.log_path}: {error}>"
        return text[-chars:]

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            pytest.fail(
                f"the {self.backend} server exited with code {code}; log tail:\n{self.log_tail()}"
            )


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux ``/proc``), of all its threads."""
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


def frontend_pid(server: Server) -> int:
    """The engine's own server process: the child ``anylogits serve`` (``server.process``,
    which only watches it) runs."""
    (child,) = child_pids(server.process.pid)
    return child


def resident_bytes(pid: int) -> int:
    """The resident memory of one process (``VmRSS``)."""
    match = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    if match is None:
        raise RuntimeError(f"no VmRSS for process {pid}")
    return int(match[1]) * 1024


def process_tree_rss(pid: int) -> int:
    """The resident bytes of ``pid`` and every process below it."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            pending += child_pids(current)
            total += resident_bytes(current)
        except (OSError, RuntimeError):
            continue  # ended meanwhile
    return total


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ready(base_url: str, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}{path}", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the API server alone, so that it shuts its engine down itself, then SIGKILL
    whatever is left of its process group. (A SIGTERM to the whole group kills the engine
    core first and the server logs an ``EngineDeadError`` traceback; vLLM's own abort-mode
    shutdown sometimes logs it too, which is why the traceback check runs before this.)"""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)


def _options(backend: str, model_dir: Path, folder: Path) -> list[str]:
    """The options of ``anylogits serve ENGINE`` on the tiny model, as a user gives them
    (its address aside)."""
    if backend == "vllm":
        template = folder / "chat_template.jinja"
        template.write_text(CHAT_TEMPLATE)
        return [
            "--model",
            str(model_dir),
            "--served-model-name",
            MODEL_NAMES[backend],
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--enforce-eager",
            "--chat-template",
            str(template),
        ]
    if backend == "llama_cpp":
        from anylogits.testing.tiny_model import GGUF_FILENAME, build_tiny_gguf

        gguf = model_dir / GGUF_FILENAME
        # The in-process engine's settings (LlamaCppEngine): one thread, float32 KV cache.
        return [
            "--model",
            str(gguf if gguf.is_file() else build_tiny_gguf()),
            "--model_alias",
            MODEL_NAMES[backend],
            "--n_ctx",
            "512",
            "--n_threads",
            "1",
            "--n_threads_batch",
            "1",
            "--type_k",
            "0",
            "--type_v",
            "0",
            "--verbose",
            "false",
        ]
    if backend == "mlx":
        # The tiny model has no chat template; the real model's folder has its own.
        has_template = (model_dir / "chat_template.jinja").is_file()
        template = [] if has_template else ["--chat-template", CHAT_TEMPLATE]
        return ["--model", str(model_dir), *template]
    if backend in ("transformers", "transformers_cb"):
        batching = CONTINUOUS_BATCHING if backend == "transformers_cb" else []
        served = with_chat_template(model_dir, folder)
        return ["--model", str(served), "--dtype", "float32", "--device", "cpu", *batching]
    raise ValueError(f"no server for backend {backend!r}")


def with_chat_template(model_dir: Path, folder: Path) -> Path:
    """``model_dir``, or where it has no chat template (the tiny model; transformers' server
    has no option for one), a folder of links to its files beside :data:`CHAT_TEMPLATE`."""
    if (model_dir / "chat_template.jinja").is_file():
        return model_dir
    served = folder / "model"
    served.mkdir()
    for item in model_dir.iterdir():
        (served / item.name).symlink_to(item)
    (served / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return served


def _served_model(backend: str, options: list[str]) -> str:
    """What ``backend``'s requests name as their model."""
    named = MODEL_NAMES[backend]
    if named is not None:
        return named
    return options[options.index("--model") + 1]


def start(backend: str, model_dir: Path, folder: Path, options: list[str] | None = None) -> Server:
    """``backend``'s server on the tiny model, ready to serve (the suite's probes as
    ``ANYLOGITS_PLUGINS``); ``options``: the server's own instead (its address added)."""
    log_path = folder / "server.log"
    port = _free_port()
    if options is None:
        options = _options(backend, model_dir, folder)
    engine = SERVE_ENGINES.get(backend, backend.replace("_", "-"))
    address = ["--host", "127.0.0.1", "--port", str(port)]
    command = [sys.executable, "-m", "anylogits", "serve", engine, *options, *address]
    env = child_environment(**SERVER_PLUGINS)
    if backend == "vllm":
        env.update(vllm_environment(folder))
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, so teardown reaches the engine
            # and it ends with this process, however this process ends (a stopped nox
            # SIGTERMs its workers, whose teardown then never runs).
            preexec_fn=dies_with_this_process(),
        )
    started = time.monotonic()
    model = _served_model(backend, options)
    running = Server(process, f"http://127.0.0.1:{port}", log_path, backend, model)
    try:
        while not _ready(running.base_url, READY_PATHS[backend]):
            running.check_alive()
            if time.monotonic() - started > STARTUP_TIMEOUT_S:
                pytest.fail(
                    f"the {backend} server was not ready after {STARTUP_TIMEOUT_S:.0f} s; "
                    f"log tail:\n{running.log_tail()}"
                )
            time.sleep(0.5)
    except BaseException:
        _stop(process)
        raise
    running.startup_s = time.monotonic() - started
    print(f"{backend} server ready in {running.startup_s:.1f} s (log: {log_path})")
    return running


class Servers:
    """Each backend's server, started on first use and stopped at the session's end."""

    def __init__(self, model_dir: Path, scratch: pytest.TempPathFactory) -> None:
        self.model_dir = model_dir
        self.scratch = scratch
        self.running: dict[str, Server] = {}

    def __getitem__(self, backend: str) -> Server:
        return self.serving(backend, self.model_dir)

    def serving(self, backend: str, model_dir: Path) -> Server:
        """``backend``'s server on the model in ``model_dir`` (an HF folder holding its
        float32 GGUF too)."""
        key = f"{backend}:{model_dir}"
        if key not in self.running:
            folder = self.scratch.mktemp(f"{backend}_server")
            self.running[key] = start(backend, model_dir, folder)
        return self.running[key]

    def close(self) -> None:
        for running in self.running.values():
            _stop(running.process)


@pytest.fixture(scope="session")
def servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    started = Servers(tiny_model_dir, tmp_path_factory)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture(scope="module")
def server_backend(request: pytest.FixtureRequest) -> str:
    """The backend whose server a module's tests talk to: vLLM's unless the module (or a
    parametrization) says otherwise."""
    return getattr(request, "param", "vllm")


@pytest.fixture(scope="module")
def server(server_backend: str, servers: Servers, request: pytest.FixtureRequest) -> Server:
    if server_backend not in selected_backends(request.config):
        pytest.skip(f"{server_backend} is not selected")
    if not installed(server_backend):
        pytest.skip(f"{server_backend} is not installed")
    return servers[server_backend]


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    return client_of(server)


def client_of(server: Server) -> Any:
    """The ``openai`` client of ``server``, with the model its requests name."""
    import openai

    client = openai.OpenAI(
        base_url=f"{server.base_url}/v1",
        api_key="EMPTY",
        timeout=REQUEST_TIMEOUT_S,
        max_retries=0,
    )
    client.served_model = server.model  # what its requests name as their model
    client.native_fields = native_fields(server)
    return client


# llama-cpp-python's server applies repeat_penalty 1.1 unless told (the in-process engines,
# transformers included, run without one); transformers' server answers an unknown field
# with 422, the others ignore it (vLLM's logs it).
NO_NATIVE_PENALTY = {"repeat_penalty": 1.0}


def native_fields(server: Server) -> dict[str, Any]:
    """The fields of ``server``'s own that every request of the suite sends."""
    return dict(NO_NATIVE_PENALTY) if server.backend == "llama_cpp" else {}


def check_spec_message(text: str) -> str:
    """What ``anylogits check-spec`` says the servers answer ``text`` with (run with their
    plugin list): the message of the HTTP 400."""
    checked = subprocess.run(
        [sys.executable, "-m", "anylogits", "check-spec", "-"],
        input=text,
        capture_output=True,
        text=True,
        env=child_environment(**SERVER_PLUGINS),
        check=False,
    )
    assert checked.returncode == 1, checked
    return "\n".join(checked.stderr.splitlines()[1:])


def load_installed_plugins(client: Any) -> None:
    """Make the server load the installed plugin's entry point, as ``check-spec`` does:
    a server loads one when a request first names it, and an unknown type's message lists
    what it has loaded."""
    import importlib.util

    if importlib.util.find_spec("anylogits_example_plugin") is not None:
        client.completions.create(
            model=client.served_model,
            prompt="1 2 3",
            max_tokens=1,
            extra_body={"vllm_xargs": {"anylogits": '[{"type": "ban_two_back"}]'}},
        )
