"""The asv benchmarks still run (one cheap parameter combination each) and report sane
ratios. Timings are not judged here: a benchmark is not a test."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asv_bench"))

from benchmarks.bench_overhead import AdapterOverhead
from benchmarks.bench_processors import BatchScaling, ProcessorVsOracle
from benchmarks.bench_sequence import SequenceLengthScaling
from benchmarks.catalogue import ONE_ROW_ORACLES, ORACLES, PROCESSORS

from anylogits.engines.backends import BACKENDS, installed


def run(benchmark: object, method: str, *params: object) -> float:
    benchmark.setup(*params)  # type: ignore[attr-defined]
    value = getattr(benchmark, method)(*params)
    assert isinstance(value, float) and math.isfinite(value) and value > 0
    return value


INSTALLED = [name for name in BACKENDS if installed(name)]


@pytest.mark.parametrize("backend", INSTALLED)
def test_adapter_overhead_runs(backend: str) -> None:
    benchmark = AdapterOverhead()
    run(benchmark, "track_hook_over_direct", backend, 32_000, 1)
    benchmark.time_hook(backend, 32_000, 1)
    benchmark.time_direct(backend, 32_000, 1)


@pytest.mark.parametrize("oracle", [name for name in ORACLES if name in INSTALLED])
@pytest.mark.parametrize("processor", sorted(PROCESSORS))
def test_every_processor_oracle_runs_or_is_skipped(processor: str, oracle: str) -> None:
    try:
        run(ProcessorVsOracle(), "track_ours_over_oracle", processor, oracle, 32_000, 1)
    except NotImplementedError as error:  # asv's skip: this backend has no such sampler
        assert oracle != "transformers", error


def test_batch_scaling_runs_for_ours_and_the_peer() -> None:
    for implementation in ("anylogits", *(name for name in ORACLES if name in INSTALLED)):
        try:
            run(BatchScaling(), "track_b64_over_b1", "repetition_penalty", implementation)
        except NotImplementedError:  # asv's skip: samplers that take one row per call
            assert implementation in ONE_ROW_ORACLES


def test_sequence_scaling_runs_a_real_decoding_loop() -> None:
    run(SequenceLengthScaling(), "track_step_over_l128", "tracker", 1_024, 1)


def test_a_missing_backend_is_skipped_by_asv(monkeypatch: pytest.MonkeyPatch) -> None:
    import benchmarks.backends as backends

    monkeypatch.setattr(backends, "installed", lambda name: False)
    with pytest.raises(NotImplementedError, match="transformers is not installed"):
        AdapterOverhead().setup("transformers", 32_000, 1)


@pytest.mark.skipif("vllm" not in INSTALLED, reason="vllm is not installed")
def test_vllm_step_benchmarks_run() -> None:
    from benchmarks.bench_vllm import IMPLEMENTATIONS, VllmOverAdapter, VllmStep

    for implementation in IMPLEMENTATIONS:
        run(VllmStep(), "track_step_us", "logit_bias", implementation, 2)
    run(VllmOverAdapter(), "track_ours_over_adapter", "repetition_penalty", "distinct", 2)


def test_structured_benchmarks_run() -> None:
    pytest.importorskip("llguidance")
    from benchmarks.bench_structured import SchemaCompile, StructuredPerToken

    run(StructuredPerToken(), "track_ours_over_direct", 1)
    if importlib.util.find_spec("outlines") is not None:  # the transformers session has it
        run(StructuredPerToken(), "track_outlines_over_ours", 1)
    benchmark = SchemaCompile()
    benchmark.setup()
    assert benchmark.track_coverage() >= 125
    assert benchmark.track_compile_ms_per_schema() > 0


def test_engine_vs_native_transformers_runs() -> None:
    from benchmarks.bench_engine_transformers import EngineVsNativeTransformers

    run(EngineVsNativeTransformers(), "track_ours_over_native", "tiny", "repetition")


def test_continuous_batching_benchmark_runs() -> None:
    pytest.importorskip("transformers")
    from benchmarks.bench_engine_transformers_cb import ContinuousBatchingVsNative

    benchmark = ContinuousBatchingVsNative()
    try:
        run(benchmark, "track_ours_over_native", "tiny", 8)
    finally:
        benchmark.teardown("tiny", 8)  # its managers' threads


def test_engine_benchmarks_take_the_model_first() -> None:
    """Every end-to-end benchmark runs on the tiny and the real model (summary.py and
    the documentation's plot read the parameters in this order)."""
    import benchmarks.bench_engine_llama_cpp as llama_cpp
    import benchmarks.bench_engine_mlx as mlx
    import benchmarks.bench_engine_transformers as transformers
    import benchmarks.bench_engine_vllm as vllm
    from benchmarks import common

    assert common.MODELS == ["tiny", "real"]
    for benchmark in (
        transformers.EngineVsNativeTransformers,
        llama_cpp.EngineVsNativeLlamaCpp,
        mlx.EngineVsNativeMlx,
        vllm.EngineVsNativeVllm,
    ):
        assert benchmark.param_names == ["model", "job"]
        assert benchmark.params[0] == common.MODELS


def test_cost_at_limits_runs() -> None:
    from benchmarks.bench_limits import CostAtLimits

    run(CostAtLimits(), "track_at_limits_over_typical", "dry", 1)


def test_schema_corpus_measures_every_quantity_per_vocabulary() -> None:
    """``measure`` keys its times by vocabulary and takes each schema's quantities: both
    first masks once, every walk, the one-row walks :data:`ONE_ROW_REPEATS` times."""
    pytest.importorskip("llguidance")
    from benchmarks import bench_schema_corpus

    from test_support.schema_corpus import RealSchema

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    times = bench_schema_corpus.measure(["128k"], [RealSchema("test", "a", schema)])
    assert list(times) == ["128k"]
    found = times["128k"]
    for first in ("first_mask", "prompt_mask", "request_mask"):
        assert len(found[first][0]) == len(found[first][1]) == 1
    steps = len(found["mask_b32"][0])
    assert steps == len(found["mask_b32"][1]) > 0
    for walk in ("mask_b1", "mask_b1_in_place", "mask_b1_after_forward"):
        assert len(found[walk][0]) == bench_schema_corpus.ONE_ROW_REPEATS * steps


def test_schema_corpus_sides_walk_the_grammar_they_kept() -> None:
    """Both sides compile a schema once, at its first mask, and every walk copies that
    compiled grammar: copies share the lexer llguidance builds lazily, so a side that
    compiled afresh per walk would pay for that lexer where the other does not."""
    pytest.importorskip("llguidance")
    from benchmarks import bench_schema_corpus, schema_walks

    from anylogits.core.specs import BUILT_SPECS
    from anylogits.processors.structured import REQUEST_GRAMMARS, engine

    vocab = bench_schema_corpus._Vocab("128k")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    path = vocab.path(schema)
    assert path
    compiles = []
    fresh = vocab.matcher
    vocab.matcher = lambda schema: compiles.append(schema) or fresh(schema)
    schema_walks.first_mask_direct(vocab, schema)
    schema_walks.first_mask_ours(vocab, schema)
    ours_compiled = engine.COMPILED.stats().misses
    assert schema_walks.prompt_mask_direct(vocab, schema) > 0
    assert schema_walks.prompt_mask_ours(vocab, schema) > 0
    assert schema_walks.request_mask_direct(vocab, schema) > 0
    specs, grammars = BUILT_SPECS.stats(), REQUEST_GRAMMARS.stats()
    assert schema_walks.request_mask_ours(vocab, schema) > 0
    # Untimed: the client's check (vllm_xargs) builds the specs and makes the grammar;
    # the server admits the request once (its specs built to check them, then to run,
    # each finding the grammar). Timed: the specs found built, the grammar found once.
    assert BUILT_SPECS.stats().misses == specs.misses + 2
    assert BUILT_SPECS.stats().hits == specs.hits + 1
    assert REQUEST_GRAMMARS.stats().misses == grammars.misses + 1
    assert REQUEST_GRAMMARS.stats().hits == grammars.hits + 3
    for batch in (1, 32):
        assert len(schema_walks.walk_direct(vocab, schema, path, batch)) == len(path)
        assert len(schema_walks.walk_ours(vocab, schema, path, batch)) == len(path)
    schema_walks.requests_direct(vocab, [(schema, path)])
    assert compiles == [schema]
    assert engine.COMPILED.stats().misses == ours_compiled
    schema_walks.clear_compiled(vocab)
    assert not vocab.templates and not engine.COMPILED.stats().entries
    assert not BUILT_SPECS.stats().entries and not REQUEST_GRAMMARS.stats().entries


def test_every_corpus_measure_has_a_target_or_says_why_not() -> None:
    """summary.py's verdict of each measure of the corpus benchmark: a target, or the
    reason it has none."""
    from benchmarks import bench_schema_corpus
    from summary import CORPUS_TARGETS, CORPUS_WITHOUT_TARGET, corpus_verdict

    assert not set(CORPUS_TARGETS) & set(CORPUS_WITHOUT_TARGET)
    assert set(CORPUS_TARGETS) | set(CORPUS_WITHOUT_TARGET) == set(bench_schema_corpus.MEASURES)
    for measure in bench_schema_corpus.MEASURES:
        assert "target" in corpus_verdict({"vocab": "49k", "measure": measure}, 1.0, {})
