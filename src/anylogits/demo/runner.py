"""``anylogits demo``: the same processors on every installed engine, against
transformers' own processors on the same weights."""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import traceback
from pathlib import Path

import torch

from anylogits.demo.cases import Case
from anylogits.demo.measure import Cell, Reference, measure, references
from anylogits.demo.progress import step
from anylogits.demo.selection import REFERENCE, DemoError, choose
from anylogits.demo.table import render
from anylogits.testing.backends import BACKENDS
from anylogits.testing.engines import GenerationEngine, TransformersEngine

# What loading each engine does, shown while it runs.
_LOADING = {
    "transformers": "loading the tiny model in transformers",
    "llama_cpp": "loading the tiny model in llama.cpp (its GGUF form is written once)",
    "mlx": "loading the tiny model in mlx-lm",
    "vllm": "starting vLLM on the tiny model (about 30 s on a CPU)",
}


def run_demo(
    backend: str | None = None,
    prompt: str = "1 2 3 4 5 6 7 8 9 10 11 12",
    max_new_tokens: int = 24,
) -> int:
    """Run the demo on ``backend`` (``None`` or ``"all"``: every installed engine);
    returns a process exit code: 0 if every engine agrees with transformers, 1 if not,
    2 if the demo cannot run as asked."""
    try:
        if max_new_tokens < 1:
            raise DemoError(f"--max-new-tokens {max_new_tokens}: generate at least 1 token")
        engines, missing = choose(backend)
    except DemoError as error:
        print(f"anylogits demo: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # steadier timings; llama.cpp runs on one thread too
    # transformers' bar for loading weights would break the demo's own progress line.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    model_dir = _tiny_model()
    with tempfile.TemporaryDirectory(prefix="anylogits-demo-") as scratch:
        with step(_LOADING[REFERENCE]):
            reference_engine = BACKENDS[REFERENCE].engine(model_dir, Path(scratch))
        assert isinstance(reference_engine, TransformersEngine)
        ids = reference_engine.encode(prompt)
        with step("transformers' own processors: the reference tokens"):
            cases = references(reference_engine, ids, max_new_tokens)
        rows: list[tuple[Case, Reference, dict[str, Cell]]] = [
            (case, reference, {}) for case, reference in cases
        ]
        errors: dict[str, str] = {}
        for name in engines:
            try:
                _run_engine(
                    name, reference_engine, model_dir, Path(scratch), rows, ids, max_new_tokens
                )
            except Exception as error:  # an engine that fails must not hide the others
                traceback.print_exc()
                errors[name] = f"{type(error).__name__}: {error}"
            gc.collect()  # the engine just run, before the next one loads
    _print_header(reference_engine, model_dir, prompt, ids, max_new_tokens, engines)
    lines, failures = render(rows, engines, errors, missing, reference_engine.tokenizer.decode)
    print("\n".join(lines))
    return 1 if failures else 0


def _tiny_model() -> Path:
    """The tiny model's folder, downloading and building it on first use."""
    from anylogits.testing.tiny_model import (
        build_tiny_model,
        tiny_model_cached,
        vocab_download,
        vocab_gguf_path,
    )

    download = vocab_download()
    if download is not None:
        with step("downloading the vocabulary (first run only)", f"first run: fetching {download}"):
            vocab_gguf_path()
    if tiny_model_cached():
        return build_tiny_model()
    with step("building the tiny random-weight model (first run only)"):
        return build_tiny_model()


def _run_engine(
    name: str,
    reference: TransformersEngine,
    model_dir: Path,
    scratch: Path,
    rows: list[tuple[Case, Reference, dict[str, Cell]]],
    prompt: list[int],
    n: int,
) -> None:
    """Every case on engine ``name``, into ``rows``."""
    if name == REFERENCE:
        engine: GenerationEngine = reference
    else:
        if name == "vllm":
            # vLLM logs every step of its start at INFO; the table is what the demo shows.
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        with step(_LOADING[name]):
            folder = scratch / name
            folder.mkdir()
            engine = BACKENDS[name].engine(model_dir, folder)
    with step(f"{name}: {len(rows)} cases through anylogits and natively, timed"):
        for case, expected, cells in rows:
            cells[name] = measure(engine, case, expected, prompt, n)


def _print_header(
    reference: TransformersEngine,
    model_dir: Path,
    prompt: str,
    ids: list[int],
    max_new_tokens: int,
    engines: list[str],
) -> None:
    print("anylogits demo: the same processors in every engine, against transformers' own")
    print(
        f"  tiny random-weight Llama, real llama-bpe vocabulary ({len(reference.tokenizer)} "
        f"tokens), float32: {model_dir}"
    )
    print(
        f"  prompt {prompt!r} = {len(ids)} tokens, up to {max_new_tokens} new tokens, "
        "greedy unless marked sampled"
    )
    print(f"  engines: {', '.join(engines)}\n")
