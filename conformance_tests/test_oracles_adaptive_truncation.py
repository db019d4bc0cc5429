"""anylogits.processors.adaptive_truncation (typical, epsilon, eta, top-h, top-n-sigma)
against their native oracles (XTC: ``test_oracles_xtc``).

Oracles, on identical inputs:

* transformers ``TypicalLogitsWarper``, ``EpsilonLogitsWarper``, ``EtaLogitsWarper`` and
  ``TopHLogitsWarper``, called as ``oracle(input_ids, logits.clone())`` on hypothesis-drawn
  logits (float32, float16, bfloat16, float64; batch 1-6; widths 2-300 and 32000; many
  exact ties; rows partly ``-inf``). transformers has no top-n-sigma or XTC warper.
* llama.cpp's own samplers through llama-cpp-python's ctypes API
  (``llama_sampler_init_typical`` / ``_top_n_sigma`` + ``llama_sampler_apply`` on a
  ``llama_token_data_array`` built from one float32 row). mlx-lm has none of these.

Results must be identical (``torch.equal``, ``-inf`` positions included) except where a
tolerance is stated next to the check that applies it:

* ``TypicalP`` vs transformers and llama.cpp: tokens whose probability mass ranked
  before them lies within float rounding of ``mass`` (see ``typical_band``), and, for
  transformers with ``min_tokens_to_keep > 1``, tokens tied in rank with the last
  protected one (ours protects the whole tie, its unstable sort only some).
* ``TopH`` vs transformers: ours keeps every token tied with the last kept logit; the
  oracle's top-k order may cut such a tie. Nothing else may differ.
* ``TopNSigma`` vs llama.cpp: tokens within the rounding of llama.cpp's sequential float32
  sums of the threshold (see ``_check_top_n_sigma``).

Semantic differences between the oracles, pinned by the ``test_known_difference_*``
tests:

* typical: llama.cpp stops once the running mass is ``> p``, transformers (and ours) once
  it is ``>= p``; llama.cpp's ``std::sort`` cuts rank ties, transformers keeps them; its
  entropy is NaN when a probability is 0 (``0 * log 0``), so rows with ``-inf`` or
  underflowing probabilities are not comparable. ``p >= 1`` is "off" in llama.cpp
  (transformers rejects it; ours keeps everything).
* top-n-sigma: llama.cpp treats ``n <= 0`` as off (we reject it) and excludes ``-inf``
  logits from the mean and deviation, like ours.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

from anylogits import LogitsProcessor
from anylogits.processors.adaptive_truncation import (
    EpsilonCutoff,
    EtaCutoff,
    TopH,
    TopNSigma,
    TypicalP,
)
from conformance_tests.comparisons import (
    DTYPES,
    NEG_INF,
    assert_identical,
    dtype_id,
    oracle_settings,
)
from conformance_tests.llama_cpp_rows import (
    LLAMA_VOCAB,
    SEEDS,
    llama_cpp_apply,
    ours,
    ours_row,
    random_row,
)
from conformance_tests.transformers_cases import assert_masked_copy, kept

SPECIAL_VOCABS = (2, 3, 5, 17, 63, 64, 65, 100, 101, 255, 256, 257, 300)
BIG_VOCAB = 32000

SETTINGS = oracle_settings(30)


# --------------------------------------------------------------------------------------
# Drawing inputs: hypothesis (shrinking) or a seeded random.Random (fixed large cases)
# --------------------------------------------------------------------------------------


class Draw:
    def __init__(self, data: st.DataObject | None = None, seed: int = 0) -> None:
        self.data, self.rng = data, random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi)) if self.data else self.rng.randint(lo, hi)

    def choice(self, values: Sequence[Any]) -> Any:
        values = list(values)
        return self.data.draw(st.sampled_from(values)) if self.data else self.rng.choice(values)

    def float(self, lo: float, hi: float) -> float:
        if self.data:
            return self.data.draw(st.floats(lo, hi))
        return self.rng.uniform(lo, hi)


def draw_logits(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> torch.Tensor:
    """``(B, V)`` logits from a drawn seed: normal, rounded to 0.5 steps (exact ties in
    every dtype), and/or with each row's tail set to -inf as after a previous top-k."""
    batch = draw.int(1, 6)
    if vocab is None:
        vocab = draw.choice((*SPECIAL_VOCABS, None)) or draw.int(2, 300)
    generator = torch.Generator().manual_seed(draw.int(0, 2**32 - 1))
    kind = draw.choice(("normal", "ties", "neg_inf", "ties_neg_inf"))
    scale = draw.choice((0.5, 2.0, 8.0))
    x = torch.randn(batch, vocab, generator=generator, dtype=torch.float64) * scale
    if "ties" in kind:
        x = (x * 2).round() / 2
    if "neg_inf" in kind:
        keep = torch.randint(1, vocab + 1, (batch, 1), generator=generator)
        ranks = x.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1)
        x = x.masked_fill(ranks >= keep, NEG_INF)
    return x.to(dtype)


