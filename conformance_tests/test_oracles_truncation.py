"""anylogits.processors.truncation (TopK, TopP, MinP) against each library's own:
transformers' warpers (hypothesis-drawn pairs, see ``transformers_cases``), llama.cpp's
``top_k`` / ``top_p`` / ``min_p`` samplers on float32 rows, and mlx-lm's ``apply_top_k`` /
``apply_top_p`` / ``apply_min_p`` (the same kept sets).

Results must be bit-identical except where a tolerance is stated next to the check that
applies it:

* ``TopP``: kept sets may differ at a tie on the boundary (ours keeps the whole tie) or
  for tokens whose mass lies within float rounding of ``top_p`` (see ``_check_top_p``).
* ``MinP`` with ``min_tokens_to_keep > 1``: which token of a tie at the k-th largest
  probability is protected may differ (see ``_check_min_p``).
* llama.cpp's top-k keeps exactly k candidates (ties cut arbitrarily); ours keeps every
  token tied with the k-th, like transformers. Compared on tie-free logits.

A divergence the property tests found (TopP(1.0)) was fixed; a fixed example pins it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("hypothesis")

from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from anylogits import LogitsProcessor, MinP, Pipeline, TopK, TopP
from conformance_tests.comparisons import NEG_INF, assert_identical, dtype_id
from conformance_tests.llama_cpp_rows import (
    LLAMA_VOCAB,
    SEEDS,
    llama_cpp_apply,
    ours_row,
    random_row,
)
from conformance_tests.mlx_rows import (
    MLX_VOCAB,
    kept_ids,
    mlx_logprobs,
    mlx_modules,
    mlx_row,
    ours_after,
)
from conformance_tests.oracle_draws import Draw, draw_min_tokens
from conformance_tests.transformers_cases import (
    Case,
    CaseBuilder,
    Check,
    FixedExample,
    TransformersPairs,
    assert_masked_copy,
    kept,
    one_step,
)


def mass_above(logits: torch.Tensor) -> torch.Tensor:
    """``(B, V)`` float64 probability mass of the tokens with a strictly larger logit.

    Computed in float64 from the exact input values; it is the quantity both
    implementations compare with ``top_p`` (each in its own rounding).
    """
    x = logits.double()
    p = torch.softmax(x, -1)
    order = x.argsort(dim=-1, descending=True, stable=True)
    xs, ps = x.gather(-1, order), p.gather(-1, order)
    exclusive = torch.cat([torch.zeros_like(ps[:, :1]), ps.cumsum(-1)[:, :-1]], -1)
    # First position (descending order) of each token's tie group.
    first = torch.searchsorted(-xs.contiguous(), -x.contiguous(), side="left")
    return exclusive.gather(-1, first.clamp(max=x.shape[-1] - 1))


def top_p_band(dtype: torch.dtype, vocab: int) -> float:
    """How far from ``top_p`` (in exact mass) the two kept sets may legitimately differ.

    1e-5: ours sums float32 probabilities (softmax in float32 whatever the logits dtype,
    so float64 logits are rounded to float32 first, at most ~40 * 2**-24 relative at our
    scales), the oracle sums its softmax ascending; both cumsums accumulate in double on
    CPU. Half dtypes add the oracle's own rounding, since its softmax *and* cumsum run in
    the logits dtype and ``1 - top_p`` is cast to it for the comparison: each probability
    is off by at most eps/2 relative (eps/2 in all) or half a subnormal when it underflows
    (vocab * subnormal / 2), the cumsum output and ``1 - top_p`` by eps/4 each (values
    below 1): eps + vocab * subnormal / 2 in all.
    """
    band = 1e-5
    if dtype in (torch.float16, torch.bfloat16):
        subnormal = {torch.float16: 2.0**-24, torch.bfloat16: 2.0**-133}[dtype]
        band += torch.finfo(dtype).eps + vocab * subnormal / 2
    return band


def make_top_p_check(top_p: float) -> Check:
    def check(logits: torch.Tensor, ours: torch.Tensor, oracle: torch.Tensor) -> None:
        _check_top_p(logits, ours, oracle, top_p)

    return check


def _check_top_p(logits: torch.Tensor, ours: torch.Tensor, oracle: torch.Tensor, top_p: float):
    """Tolerance for TopP (documented in its docstring), applied exactly:

    (a) ties at the boundary: ours keeps every token whose float32 probability equals
        that of the last kept one; the oracle's unstable sort may keep only some. So a
        token only we keep is allowed if its float32 probability (as ours computes it)
        equals the smallest float32 probability among the tokens the oracle kept.
    (b) rounding: a token kept by one side only is allowed if the exact mass of the
        tokens with a larger logit is within ``top_p_band`` of ``top_p`` (either side may
        round it across the boundary).
    Nothing else may differ, and kept values are the input values.
    """
    assert_masked_copy(logits, ours)
    assert_masked_copy(logits, oracle)
    ours_kept, oracle_kept = kept(ours), kept(oracle)
    q = torch.softmax(logits, -1, dtype=torch.float32)
    # Ours, by its docstring, keeps whole ties: every finite token at least as likely (in
    # float32) as one it keeps is kept.
    smallest_ours = torch.where(ours_kept, q, torch.inf).amin(-1, keepdim=True)
    assert torch.equal(ours_kept, (q >= smallest_ours) & (logits != NEG_INF))
    if torch.equal(ours_kept, oracle_kept):
        return
    near = (mass_above(logits) - top_p).abs() <= top_p_band(logits.dtype, logits.shape[-1])
    smallest_kept = torch.where(oracle_kept, q, torch.inf).amin(-1, keepdim=True)
    tied = q == smallest_kept
    only_ours = ours_kept & ~oracle_kept
    only_oracle = oracle_kept & ~ours_kept
    bad_ours = only_ours & ~(tied | near)
    bad_oracle = only_oracle & ~near
    assert not bool(bad_ours.any()), f"TopP keeps more at {bad_ours.nonzero().tolist()}"
    assert not bool(bad_oracle.any()), f"TopP drops oracle's {bad_oracle.nonzero().tolist()}"


def make_min_p_check(min_tokens_to_keep: int) -> Check:
    def check(logits: torch.Tensor, ours: torch.Tensor, oracle: torch.Tensor) -> None:
        _check_min_p(logits, ours, oracle, min_tokens_to_keep)

    return check


def _check_min_p(logits: torch.Tensor, ours: torch.Tensor, oracle: torch.Tensor, m: int):
    """Tolerance for MinP, applied exactly.

    Both compute ``probs = softmax(logits)`` in the logits dtype and the same threshold,
    so with ``min_tokens_to_keep == 1`` the results must be identical. With k =
    ``min(min_tokens_to_keep, V)`` > 1 both also protect k tokens: the oracle takes
    ``topk(probs)``, ours ``topk(logits)``. Both are "k tokens of largest probability"
    (softmax rounding is monotone), so they may differ only among tokens whose
    probability equals the k-th largest (equal logits, or distinct logits whose
    probabilities round or underflow to the same value). A protected ``-inf`` token
    stays ``-inf``, so "kept" below means "finite in the output".
    """
    if m == 1:
        assert_identical(logits, ours, oracle)
        return
    assert_masked_copy(logits, ours)
    assert_masked_copy(logits, oracle)
    probs = torch.softmax(logits, -1)
    k = min(m, logits.shape[-1])
    kth = probs.topk(k, -1).values[:, -1:]
    differ = kept(ours) ^ kept(oracle)
    bad = differ & (probs != kth)
    assert not bool(bad.any()), f"MinP differs off the k-th probability tie: {bad.nonzero()}"


def case_top_k(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    vocab, steps = one_step(draw, dtype, vocab)
    k = draw.choice((1, 2, 5, 50, vocab, vocab + 5, None)) or draw.int(1, vocab)
    m = draw_min_tokens(draw, vocab)
    return Case(TopK(k, min_tokens_to_keep=m), TopKLogitsWarper(k, min_tokens_to_keep=m), steps)


def _case_at_p(
    draw: Draw,
    dtype: torch.dtype,
    vocab: int | None,
    p: float,
    classes: tuple[type[LogitsProcessor], Any],
    make_check: Callable[[int], Check],
) -> Case:
    """Ours and the oracle (``classes``) at ``p`` and a drawn ``min_tokens_to_keep``,
    compared by ``make_check(min_tokens_to_keep)``."""
    vocab, steps = one_step(draw, dtype, vocab)
    m = draw_min_tokens(draw, vocab)
    ours, oracle = classes
    return Case(
        ours(p, min_tokens_to_keep=m),
        oracle(p, min_tokens_to_keep=m),
        steps,
        check=make_check(m),
    )


def case_top_p(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    p = draw.float(1e-3, 1.0, specials=(1.0, 0.999, 0.95, 0.9, 0.5, 0.1, 1e-6))
    check = make_top_p_check(p)
    return _case_at_p(draw, dtype, vocab, p, (TopP, TopPLogitsWarper), lambda _: check)


def case_min_p(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    p = draw.float(0.0, 1.0, specials=(0.0, 1.0, 0.05, 0.1, 0.5, 0.9))
    return _case_at_p(draw, dtype, vocab, p, (MinP, MinPLogitsWarper), make_min_p_check)


CASES: dict[str, CaseBuilder] = {
    "TopK": case_top_k,
    "TopP": case_top_p,
    "MinP": case_min_p,
}


# TopK keeps ties with the k-th token, so its draws change fewer cases.
CHANGED_SHARE = {"TopK": 0.3}


FIXED_EXAMPLES = {
    "TopK": FixedExample(
        TopK(2),
        TopKLogitsWarper(2),
        [[1.0, 3.0, 2.0, 0.0]],
        [[0]],
        [[NEG_INF, 3.0, 2.0, NEG_INF]],
    ),
    "TopP": FixedExample(
        TopP(0.7),
        TopPLogitsWarper(0.7),
        [[0.0, -0.5, -1.0, -2.0]],
        [[0]],
        [[0.0, -0.5, NEG_INF, NEG_INF]],
    ),
    "MinP": FixedExample(
        MinP(0.5),
        MinPLogitsWarper(0.5),
        [[0.0, -0.5, -1.0, -2.0]],
        [[0]],
        [[0.0, -0.5, NEG_INF, NEG_INF]],
    ),
}


# --------------------------------------------------------------------------------------
# transformers
# --------------------------------------------------------------------------------------


class TestTransformersPairs(TransformersPairs):
    """This module's pairs through the four checks every transformers pair runs."""

    cases = CASES
    fixed_examples = FIXED_EXAMPLES
    changed_share = CHANGED_SHARE


