"""`anylogits demo`'s long steps on stderr: a spinner on a terminal, start and end lines
elsewhere, and the demo's error when transformers (its reference) is missing; and what
its stop-string case compares (the demo itself runs in conformance_tests/test_demo.py)."""

from __future__ import annotations

import importlib.util
import io
import re
import subprocess
import sys
import time
from unittest import mock

import pytest

from anylogits.cli.demo.cases import STOP, Case, demo_cases
from anylogits.cli.demo.measure import SAME, Cell, Reference, measure, timing_warning
from anylogits.cli.demo.progress import step
from anylogits.cli.demo.table import _ratio, _row, progress_text, render
from anylogits.installation import pip_install


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_step_is_a_start_line_and_an_end_line() -> None:
    stream = io.StringIO()
    with step("building", "first run: fetching a file", stream=stream):
        pass
    first, start, end = stream.getvalue().splitlines()
    assert (first, start) == ("first run: fetching a file", "building ...")
    assert re.fullmatch(r"building: done in \d+\.\d s", end)


def test_a_step_that_fails_says_so_and_lets_the_error_through() -> None:
    stream = io.StringIO()
    with pytest.raises(RuntimeError, match="boom"), step("starting", stream=stream):
        raise RuntimeError("boom")
    assert re.search(r"^starting: failed after \d+\.\d s$", stream.getvalue(), re.MULTILINE)


def test_on_a_terminal_a_spinner_rewrites_the_line_with_the_seconds_spent() -> None:
    stream = Terminal()
    with step("starting", stream=stream):
        deadline = time.monotonic() + 10
        while "\r" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    written = stream.getvalue()
    assert re.match(r"\r[|/\\-] starting \d+ s", written), written
    assert re.search(r"\rstarting: done in \d+\.\d s\x1b\[K\n$", written), written
    assert "starting ..." not in written  # no start line: the spinner is one


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is not None,
    reason="transformers is installed: the demo runs (conformance_tests/test_demo.py)",
)
def test_without_transformers_the_demo_names_the_command_that_adds_it() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "anylogits.cli", "demo"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "transformers, which is not installed" in result.stderr
    # In the form that works where this anylogits came from (here: a checkout).
    assert pip_install("transformers") in result.stderr
    assert '"anylogits[transformers]"' not in result.stderr  # not on the index yet


class Words:
    """A tokenizer's decode over a few words; 0 is the end of text."""

    words = ("<eos>", " Venus", ",", f" {STOP}", " Jupiter")

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.words[i] for i in ids if not (skip_special_tokens and i == 0))


@pytest.mark.parametrize("trained", [True, False])
def test_a_stop_string_is_compared_up_to_the_stop_and_only_if_generation_ended_there(
    trained: bool,
) -> None:
    # On random weights the stop is a word the demo's prompt made them say.
    cases = demo_cases([4, 2, 1, 2, 3], 0, tokenizer=Words(), vocab_size=5, trained=trained)
    [case] = [case for case in cases if case.label.startswith("StopStrings")]
    assert case.label == (f"StopStrings([{STOP!r}])" if trained else "StopStrings(['Venus'])")
    assert case.compared is not None
    stopped = [1, 2, 3] if trained else [1]
    # transformers ends on the stop's last token; anylogits forces the end of text next,
    # unless the token budget ran out at the stop.
    assert case.compared([*stopped, 0], {0}) == stopped
    assert case.compared(stopped, {0}) == stopped
    # A generation that went on past the stop is compared whole, so it differs.
    assert case.compared([*stopped, 2, 4, 0], {0}) == [*stopped, 2, 4, 0]
    assert case.compared([*stopped, 4], {0}) == [*stopped, 4]


def test_off_the_cpu_the_watermark_is_not_compared_with_transformers_own() -> None:
    # transformers draws its greenlists with the device's generator: on CUDA they are not
    # its CPU ones, while anylogits' are the same on every device.
    def watermark(device: str) -> Case:
        cases = demo_cases([4, 2, 1], 0, tokenizer=Words(), vocab_size=5, device=device)
        return next(case for case in cases if case.label.startswith("Watermark"))

    on_cpu, on_cuda = watermark("cpu"), watermark("cuda:0")
    assert on_cpu.job == {"watermarking_config": {"bias": 3.0}}
    assert on_cuda.job is None and "device's generator" in on_cuda.no_native
    assert on_cuda.outcome is not None  # its own tokens must still be detected


def test_a_step_can_say_what_it_found_on_its_last_line() -> None:
    stream = io.StringIO()
    with step("transformers 2/10 TopK(5)", stream=stream) as progress:
        progress.said = "same, 1.02x"
    assert re.fullmatch(
        r"transformers 2/10 TopK\(5\): same, 1\.02x \(\d+\.\d s\)",
        stream.getvalue().splitlines()[-1],
    )


