"""The GPU session (``nox -s gpu``): what only a real CUDA device can show.

Without CUDA it prints why it skips and exits 0. With CUDA it runs, each step in its own
process with a time limit, and says what each gave:

1. ``tests``: ``pytest tests/test_cuda.py``: every catalogue processor on ``cuda`` logits
   along transformers' path (history on the device) and vLLM V1's (``PersistentBatch``,
   history on the host), the third decode step under
   ``torch.cuda.set_sync_debug_mode("error")``, results equal to the CPU's; vLLM's V2
   runner's step (device-resident histories, placeholder drafts, a grammar beside a long
   request); ``tests/test_cuda_generate.py``: transformers' ``generate`` on the tiny
   model on ``cuda``, anylogits against transformers' own processors;
   ``tests/test_kernels.py``: the Triton kernels compiled, against the torch processors,
   and the planned chain under ``"error"``;
2. ``demo``: ``anylogits demo --device cuda --model tiny --backend transformers``;
3. ``vllm``: vLLM's conformance levels, when vLLM is installed;
4. ``bench``: ``asv_bench/benchmarks/bench_gpu.py``'s measurement (anylogits' hook
   against transformers' own processors, V = 128,256, B = 1 / 32 / 128), as a table and
   JSON.

A machine without network cannot build the tiny model (its vocabulary comes from PyPI):
``--prepare DIR``, run where it builds, writes what it needs (about 5 MB); pass that
folder with ``--tiny-model DIR`` or ``ANYLOGITS_GPU_TINY_MODEL``.

Usage (from the repository root)::

    python tools/gpu_check.py --prepare DIR          # here: the tiny model, for the GPU box
    python tools/gpu_check.py --out OUT [--tiny-model DIR]   # there: every step, results in OUT
    python tools/gpu_check.py --bench OUT.json       # the benchmark alone

``--out`` receives ``summary.json`` (environment, each step's exit code and seconds,
rewritten as each step ends), ``tests.log``, ``tests.xml`` (JUnit), ``syncs.json`` (per
catalogue case and path: the synchronizing calls seen in the checked step, the device
reads the accelerator level's budget allows, the largest difference from the CPU),
``demo.log``, ``vllm.log``, ``bench.log`` and ``bench.json``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "src", ROOT, ROOT / "asv_bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

TINY_MODEL_VARIABLE = "ANYLOGITS_GPU_TINY_MODEL"
STEPS = ("tests", "demo", "vllm", "bench")
NO_TINY_MODEL = (
    "the tiny model is not in anylogits' cache and no prepared folder was given "
    f"(--tiny-model, ${TINY_MODEL_VARIABLE}; python tools/gpu_check.py --prepare DIR writes "
    "one): the generation tests, the demo and vLLM's levels skip"
)
# Seconds each step may take on an H100 before it is stopped (the whole run: ~4 minutes).
LIMITS = {"tests": 180, "demo": 60, "vllm": 300, "bench": 60}


def no_cuda_reason() -> str | None:
    """Why the GPU session cannot run here, or ``None`` when it can."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return f"torch.cuda.is_available() is False (torch {torch.__version__}, {build})"


def environment() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    for name in ("transformers", "llguidance", "vllm"):
        spec = importlib.util.find_spec(name)
        info[name] = _version(name) if spec is not None else None
    try:
        info["commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["commit"] = None
    return info


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def child_environment(extra: dict[str, str]) -> dict[str, str]:
    """:func:`test_support.child_environment` with ``src`` first on ``PYTHONPATH`` too:
    a GPU box runs the checkout without installing it."""
    from test_support import child_environment as repository_environment

    env = repository_environment(**extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env["PYTHONPATH"]])
    return env