@pytest.mark.only_backend("transformers")
def test_top_p_mass_exactly_at_top_p_is_not_kept() -> None:
    """The boundary itself, where the tolerance band cannot hide an off-by-one: with
    float32 probabilities exactly 1/2, 1/4, 1/8, 1/16, 1/16 (softmax is exact here), the
    first two reach 0.75, so the third token is dropped, by ours and by the oracle."""
    x = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -4.0]], dtype=torch.float64)
    x = (x * torch.log(torch.tensor(2.0, dtype=torch.float64))).float()
    assert torch.softmax(x, -1).tolist() == [[0.5, 0.25, 0.125, 0.0625, 0.0625]]
    ids = torch.zeros(1, 1, dtype=torch.int64)
    expected = torch.tensor([[x[0, 0].item(), x[0, 1].item(), NEG_INF, NEG_INF, NEG_INF]])
    assert torch.equal(TopPLogitsWarper(0.75)(ids, x.clone()), expected)
    assert torch.equal(Pipeline([TopP(0.75)])(x.clone(), ids), expected)


# Divergences found by the property tests, fixed, and pinned here.


@pytest.mark.only_backend("transformers")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_top_p_one_keeps_every_token(dtype: torch.dtype) -> None:
    x = torch.tensor([[0.0, -20.0, -20.0]], dtype=dtype)
    ids = torch.zeros(1, 1, dtype=torch.int64)
    assert torch.equal(TopPLogitsWarper(1.0)(ids, x.clone()), x)
    assert torch.equal(Pipeline([TopP(1.0)])(x.clone(), ids), x)


