"""A processor and its transformers oracle as one case, and the checks every such pair
runs (the ``test_oracles_<module>`` files hold the pairs of their module).

Each pair is called the way transformers calls processors: ours through
``Pipeline([processor])(logits.clone(), input_ids)`` (what the transformers adapter
does), the oracle as ``oracle(input_ids, logits.clone())``, with ``input_ids`` a full
``(B, L)`` int64 history. Inputs vary batch size, vocabulary size, dtype (float32,
float16, bfloat16, float64) and sequence length. Logits come from a hypothesis-drawn
seed (not float by float, which is far slower); some draws round them to 0.5 steps (many
exact ties) and some set part of each row to ``-inf`` first, as a previous top-k would.
Results must be bit-identical (``torch.equal``, ``-inf`` positions included) unless a
case names another check. Every pair also has a test that it changes the logits (a no-op
cannot pass).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from anylogits import LogitsProcessor, Pipeline
from conformance_tests.comparisons import (
    DTYPES,
    NEG_INF,
    assert_identical,
    dtype_id,
    oracle_settings,
)
from conformance_tests.oracle_draws import Draw, HypothesisDraw, LogitSource, RandomDraw, draw_shape

BIG_VOCAB = 32000
SETTINGS = oracle_settings(80)

Check = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
CaseBuilder = Callable[..., "Case"]


@dataclass
class Case:
    ours: LogitsProcessor
    oracle: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    # (logits, input_ids) per call, in call order (several calls for MinNewTokens).
    steps: list[tuple[torch.Tensor, torch.Tensor]]
    check: Check = field(default=None)  # type: ignore[assignment]
    # Set by run_case, for the "does something" assertions: ours changed the logits at
    # some call; the oracle turned some finite logit into -inf at some call.
    changed: bool = False
    banned: bool = False


def run_case(case: Case) -> None:
    pipeline = Pipeline([case.ours])
    check = case.check or assert_identical
    for logits, ids in case.steps:
        assert ids.dtype == torch.int64 and ids.ndim == 2
        ours = pipeline(logits.clone(), ids)
        oracle = case.oracle(ids, logits.clone())
        assert ours.shape == logits.shape and ours.dtype == logits.dtype
        check(logits, ours, oracle)
        if not torch.equal(ours, logits):
            case.changed = True
        if bool(((oracle == NEG_INF) & (logits != NEG_INF)).any()):
            case.banned = True


def one_step(draw: Draw, dtype: torch.dtype, vocab: int | None, id_high: int | None = None):
    batch, vocab = draw_shape(draw, vocab)
    source = LogitSource(draw, batch, vocab, dtype)
    length = draw.int(1, 20)
    ids = source.ids(length, None if id_high is None else min(id_high, vocab))
    return vocab, [(source.next(), ids)]


def assert_matches(build: CaseBuilder, dtype: torch.dtype, data: st.DataObject) -> None:
    """One hypothesis-drawn case of ``build``, ours against the oracle."""
    run_case(build(HypothesisDraw(data), dtype))


def assert_matches_at_vocab_32000(build: CaseBuilder, name: str, dtype: torch.dtype) -> None:
    """Two seeded cases of ``build`` at a real model's vocabulary width."""
    for seed in range(2):
        run_case(build(RandomDraw(zlib.crc32(f"{name}/{seed}".encode())), dtype, BIG_VOCAB))


# Smallest share of generated cases in which the processor must change the logits. The
# draws include no-op settings (temperature 1, penalty 1, no suppressed ids, ...), hence
# not 1.0; the measured shares are far above these.
MIN_CHANGED_SHARE = 0.5


def generated_cases(build: CaseBuilder, count: int) -> list[Case]:
    """``count`` seeded cases of ``build``, every dtype in turn, each compared."""
    cases = [build(RandomDraw(seed), DTYPES[seed % 4]) for seed in range(count)]
    for case in cases:
        run_case(case)
    return cases


def assert_changes_logits(build: CaseBuilder, name: str, share: float = MIN_CHANGED_SHARE):
    """Guards against a no-op implementation: the generated inputs do get changed."""
    cases = generated_cases(build, 60)
    changed = sum(case.changed for case in cases) / len(cases)
    assert changed >= share, f"{name} changed only {changed:.0%} of cases"


@dataclass
class FixedExample:
    """A hand-written call whose result is known: ours and the oracle must both give it."""

    ours: LogitsProcessor
    oracle: Any
    logits: list
    ids: list[list[int]]
    expected: list

    def check(self) -> None:
        x = torch.tensor(self.logits)
        input_ids = torch.tensor(self.ids)
        expected = torch.tensor(self.expected)
        assert not torch.equal(expected, x)
        out = Pipeline([self.ours])(x.clone(), input_ids)
        assert torch.equal(out, expected), out
        assert torch.equal(self.oracle(input_ids, x.clone()), expected)


def assert_masked_copy(logits: torch.Tensor, out: torch.Tensor) -> None:
    """Every output entry is its input value or -inf (truncation only removes tokens)."""
    assert out.dtype == logits.dtype and out.shape == logits.shape
    assert bool(((out == logits) | (out == NEG_INF)).all())


def kept(out: torch.Tensor) -> torch.Tensor:
    return out != NEG_INF


class TransformersPairs:
    """The four checks every transformers pair of a module runs: a module's
    ``TestTransformersPairs(TransformersPairs)`` names its ``cases`` (name -> case
    builder) and ``fixed_examples``; ``name`` and ``example`` are parametrized from them."""

    cases: ClassVar[dict[str, CaseBuilder]]
    fixed_examples: ClassVar[dict[str, FixedExample]]
    # Smallest share of generated cases a processor must change, where not the default.
    changed_share: ClassVar[dict[str, float]] = {}

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "name" in metafunc.fixturenames:
            metafunc.parametrize("name", list(self.cases))
        if "example" in metafunc.fixturenames:
            metafunc.parametrize("example", list(self.fixed_examples))

    @pytest.mark.only_backend("transformers")
    @pytest.mark.support("oracle", backend="transformers")
    @pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
    @SETTINGS
    @given(data=st.data())
    def test_matches_transformers_oracle(
        self, name: str, dtype: torch.dtype, data: st.DataObject
    ) -> None:
        assert_matches(self.cases[name], dtype, data)

    @pytest.mark.only_backend("transformers")
    @pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
    def test_matches_transformers_oracle_at_vocab_32000(
        self, name: str, dtype: torch.dtype
    ) -> None:
        assert_matches_at_vocab_32000(self.cases[name], name, dtype)

    @pytest.mark.only_backend("transformers")
    def test_changes_logits_on_generated_inputs(self, name: str) -> None:
        share = self.changed_share.get(name, MIN_CHANGED_SHARE)
        assert_changes_logits(self.cases[name], name, share)

    @pytest.mark.only_backend("transformers")
    def test_fixed_example_changes_logits(self, example: str) -> None:
        self.fixed_examples[example].check()