# --------------------------------------------------------------------------------------
# transformers
# --------------------------------------------------------------------------------------

Check = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass
class Case:
    ours: LogitsProcessor
    oracle: Any
    logits: torch.Tensor
    check: Check = assert_identical


def typical_ranks(logits: torch.Tensor) -> torch.Tensor:
    """The rank key ``|-log p - H|`` in the logits' dtype, as transformers computes it."""
    normalized = torch.log_softmax(logits, dim=-1)
    entropy = -(normalized * normalized.exp()).nansum(-1, keepdim=True)
    return ((-normalized) - entropy).abs()


def mass_ranked_before(logits: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """``(B, V)`` float64 probability (from the exact inputs) of the tokens ranked strictly
    before each token: the quantity both sides compare with ``mass``, each in its own
    rounding."""
    p = torch.softmax(logits.double(), dim=-1)
    ranks = ranks.double()  # exact: same order, same ties
    order = ranks.argsort(dim=-1, stable=True)
    sorted_ranks = ranks.gather(-1, order).contiguous()
    before = p.gather(-1, order).cumsum(-1) - p.gather(-1, order)
    # First position (ascending rank) of each token's tie group.
    first = torch.searchsorted(sorted_ranks, ranks.contiguous(), side="left")
    return before.gather(-1, first.clamp(max=ranks.shape[-1] - 1))


def typical_band(dtype: torch.dtype, vocab: int) -> float:
    """How far from ``mass`` (in exact mass) the kept sets may legitimately differ.

    1e-5: ours sums float32 probabilities (float64 for float64 logits) whose rounding
    is a few 2**-24 relative; torch's CPU cumsum accumulates in double; llama.cpp sums
    float32 sequentially (at V = 2000 its error measured up to 7e-7). Half dtypes add
    the oracle's own rounding, as for TopP: its softmax and cumsum output are in the
    logits' dtype and ``mass`` is cast to it (eps in all), plus half a subnormal per
    underflowing probability.
    """
    band = 1e-5
    if dtype in (torch.float16, torch.bfloat16):
        subnormal = {torch.float16: 2.0**-24, torch.bfloat16: 2.0**-133}[dtype]
        band += torch.finfo(dtype).eps + vocab * subnormal / 2
    return band


def check_typical(mass: float, min_tokens_to_keep: int) -> Check:
    def check(logits: torch.Tensor, ours: torch.Tensor, oracle: torch.Tensor) -> None:
        assert_masked_copy(logits, ours)
        assert_masked_copy(logits, oracle)
        ranks = typical_ranks(logits)
        finite = logits != NEG_INF
        # Ours keeps whole rank ties: every finite token ranked no worse than a kept one.
        worst = torch.where(kept(ours), ranks, -torch.inf).amax(-1, keepdim=True)
        assert torch.equal(kept(ours), (ranks <= worst) & finite)
        if torch.equal(ours, oracle):
            return
        band = typical_band(logits.dtype, logits.shape[-1])
        near = (mass_ranked_before(logits, ranks) - mass).abs() <= band
        k = min(min_tokens_to_keep, logits.shape[-1])
        protected_rank = ranks.topk(k, -1, largest=False).values[:, -1:]
        protected_tie = (ranks == protected_rank) if k > 1 else torch.zeros_like(near)
        only_ours = kept(ours) & ~kept(oracle)
        only_oracle = kept(oracle) & ~kept(ours)
        bad = (only_ours & ~(near | protected_tie)) | (only_oracle & ~near)
        assert not bool(bad.any()), f"TypicalP differs off the band at {bad.nonzero().tolist()}"

    return check


def check_top_h(logits: torch.Tensor, ours: torch.Tensor, oracle: torch.Tensor) -> None:
    """Ours = the oracle's kept set plus the tokens tied with its lowest kept logit."""
    assert_masked_copy(logits, ours)
    assert_masked_copy(logits, oracle)
    lowest = torch.where(kept(oracle), logits, torch.inf).amin(-1, keepdim=True)
    expected = kept(oracle) | ((logits == lowest) & (logits != NEG_INF))
    assert torch.equal(kept(ours), expected), (kept(ours) ^ expected).nonzero().tolist()


def case_typical(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    from transformers.generation.logits_process import TypicalLogitsWarper

    logits = draw_logits(draw, dtype, vocab)
    mass = draw.choice((0.2, 0.5, 0.9, 0.95, 0.99, None)) or draw.float(1e-3, 0.999)
    m = draw.choice((1, 1, 1, 2, 3, 70, logits.shape[-1] + 3))
    oracle = TypicalLogitsWarper(mass, min_tokens_to_keep=m)
    return Case(TypicalP(mass, m), oracle, logits, check_typical(mass, m))


def case_epsilon(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    from transformers.generation.logits_process import EpsilonLogitsWarper

    logits = draw_logits(draw, dtype, vocab)
    epsilon = draw.choice((3e-4, 9e-4, 0.01, 0.05, 0.2, None)) or draw.float(1e-6, 0.999)
    m = draw.choice((1, 1, 2, 5, logits.shape[-1] + 3))
    oracle = EpsilonLogitsWarper(epsilon, min_tokens_to_keep=m)
    return Case(EpsilonCutoff(epsilon, m), oracle, logits)


def case_eta(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    from transformers.generation.logits_process import EtaLogitsWarper

    logits = draw_logits(draw, dtype, vocab)
    epsilon = draw.choice((3e-4, 2e-3, 4e-3, 0.05, 0.3, None)) or draw.float(1e-6, 0.999)
    m = draw.choice((1, 1, 2, 5, logits.shape[-1] + 3))
    return Case(EtaCutoff(epsilon, m), EtaLogitsWarper(epsilon, min_tokens_to_keep=m), logits)


def case_top_h(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    from transformers.generation.logits_process import TopHLogitsWarper

    logits = draw_logits(draw, dtype, vocab)
    top_h = draw.choice((0.1, 0.4, 0.7, 1.0, None)) or draw.float(1e-3, 1.0)
    return Case(TopH(top_h), TopHLogitsWarper(top_h), logits, check_top_h)


CASES: dict[str, Callable[..., Case]] = {
    "TypicalP": case_typical,
    "EpsilonCutoff": case_epsilon,
    "EtaCutoff": case_eta,
    "TopH": case_top_h,
}


def run_case(case: Case) -> tuple[bool, bool]:
    """Compare; return (ours changed the logits, the oracle did)."""
    ids = torch.zeros(case.logits.shape[0], 1, dtype=torch.int64)
    mine = ours(case.ours, case.logits)
    oracle = case.oracle(ids, case.logits.clone())
    case.check(case.logits, mine, oracle)
    return not torch.equal(mine, case.logits), not torch.equal(oracle, case.logits)


@pytest.fixture(scope="module")
def transformers_installed() -> None:
    pytest.importorskip("transformers")


@pytest.mark.only_backend("transformers")
@pytest.mark.support("oracle", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", list(CASES))
@SETTINGS
@given(data=st.data())
def test_matches_transformers(
    transformers_installed: None, name: str, dtype: torch.dtype, data: st.DataObject
) -> None:
    run_case(CASES[name](Draw(data), dtype))


@pytest.mark.only_backend("transformers")
@pytest.mark.support("oracle", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_transformers_at_vocab_32000(
    transformers_installed: None, name: str, dtype: torch.dtype
) -> None:
    for seed in range(2):
        run_case(CASES[name](Draw(seed=zlib.crc32(f"{name}/{seed}".encode())), dtype, BIG_VOCAB))


@pytest.mark.only_backend("transformers")
@pytest.mark.parametrize("name", list(CASES))
def test_transformers_cases_do_truncate(transformers_installed: None, name: str) -> None:
    """Guards against vacuous agreement: most generated cases change the logits, on both
    sides (the draws include settings that keep everything, hence not all)."""
    outcomes = [run_case(CASES[name](Draw(seed=seed), DTYPES[seed % 4])) for seed in range(60)]
    for side, index in (("ours", 0), ("the oracle", 1)):
        changed = sum(outcome[index] for outcome in outcomes) / len(outcomes)
        assert changed >= 0.5, f"{name}: {side} changed only {changed:.0%} of cases"


# --------------------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------------------


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.support("oracle", processor="typical_p", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("p", [0.2, 0.5, 0.9, 0.95])
def test_typical_matches_llama_cpp(seed: int, p: float) -> None:
    logits = random_row(seed)
    expected = llama_cpp_apply(lambda lib: lib.llama_sampler_init_typical(p, 1), logits)
    assert np.isfinite(expected).sum() < LLAMA_VOCAB  # it truncates: the test can fail
    got = ours_row(TypicalP(p), logits)
    # Tolerance: see typical_band (llama.cpp sums float32 probabilities sequentially).
    check_typical(p, 1)(*(torch.from_numpy(a)[None] for a in (logits, got, expected)))


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.support("oracle", processor="top_n_sigma", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [0.5, 1.0, 2.0, 3.0])
@pytest.mark.parametrize("with_neg_inf", [False, True], ids=["finite", "neg_inf"])
def test_top_n_sigma_matches_llama_cpp(seed: int, n: float, with_neg_inf: bool) -> None:
    logits = random_row(seed)
    if with_neg_inf:  # excluded from the mean and deviation by both
        logits[np.random.default_rng(seed + 1).random(LLAMA_VOCAB) < 0.3] = -np.inf
    expected = llama_cpp_apply(lambda lib: lib.llama_sampler_init_top_n_sigma(n), logits)
    assert np.isfinite(expected).sum() < np.isfinite(logits).sum()
    _check_top_n_sigma(logits, ours_row(TopNSigma(n), logits), expected, n)


def _check_top_n_sigma(logits: np.ndarray, got: np.ndarray, expected: np.ndarray, n: float):
    """Tolerance: a token may differ only if its logit is within llama.cpp's rounding of
    the exact threshold. Its mean and deviation are sequential float32 sums of V terms,
    whose worst-case relative error is V * 2**-24 (1.2e-4 at V = 2000); ours are
    pairwise float32 sums, far tighter."""
    finite = logits[np.isfinite(logits)].astype(np.float64)
    sigma = finite.std()
    threshold = finite.max() - n * sigma
    tolerance = LLAMA_VOCAB * 2.0**-24 * (abs(finite.max()) + n * sigma)
    differ = got != expected
    assert differ.sum() <= 2, np.nonzero(differ)  # a handful at most, not a shifted band
    unexplained = differ & (np.abs(logits - threshold) > tolerance)
    assert not unexplained.any(), np.nonzero(unexplained)
    np.testing.assert_array_equal(got[np.isfinite(got)], logits[np.isfinite(got)])


@pytest.mark.only_backend("llama_cpp")
def test_top_n_sigma_uses_the_population_deviation_like_llama_cpp() -> None:
    """Logits 0 and 1: population sigma 0.5 (sample sigma 0.71). With n = 1.6 the
    threshold is 1 - 0.8 = 0.2, so token 0 goes; with the sample deviation it would stay.
    This is where the tolerance above could not tell the two apart."""
    logits = np.array([0.0, 1.0], dtype=np.float32)
    expected = llama_cpp_apply(lambda lib: lib.llama_sampler_init_top_n_sigma(1.6), logits)
    np.testing.assert_array_equal(expected, [-np.inf, 1.0])
    np.testing.assert_array_equal(ours_row(TopNSigma(1.6), logits), expected)


@pytest.mark.only_backend("llama_cpp")
def test_known_difference_typical_llama_cpp_stops_after_the_mass() -> None:
    """Probabilities 1/2, 1/4, 1/8, 1/8 (exact in float32): entropy 1.75 ln 2, ranks
    0.75, 0.25, 1.25, 1.25 (times ln 2), so the 1/4 token comes first, with a running mass
    of exactly 0.25. With p = 0.25, ours (like transformers) stops there (``>= p``);
    llama.cpp needs ``> p`` and also keeps the 1/2 token."""
    logits = np.log(np.array([0.5, 0.25, 0.125, 0.125])).astype(np.float32)
    assert torch.softmax(torch.from_numpy(logits), -1).tolist() == [0.5, 0.25, 0.125, 0.125]
    expected = llama_cpp_apply(lambda lib: lib.llama_sampler_init_typical(0.25, 1), logits)
    got = ours_row(TypicalP(0.25), logits)
    assert np.isfinite(got).tolist() == [False, True, False, False]
    assert np.isfinite(expected).tolist() == [True, True, False, False]