# --------------------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------------------


# (ours, llama.cpp's sampler, parameter values, how many tokens the native one keeps:
# exactly k for top-k, else fewer than the vocabulary, so the test can fail).
TRUNCATIONS: dict[str, tuple[Any, Any, list[Any], Any]] = {
    "top_k": (
        TopK,
        lambda lib, k: lib.llama_sampler_init_top_k(k),
        [1, 5, 40, 1_000],
        lambda kept, k: kept == k,  # continuous logits: no ties at the k-th
    ),
    "top_p": (
        TopP,
        lambda lib, p: lib.llama_sampler_init_top_p(p, 1),
        [0.1, 0.5, 0.9, 0.95],
        lambda kept, p: kept < LLAMA_VOCAB,
    ),
    "min_p": (
        MinP,
        lambda lib, p: lib.llama_sampler_init_min_p(p, 1),
        [0.01, 0.05, 0.2, 0.5],
        lambda kept, p: kept < LLAMA_VOCAB,
    ),
}


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.support("oracle", backend="llama_cpp")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, (_, _, values, _) in TRUNCATIONS.items() for value in values],
)
def test_truncation_matches_llama_cpp(name: str, value: Any, seed: int) -> None:
    processor, sampler, _, kept_as_expected = TRUNCATIONS[name]
    logits = random_row(seed)
    expected = llama_cpp_apply(lambda lib: sampler(lib, value), logits)
    assert kept_as_expected(np.isfinite(expected).sum(), value)
    np.testing.assert_array_equal(ours_row(processor(value), logits), expected)


