"""check_processor on the core pipeline (no backend): the catalogue passes, processors
that break the contract fail with a message naming where, the scenario, row and column."""

from __future__ import annotations

import re

import pytest
import torch

from anylogits import LogitsProcessor, Pipeline, RepetitionPenalty, Temperature
from anylogits.testing import check_processor
from anylogits.testing.check import (
    SCENARIOS,
    _check_core,
    _copier,
    check_processor_on,
    record_scenarios,
)
from test_support.broken import BROKEN, IgnoresRows, KeysStateByRow, MutatesState
from test_support.catalogue import PROCESSOR_SPECS, build


@pytest.mark.parametrize("name", sorted(PROCESSOR_SPECS))
def test_every_catalogue_processor_passes_on_the_core_pipeline(name: str) -> None:
    done = check_processor(build(name), backends=())
    for scenario in [*SCENARIOS, "rows permuted", "random forks and rollbacks"]:
        for dtype in ("float32", "float16", "bfloat16"):
            assert any(line.startswith(f"core: {scenario}") and dtype in line for line in done)
    assert done[-1].startswith("spec round trip")


@pytest.mark.parametrize(
    ("broken", "scenario"),
    [
        (MutatesState, "beam fork/reorder"),
        (KeysStateByRow, "beam fork/reorder"),
        (IgnoresRows, "beam fork/reorder"),
    ],
)
def test_a_broken_processor_fails_naming_where_and_the_scenario(
    broken: type[LogitsProcessor], scenario: str
) -> None:
    with pytest.raises(AssertionError) as failure:
        check_processor(broken(), backends=())
    message = str(failure.value)
    assert f"check_processor({broken.__name__}())" in message
    assert "failed on the core pipeline" in message
    assert f"scenario {scenario!r}" in message
    assert "float32, call " in message and ", row " in message and ", column " in message
    assert "the row replayed alone from its prompt by a fresh processor" in message


def test_every_broken_processor_is_listed() -> None:
    assert set(BROKEN.values()) == {MutatesState, KeysStateByRow, IgnoresRows}


class Unregistered(LogitsProcessor):
    """No spec_name: copied with copy.deepcopy, no spec round trip."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def process(self, logits: torch.Tensor, batch: object) -> torch.Tensor:
        return logits.mul_(self.scale)


def test_a_processor_without_a_spec_name_is_checked_from_copies() -> None:
    done = check_processor(Unregistered(0.5), backends=())
    assert not any(line.startswith("spec round trip") for line in done)


def test_a_spec_that_does_not_rebuild_the_processor_fails() -> None:
    class LosesItsConfig(Temperature):
        spec_name = "testing.check.loses_its_config"

        def config(self) -> dict[str, float]:
            return {"temperature": 1.0}  # forgets the temperature given

    with pytest.raises(AssertionError, match="spec round trip"):
        check_processor(LosesItsConfig(0.5), backends=())


def test_unknown_backends_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        check_processor(RepetitionPenalty(1.2), backends=["nope"])


def test_check_processor_leaves_the_processor_given_unused() -> None:
    processor = build("stateful_probe")
    check_processor(processor, backends=())
    assert (processor.init_calls, processor.advance_calls) == (0, 0)


def test_each_scenario_on_its_own_catches_the_broken_processors() -> None:
    """Not only the first scenario: every one that forks, rolls back or moves rows fails
    them (a mutated state needs a fork or a rollback to show)."""
    for broken in (MutatesState, KeysStateByRow, IgnoresRows):
        fresh = _copier(broken())
        scenarios, truth = record_scenarios(fresh, None)
        for scenario in scenarios:
            if broken is MutatesState and scenario.name == "row moves/swaps":
                continue  # no fork, no rollback: every state has one owner
            with pytest.raises(AssertionError, match=re.escape(f"scenario {scenario.name!r}")):
                _check_core(broken(), fresh, None, [scenario], truth, [torch.float32])


class PipelineBackend:
    """A backend handed in as an object: its hook is the core pipeline."""

    name = "pipeline"
    dtypes = (torch.float32,)
    max_batch = None
    preserves_logits = False

    def hook(self, processors: list[LogitsProcessor], tokenizer: object = None) -> Pipeline:
        return Pipeline(processors)

    def call(self, hook: Pipeline, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return hook(logits, token_ids)


def test_the_check_runs_on_backends_handed_in() -> None:
    done = check_processor_on(RepetitionPenalty(1.2), [PipelineBackend()])
    assert "pipeline: beam fork/reorder, torch.float32" in done
    assert not any(line.startswith("pipeline:") and "float16" in line for line in done)
    with pytest.raises(AssertionError, match="failed on backend 'pipeline', scenario "):
        check_processor_on(IgnoresRows(), [PipelineBackend()])


def test_check_processor_is_the_engines_front_of_the_check() -> None:
    """``anylogits.testing.check_processor`` names backends, so it is defined above the
    engines; what it checks comes from the check below them."""
    import anylogits.testing
    from anylogits.engines import check_backends

    assert anylogits.testing.check_processor is check_backends.check_processor
    assert "check_processor" in dir(anylogits.testing)
