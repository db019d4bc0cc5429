"""``python -m anylogits.cli.engine_server ENGINE [options]``: transformers', llama-cpp-python's or
mlx-lm's server with per-request anylogits processors, in this process; ``anylogits serve`` runs it
as its child and watches it (:mod:`anylogits.cli.supervision`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    engine, options = argv[0], list(argv[1:])
    if engine == "llama-cpp":
        from anylogits.adapters.llama_cpp.server import main as serve
    elif engine == "transformers":
        from anylogits.adapters.transformers_server import main as serve
    elif engine == "mlx":
        from anylogits.adapters.mlx.server import main as serve
    else:
        raise SystemExit(f"anylogits.cli.engine_server: no in-process server for {engine!r}")
    return serve(options, prog=f"anylogits serve {engine}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
