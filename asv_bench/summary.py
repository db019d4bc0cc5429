"""Print the ratios of the newest asv run as a table, with issue #3's targets.

Usage (from asv_bench/, after `asv run`): python summary.py [RESULTS_DIR]
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from asv.results import Results

Params = dict[str, str]
Verdict = Callable[[Params, float, dict[str, float]], str]


def newest_result(results_dir: Path) -> Path:
    files = [p for p in results_dir.glob("*/*.json") if p.name != "machine.json"]
    if not files:
        raise SystemExit(f"no asv results under {results_dir}: run `asv run` first")
    return max(files, key=lambda p: p.stat().st_mtime)


def rows(result: Results, key: str) -> Iterator[tuple[Params, float]]:
    names = _param_names(key)
    params = result.get_result_params(key)
    values = result.get_result_value(key, params)
    for combination, value in zip(itertools.product(*params), values, strict=True):
        if value is not None and math.isfinite(value):  # skipped combinations are NaN
            labels = {name: raw.strip("'") for name, raw in zip(names, combination, strict=True)}
            yield labels, float(value)


def _param_names(key: str) -> list[str]:
    return {
        "AdapterOverhead": ["backend", "vocab", "batch"],
        "ProcessorVsOracle": ["processor", "oracle", "vocab", "batch"],
        "BatchScaling": ["processor", "implementation"],
        "SequenceLengthScaling": ["target", "length", "batch"],
        "VllmStep": ["processor", "implementation", "batch"],
        "VllmOverAdapter": ["processor", "implementation", "batch"],
        "StructuredPerToken": ["batch"],
        "SchemaCompile": [],
        "CostAtLimits": ["processor", "batch"],
    }[key.split(".")[-2]]


def overhead_verdict(params: Params, ratio: float, extra: dict[str, float]) -> str:
    if params["vocab"] != "128256" or params["batch"] != "1":
        return ""
    extra_us = extra[params_key(params)]
    direct_us = extra_us / (ratio - 1) if ratio != 1 else float("inf")
    met = extra_us <= 0.10 * direct_us + 10
    return f"target <=1.10x+10us: {'met' if met else 'NOT met'} ({extra_us:+.1f} us)"


def batch_verdict(params: Params, ratio: float, extra: dict[str, float]) -> str:
    if params["implementation"] != "anylogits":
        return "peer"
    return f"target <=8x: {'met' if ratio <= 8 else 'NOT met'}"


def sequence_verdict(params: Params, ratio: float, extra: dict[str, float]) -> str:
    if params["length"] == "128":
        return ""
    if params["target"] == "tracker":
        return f"target flat (<=1.5x): {'met' if ratio <= 1.5 else 'NOT met'}"
    linear = int(params["length"]) / 128
    return f"target <=linear ({linear:.0f}x): {'met' if ratio <= linear else 'NOT met'}"


def params_key(params: Params) -> str:
    return ",".join(params.values())


TABLES: list[tuple[str, str, str | None, Verdict | None]] = [
    (
        "1. adapter overhead: hook / processor called directly (LogitBias)",
        "bench_overhead.AdapterOverhead.track_hook_over_direct",
        "bench_overhead.AdapterOverhead.track_overhead_us",
        overhead_verdict,
    ),
    (
        "2. ours / native oracle, same input (< 1: ours faster)",
        "bench_processors.ProcessorVsOracle.track_ours_over_oracle",
        None,
        None,
    ),
    (
        "3. batch scaling: time(B=64) / time(B=1), V=128k",
        "bench_processors.BatchScaling.track_b64_over_b1",
        None,
        batch_verdict,
    ),
    (
        "4. sequence length: per-step time(L) / time(L=128), V=32k",
        "bench_sequence.SequenceLengthScaling.track_step_over_l128",
        "bench_sequence.SequenceLengthScaling.track_step_us",
        sequence_verdict,
    ),
    (
        "5. vLLM step, V=128k: us per step (none / shared / distinct specs / vLLM's adapter)",
        "bench_vllm.VllmStep.track_step_us",
        None,
        None,
    ),
    (
        "6. vLLM step: ours / vLLM's AdapterLogitsProcessor (per-row loop), same run",
        "bench_vllm.VllmOverAdapter.track_ours_over_adapter",
        None,
        None,
    ),
    (
        "7. structured, V=128k: ours / llguidance direct per token (target 1.25 B=1, 1.5 B=32)",
        "bench_structured.StructuredPerToken.track_ours_over_direct",
        None,
        None,
    ),
    (
        "7b. structured, V=128k: outlines' JSON-schema processor / ours per token (target >= 5)",
        "bench_structured.StructuredPerToken.track_outlines_over_ours",
        "bench_structured.StructuredPerToken.track_ours_us",
        None,
    ),
    (
        "7c. structured, V=128k: outlines / llguidance direct (the ceiling of 7b for any "
        "llguidance-based processor)",
        "bench_structured.StructuredPerToken.track_outlines_over_direct",
        None,
        None,
    ),
    (
        "8. structured: ms to compile + bind one MaskBench schema",
        "bench_structured.SchemaCompile.track_compile_ms_per_schema",
        None,
        None,
    ),
    (
        "9. per step at the cost limits / as typically configured, V=128k (extra: ms per "
        "step at the limits)",
        "bench_limits.CostAtLimits.track_at_limits_over_typical",
        "bench_limits.CostAtLimits.track_ms_per_step_at_limits",
        lambda params, ratio, extra: f"({extra[params_key(params)]:.2f} ms/step at the limits)",
    ),
]


def main(argv: list[str]) -> int:
    results_dir = Path(argv[1]) if len(argv) > 1 else Path(__file__).parent / ".asv" / "results"
    path = newest_result(results_dir)
    result = Results.load(str(path))
    print(f"asv results: {path}")
    known = set(result.get_all_result_keys())
    for title, key, extra_key, verdict in TABLES:
        print(f"\n## {title}")
        if key not in known:
            print("(not run)")
            continue
        extra = {}
        if extra_key in known:
            extra = {params_key(p): v for p, v in rows(result, extra_key)}
        for params, value in rows(result, key):
            label = " ".join(f"{name}={value}" for name, value in params.items())
            detail = (
                f"  ({extra[params_key(params)]:.1f} us/step)"
                if key.endswith("l128") and params_key(params) in extra
                else ""
            )
            note = verdict(params, value, extra) if verdict else ""
            print(f"{label:<62} {value:8.2f}{detail}  {note}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
