"""Every catalogue processor: documented with ``Args:`` and a runnable example (the
doctests run in this session), configured in the conformance catalogue (so the hook-level
tests run it on every backend), and round-tripped through a plain-JSON spec."""

from __future__ import annotations

import json

import pytest

import anylogits
from test_support.catalogue import (
    PROCESSOR_SPECS,
    VOCABULARY_SPECS,
    catalogue_classes,
)

CATALOGUE = catalogue_classes()


def test_the_catalogue_holds_the_peers_processors() -> None:
    assert len(CATALOGUE) >= 33
    assert {"xtc", "dry", "watermark", "stop_strings", "gen_length", "top_n_sigma"} <= set(
        CATALOGUE
    )


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_documented_with_args_and_an_example(name: str) -> None:
    doc = getattr(anylogits, CATALOGUE[name]).__doc__ or ""
    assert "Args:" in doc, f"{CATALOGUE[name]} has no Args: section"
    assert ">>> " in doc, f"{CATALOGUE[name]} has no runnable example"


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_conformance_spec_round_trips_through_json(name: str) -> None:
    spec = PROCESSOR_SPECS.get(name) or VOCABULARY_SPECS.get(name)
    assert spec is not None, f"test_support/catalogue.py has no {name} spec"
    processor = anylogits.from_spec(spec)
    assert type(processor) is getattr(anylogits, CATALOGUE[name])
    wire = json.loads(json.dumps(processor.to_spec()))
    assert wire == processor.to_spec()
    rebuilt = anylogits.from_spec(wire)
    assert type(rebuilt) is type(processor) and rebuilt.config() == processor.config()