def run_step(name: str, command: list[str], env: dict[str, str], log: Path | None) -> dict:
    """``command`` in a child process within its time limit, its output shown (and
    written to ``log``)."""
    print(f"\n=== gpu check: {name}: {' '.join(command)}", flush=True)
    start = time.monotonic()
    output: list[str] = []
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )

    def pump() -> None:  # a thread: a silent, hung child must not stop the clock
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            print(line, end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=LIMITS[name])
    except subprocess.TimeoutExpired:
        timed_out = True
        process.kill()
        process.wait()
    reader.join(timeout=10)
    seconds = round(time.monotonic() - start, 1)
    if log is not None:
        log.write_text("".join(output))
    result = {"returncode": process.returncode, "seconds": seconds, "timed_out": timed_out}
    verdict = "timed out" if timed_out else ("ok" if process.returncode == 0 else "FAILED")
    print(f"=== gpu check: {name}: {verdict} in {seconds} s", flush=True)
    return result


def install_tiny_model(prepared: Path | None, scratch: Path) -> dict[str, str] | None:
    """The environment that finds the tiny model: the prepared folder laid out as
    anylogits' cache in ``scratch``, or the cache as it is; ``None`` when there is no
    tiny model here (building it would fetch its vocabulary from PyPI)."""
    from anylogits.testing.tiny_model import tiny_model_cached

    if prepared is None:
        if not tiny_model_cached():
            print(f"gpu check: {NO_TINY_MODEL}", flush=True)
            return None
        return {}
    from test_support.gpu_tiny_model import install

    cache = scratch / "anylogits-cache"
    folder, same = install(prepared, cache)
    note = "the weights are byte-identical to the prepared model's"
    if not same:
        note = (
            "WARNING: the redrawn weights differ from the prepared model's (another torch's "
            "generator?); comparisons still hold, both sides run the same weights"
        )
    print(f"gpu check: tiny model at {folder}: {note}", flush=True)
    return {"ANYLOGITS_CACHE_DIR": str(cache)}


def bench(path: Path | None, device: str) -> dict[str, Any]:
    from benchmarks.bench_gpu import VOCAB, run_benchmark, table

    # A dry run of this code on the CPU uses a small vocabulary.
    result = run_benchmark(device, vocab=VOCAB if device == "cuda" else 4_096)
    print(table(result), flush=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"gpu check: benchmark written to {path}", flush=True)
    return result


def run_all(out: Path | None, prepared: Path | None, steps: Sequence[str], device: str) -> int:
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"environment": environment(), "steps": {}}
    print("gpu check:", json.dumps(summary["environment"]), flush=True)

    def record(name: str, result: dict[str, Any]) -> None:
        # summary.json is rewritten as each step ends: a run stopped from outside keeps
        # what it did.
        summary["steps"][name] = result
        if out is not None:
            (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="anylogits-gpu-") as scratch:
        model_env = install_tiny_model(prepared, Path(scratch))
        env = child_environment(model_env or {})
        if model_env:  # the installed cache, nothing else: no second install, no override
            env.pop(TINY_MODEL_VARIABLE, None)
            env.pop("ANYLOGITS_VOCAB_DIR", None)
        if device != "cuda":
            env["ANYLOGITS_GPU_TEST_DEVICE"] = device
        if "tests" in steps:
            command = [
                python, "-m", "pytest", "tests/test_cuda.py", "tests/test_cuda_generate.py",
                "tests/test_kernels.py",
                "-q", "-rfEs",
                "-p", "no:cacheprovider",
                # Another transformers than the development machines' may warn: report,
                # do not fail (the project's pytest settings make warnings errors).
                "-W", "default",
            ]  # fmt: skip
            if out is not None:
                command.append(f"--junitxml={out / 'tests.xml'}")
                env["ANYLOGITS_GPU_REPORT"] = str(out / "syncs.json")
            record("tests", run_step("tests", command, env, _log(out, "tests")))
        if "demo" in steps:
            if model_env is None:
                record("demo", _skip("demo", NO_TINY_MODEL))
            else:
                command = [
                    python, "-m", "anylogits.cli", "demo", "--device", device, "--model",
                    "tiny", "--backend", "transformers", "--rounds", "1",
                ]  # fmt: skip
                record("demo", run_step("demo", command, env, _log(out, "demo")))
        if "vllm" in steps:
            if importlib.util.find_spec("vllm") is None:
                record("vllm", _skip("vllm", "vLLM is not installed here"))
            elif model_env is None:
                record("vllm", _skip("vllm", NO_TINY_MODEL))
            else:
                command = [
                    python, "-m", "pytest", "conformance_tests/test_vllm.py",
                    "conformance_tests/test_generation.py", "--backends=vllm", "-m", "",
                    "-q", "-rfEs", "-p", "no:cacheprovider", "-W", "default",
                ]  # fmt: skip
                record("vllm", run_step("vllm", command, env, _log(out, "vllm")))
        if "bench" in steps:
            path = out / "bench.json" if out is not None else Path(scratch) / "bench.json"
            command = [python, str(Path(__file__).resolve()), "--bench", str(path)]
            command += ["--device", device]
            record("bench", run_step("bench", command, env, _log(out, "bench")))
    failed = [
        name
        for name, step in summary["steps"].items()
        if "skipped" not in step and (step.get("returncode") != 0 or step.get("timed_out"))
    ]
    summary["failed"] = failed
    print("\n=== gpu check: summary")
    for name, step in summary["steps"].items():
        print(f"  {name:<6} {json.dumps(step)}")
    print(f"  {'FAILED: ' + ', '.join(failed) if failed else 'every step passed'}")
    if out is not None:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if failed else 0