# --------------------------------------------------------------------------------------
# mlx-lm
# --------------------------------------------------------------------------------------


# Kept-set filters: (ours, mlx-lm's filter of log-probabilities, parameter values, how
# many tokens the native one keeps: exactly k for top-k, else fewer than the vocabulary,
# so the test can fail).
MLX_KEPT_SETS: dict[str, tuple[Any, str, list[Any], Callable[[int, Any], bool]]] = {
    "top_k": (TopK, "apply_top_k", [1, 5, 50], lambda kept, k: kept == k),
    "top_p": (TopP, "apply_top_p", [0.1, 0.5, 0.9], lambda kept, p: kept < MLX_VOCAB),
    "min_p": (MinP, "apply_min_p", [0.05, 0.2, 0.5], lambda kept, p: kept < MLX_VOCAB),
}


@pytest.mark.only_backend("mlx")
@pytest.mark.support("oracle", backend="mlx")
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, (_, _, values, _) in MLX_KEPT_SETS.items() for value in values],
)
def test_filters_keep_the_same_tokens_as_mlx_lm(name: str, value: Any, seed: int) -> None:
    _, sample_utils = mlx_modules()
    processor, apply_name, _, kept_as_expected = MLX_KEPT_SETS[name]
    apply = getattr(sample_utils, apply_name)
    logits = mlx_row(seed)
    expected = kept_ids(np.array(apply(mlx_logprobs(logits), value)))
    assert kept_as_expected(len(expected), value)
    assert kept_ids(ours_after(processor(value), logits, [0])) == expected
