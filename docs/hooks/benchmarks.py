"""The benchmark page's plots and tables, drawn each time the site builds from the
committed snapshot ``docs/benchmarks/results.json`` (written by ``python
asv_bench/summary.py --export``): no number on the page is typed by hand.

The page marks where each piece goes with a comment line: ``<!-- benchmarks: source
-->`` (when, at which commit, on what machine), ``<!-- benchmarks: tables -->`` (every
table ``summary.py`` prints, with its verdicts) and ``<!-- benchmarks: figure NAME -->``
for each figure in :data:`FIGURES`. A figure whose benchmark is missing from the
snapshot says so instead of linking an image that does not exist.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

PAGE = "benchmarks/index.md"
SNAPSHOT = "benchmarks/results.json"
MARKER = re.compile(r"^<!-- benchmarks: (source|tables|figure [\w-]+) -->$", re.M)

Snapshot = dict[str, Any]
Series = dict[tuple[str, ...], float]

ENGINES = {
    "transformers": ("Transformers", "transformers\ngenerate"),
    "llama_cpp": ("LlamaCpp", "llama-cpp-python"),
    "mlx": ("Mlx", "mlx-lm\ngenerate_step"),
    "vllm": ("Vllm", "vLLM-CPU\n32 requests"),
}
JOBS = {"chain": "chain", "repetition": "repetition penalty alone", "json": "JSON schema"}
MODELS = {
    "tiny": "tiny model: random weights, 128k vocabulary (nearly free forward)",
    "real": "real model: SmolLM2-135M-Instruct (llama.cpp: its Q4_1 GGUF), 49k vocabulary",
}


def values(snapshot: Snapshot, key: str) -> Series:
    """One benchmark's values by their parameters (in the benchmark's order)."""
    return {
        tuple(row["params"].values()): row["value"] for row in snapshot["benchmarks"].get(key, [])
    }


def engine_vs_native(snapshot: Snapshot) -> Figure | None:
    """One panel per model (:data:`MODELS`), engines along x, one bar per job."""
    import numpy as np
    from matplotlib.figure import Figure

    ratios = {
        engine: values(
            snapshot, f"bench_engine_{engine}.EngineVsNative{name}.track_ours_over_native"
        )
        for engine, (name, _) in ENGINES.items()
    }
    models = [m for m in MODELS if any(key[0] == m for r in ratios.values() for key in r)]
    if not models:
        return None
    figure = Figure(figsize=(6 * len(models), 4.2), layout="constrained")
    panels = figure.subplots(1, len(models), squeeze=False, sharey=True)[0]
    top = max(value for r in ratios.values() for value in r.values())
    for axes, model in zip(panels, models, strict=True):
        engines = [e for e in ENGINES if any(key[0] == model for key in ratios[e])]
        jobs = [job for job in JOBS if any((model, job) in ratios[e] for e in engines)]
        width = 0.8 / len(jobs)
        positions = np.arange(len(engines))
        for index, job in enumerate(jobs):
            heights = [ratios[engine].get((model, job), np.nan) for engine in engines]
            bars = axes.bar(
                positions + (index - (len(jobs) - 1) / 2) * width,
                heights,
                width,
                label=JOBS[job],
                color=f"C{list(JOBS).index(job)}",
            )
            axes.bar_label(bars, fmt="%.2f", padding=2, fontsize=8)
        axes.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        axes.set_xticks(positions, [ENGINES[engine][1] for engine in engines])
        axes.set_ylim(0, max(1.4, top * 1.25))
        axes.set_title(MODELS[model], fontsize=10)
        axes.legend(frameon=False, fontsize=8, loc="upper left", ncols=len(jobs))
    panels[0].set_ylabel("anylogits / native, per generated token")
    figure.suptitle("End to end: < 1 means anylogits is faster than the engine's own sampler")
    return figure


def chain_cost(snapshot: Snapshot) -> Figure | None:
    from matplotlib.figure import Figure

    chain = values(snapshot, "bench_pipeline.PipelineChain.time_chain")
    floor = values(snapshot, "bench_pipeline.PipelineChain.time_floor")
    if not chain:
        return None
    vocabs = sorted({int(vocab) for vocab, _ in chain})
    batches = sorted({int(batch) for _, batch in chain})
    figure = Figure(figsize=(9, 3.8), layout="constrained")
    per_step, per_row = figure.subplots(1, 2)
    for colour, batch in enumerate(batches):
        for series, style, label in ((chain, "-o", "chain"), (floor, "--s", "floor")):
            seconds = [series.get((str(vocab), str(batch))) for vocab in vocabs]
            if None in seconds:
                continue
            line = {"label": f"{label}, B={batch}", "color": f"C{colour}"}
            per_step.plot(vocabs, [s * 1e3 for s in seconds], style, **line)
            per_row.plot(vocabs, [s * 1e6 / batch for s in seconds], style, **line)
    for axes in (per_step, per_row):
        axes.set_xticks(vocabs, [f"{vocab // 1000}k" for vocab in vocabs])
        axes.set_xlabel("vocabulary size")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
    per_step.set_ylabel("ms per decoding step")
    per_row.set_ylabel("µs per row (step / B)")
    per_step.legend(frameon=False, fontsize=8)
    figure.suptitle("The 5-processor chain and its floor, per call, by vocabulary and batch")
    return figure


FIGURES: dict[str, tuple[Callable[[Snapshot], Figure | None], str]] = {
    "engine-vs-native": (engine_vs_native, "anylogits against each engine's native sampling"),
    "chain-cost": (chain_cost, "per-call cost by vocabulary size and batch"),
}


def svg(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    # No date and fixed ids: the same snapshot draws the same bytes.
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def source(snapshot: Snapshot) -> str:
    machine = snapshot["machine"]
    environment = ", ".join(f"{name} {value}" for name, value in snapshot["environment"].items())
    text = (
        f"Snapshot of {snapshot['date']} (`docs/benchmarks/results.json`), commit "
        f"`{snapshot['commit'][:10]}`, on `{machine.get('machine', '?')}`: "
        f"{machine.get('cpu', '?')}, {machine.get('num_cpu', '?')} cores, "
        f"{machine.get('os', '?')}; {environment}."
    )
    # Benchmarks that run did not measure, kept from an earlier snapshot (summary.py --keep).
    runs: dict[tuple[str, str], list[str]] = {}
    for key, origin in snapshot.get("kept", {}).get("origin", {}).items():
        runs.setdefault((origin["date"], origin["commit"]), []).append(key.split(".")[-2])
    for (date, commit), names in sorted(runs.items()):
        listed = ", ".join(f"`{name}`" for name in sorted(set(names)))
        text += f" From an earlier run ({date}, commit `{commit[:10]}`): {listed}."
    return text


def tables(snapshot: Snapshot) -> str:
    parts = []
    for table in snapshot["tables"]:
        rows = table["rows"]
        names = list(rows[0]["params"]) if rows else []
        header = [*names, "value", "target"]
        lines = [
            f"**{table['title']}**",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for row in rows:
            note = ", ".join(part for part in (row["detail"], row["verdict"]) if part)
            cells = [*row["params"].values(), f"{row['value']:.2f}", note]
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def load(config: MkDocsConfig) -> Snapshot:
    snapshot: Snapshot = json.loads((Path(config.docs_dir) / SNAPSHOT).read_text())
    return snapshot


_drawn: dict[str, bool] = {}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "anylogits"
    from mkdocs.structure.files import File

    snapshot = load(config)
    for name, (draw, _) in FIGURES.items():
        figure = draw(snapshot)
        _drawn[name] = figure is not None
        if figure is not None:
            files.append(File.generated(config, f"benchmarks/{name}.svg", content=svg(figure)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    from mkdocs.exceptions import PluginError

    snapshot = load(config)
    missing = [f"figure {name}" for name in FIGURES if f"figure {name} -->" not in markdown]
    if missing or "benchmarks: tables" not in markdown or "benchmarks: source" not in markdown:
        raise PluginError(f"docs/{PAGE} lost a marker line: {missing or 'source or tables'}")

    def replace(match: re.Match[str]) -> str:
        what = match[1]
        if what == "source":
            return source(snapshot)
        if what == "tables":
            return tables(snapshot)
        name = what.removeprefix("figure ")
        if name not in FIGURES:
            raise PluginError(f"docs/{PAGE} asks for figure {name!r}; known: {sorted(FIGURES)}")
        if not _drawn.get(name):
            return "*(This benchmark is not in the snapshot.)*"
        return f"![{FIGURES[name][1]}]({name}.svg)"

    return MARKER.sub(replace, markdown)