def timed(spread: float | None, ours: float = 1e-3) -> Cell:
    return Cell([1], SAME, ours, 1e-3, None, None, spread)


def test_timings_of_a_quiet_machine_carry_no_warning() -> None:
    cells = [timed(0.05), timed(0.3), timed(0.1), timed(None)]
    assert timing_warning(cells, load=1.0, cores=2) is None
    assert timing_warning([timed(None)], load=8.0, cores=2) is None  # --rounds 0: no timings


def test_runs_that_differ_or_a_busy_machine_are_a_warning() -> None:
    noisy = timing_warning([timed(0.4), timed(0.35), timed(0.1)], load=None, cores=2)
    assert noisy is not None and "differed by 35%" in noisy and "within about 35%" in noisy
    busy = timing_warning([timed(0.05)], load=3.5, cores=2)
    assert busy is not None and "load average up to 3.5 on 2 cores" in busy


def test_the_warning_is_printed_under_the_table() -> None:
    lines, _ = render([], ["transformers", "vllm"], {}, [], lambda ids: "", warning="WARNING: busy")
    assert lines[-3:] == ["WARNING: busy", "", "all engines agree with transformers"]


def test_transformers_alone_is_not_called_all_engines() -> None:
    lines, _ = render([], ["transformers"], {}, [], lambda ids: "")
    assert lines[-1] == (
        "anylogits agrees with transformers' own processors; no other engine ran to compare"
    )


def test_a_cell_s_progress_line_has_its_verdict_and_costs() -> None:
    assert progress_text(timed(0.1, ours=2e-3)) == "same, 2.00 vs 1.00 ms/token native, 2.00x"
    no_native = Cell([1], SAME, 2e-3, None, "json schema", None, 0.1)
    assert progress_text(no_native) == "same, 2.00 ms/token, no native"


def test_a_ratio_within_the_runs_spread_is_called_noise() -> None:
    """A ratio shows where the runs' spread lets it say something; within the spread of
    1.00x, or from one run a side (which has no spread: never "differed by 0%"), it is
    "noisy" in the table and "too noisy to tell" in the progress line."""
    assert _ratio(timed(0.1, ours=2e-3)) == "2.00x"
    assert _ratio(timed(0.3, ours=1.2e-3)) == "noisy"
    assert progress_text(timed(0.3, ours=1.2e-3)).endswith(
        "1.20x, too noisy to tell (this case's runs differed by 30%; the best of each side counts)"
    )
    assert progress_text(timed(None, ours=2e-3)).endswith(
        "2.00x, too noisy to tell (one run a side)"
    )
    assert timing_warning([timed(None)], load=None, cores=2) is None


def test_a_side_timed_alone_is_marked_noisy_where_its_runs_differed() -> None:
    """An unprocessed baseline (native only) or a job with no native (ours only) has no
    ratio; its cost still reads noisy where its runs differed by more than the warning's
    threshold, in the table and the progress line."""
    baseline = Cell([1], SAME, None, 85.78e-3, None, None, 0.5)
    assert progress_text(baseline) == (
        "same, 85.78 ms/token, too noisy to tell (this case's runs differed by 50%; the "
        "best of each side counts)"
    )
    reference = Reference([1], False, [1], 1, [1])
    (row,) = _table_row("llama_cpp", baseline, reference)
    assert row.rstrip().endswith("85.78  noisy"), row
    quiet = Cell([1], SAME, None, 25e-3, None, None, 0.05)
    assert progress_text(quiet) == "same, 25.00 ms/token"
    assert not _table_row("llama_cpp", quiet, reference)[0].rstrip().endswith("noisy")
    alone = Cell([1], SAME, 30e-3, None, "json schema", None, 0.9)
    assert _table_row("llama_cpp", alone, reference)[0].rstrip().endswith("noisy")


def _table_row(engine: str, cell: Cell, reference: Reference) -> list[str]:
    return [_row(engine, cell, reference, lambda ids: "")]


def test_one_run_a_side_has_no_spread() -> None:
    engine = mock.Mock(name="engine")
    engine.name = "transformers"
    engine.greedy.return_value = [1, 2]
    engine.native.return_value = [1, 2]
    case = mock.Mock(sample=False, unprocessed=False, compared=None, outcome=None, job={})
    reference = Reference([1, 2], False, [0], 2, [1])
    assert measure(engine, case, reference, rounds=1).spread is None
    assert measure(engine, case, reference, rounds=2).spread is not None
