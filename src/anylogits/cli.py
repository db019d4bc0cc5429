"""The anylogits command: demo (the main job) and tiny-model."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="anylogits", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="run the same processors in every installed engine on the tiny model and "
        "print one table: tokens against transformers' own processors, and the cost per "
        "token against each engine's own parameters",
    )
    demo.add_argument(
        "--backend",
        choices=["transformers", "llama_cpp", "mlx", "vllm", "all"],
        default=None,
        help="one engine, or all (the default): every installed one",
    )
    demo.add_argument("--prompt", default="1 2 3 4 5 6 7 8 9 10 11 12")
    demo.add_argument("--max-new-tokens", type=int, default=24)
    commands.add_parser(
        "tiny-model",
        help="build (or find in the cache) the tiny random-weight model; see --help",
        add_help=False,
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "tiny-model":
        from anylogits.testing.tiny_model import main as tiny_model_main

        return tiny_model_main(rest, prog="anylogits tiny-model")
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from anylogits.demo import run_demo

    return run_demo(backend=args.backend, prompt=args.prompt, max_new_tokens=args.max_new_tokens)


if __name__ == "__main__":
    sys.exit(main())