def _skip(name: str, reason: str) -> dict[str, str]:
    print(f"\n=== gpu check: {name}: skipped: {reason}", flush=True)
    return {"skipped": reason}


def _log(out: Path | None, name: str) -> Path | None:
    return out / f"{name}.log" if out is not None else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/gpu_check.py",
        description="The GPU session: the CUDA tests, the demo on cuda, vLLM's levels "
        "(when installed) and the GPU benchmark. Without CUDA it says why and exits 0.",
    )
    parser.add_argument(
        "--prepare",
        type=Path,
        metavar="DIR",
        help="write the tiny model for a machine without network into DIR and exit "
        "(runs anywhere the tiny model builds; no GPU needed)",
    )
    parser.add_argument(
        "--tiny-model",
        type=Path,
        metavar="DIR",
        default=os.environ.get(TINY_MODEL_VARIABLE) or None,
        help=f"a folder --prepare wrote (default: ${TINY_MODEL_VARIABLE}; without it the "
        "tiny model comes from anylogits' cache)",
    )
    parser.add_argument("--out", type=Path, metavar="DIR", help="write every result here")
    parser.add_argument(
        "--bench", type=Path, metavar="OUT.json", help="run the benchmark alone, JSON to here"
    )
    parser.add_argument(
        "--steps",
        default=",".join(STEPS),
        help=f"the steps to run, comma-separated (default: {','.join(STEPS)})",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        help=argparse.SUPPRESS,  # "cpu": a check of this script's own code, no GPU needed
    )
    args = parser.parse_args(argv)
    if args.prepare is not None:
        from test_support.gpu_tiny_model import prepare, prepared_size

        folder = prepare(args.prepare)
        size = prepared_size(folder) / 2**20
        print(f"gpu check: tiny model prepared in {folder} ({size:.1f} MiB)")
        return 0
    steps = [step.strip() for step in args.steps.split(",") if step.strip()]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"--steps: unknown {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    if args.device == "cuda":
        reason = no_cuda_reason()
        if reason is not None:
            print(f"anylogits gpu check: skipped, no CUDA device here: {reason}; nothing ran.")
            return 0
    if args.bench is not None:
        bench(args.bench, args.device)
        return 0
    return run_all(args.out, args.tiny_model, steps, args.device)


if __name__ == "__main__":
    sys.exit(main())
