"""Every anylogits processor against its transformers oracle, on identical random inputs.

Each pair is called the way transformers calls processors: ours through
``Pipeline([processor])(logits.clone(), input_ids)`` (what the transformers adapter
does), the oracle as ``oracle(input_ids, logits.clone())``, with ``input_ids`` a full
``(B, L)`` int64 history. Inputs vary batch size, vocabulary size, dtype (float32,
float16, bfloat16, float64) and sequence length. Logits come from a hypothesis-drawn
seed (not float by float, which is far slower); some draws round them to 0.5 steps (many
exact ties) and some set part of each row to ``-inf`` first, as a previous top-k would.

Results must be bit-identical (``torch.equal``, ``-inf`` positions included) except where
a tolerance is stated next to the check that applies it:

* ``TopP``: kept sets may differ at a tie on the boundary (ours keeps the whole tie) or
  for tokens whose mass lies within float rounding of ``top_p`` (see ``_check_top_p``).
* ``MinP`` with ``min_tokens_to_keep > 1``: which token of a tie at the k-th largest
  probability is protected may differ (see ``_check_min_p``).
* ``LogitBias`` vs ``SequenceBiasLogitsProcessor``: the oracle stores biases in float32,
  so biases are drawn float32-representable; for float64 logits and other biases the
  difference is pinned by ``test_logit_bias_float64_adds_the_exact_bias_...``.

Divergences the property tests found (TopP(1.0), history ids beyond the logits width)
were fixed; fixed examples pin them at the end of the file.

Every pair also has a test that it changes the logits (a no-op cannot pass).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from anylogits import (
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    MinP,
    NoRepeatNGram,
    Pipeline,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
)
from conformance_tests.comparisons import (
    DTYPES,
    NEG_INF,
    assert_identical,
    dtype_id,
    oracle_settings,
)
from conformance_tests.oracle_draws import (
    Draw,
    HypothesisDraw,
    LogitSource,
    RandomDraw,
    draw_min_tokens,
    draw_shape,
)

pytestmark = pytest.mark.only_backend("transformers")

BIG_VOCAB = 32000

SETTINGS = oracle_settings(80)


# --------------------------------------------------------------------------------------
# Cases and checks
# --------------------------------------------------------------------------------------

Check = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


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


def assert_masked_copy(logits: torch.Tensor, out: torch.Tensor) -> None:
    """Every output entry is its input value or -inf (truncation only removes tokens)."""
    assert out.dtype == logits.dtype
    assert bool(((out == logits) | (out == NEG_INF)).all())


def kept(out: torch.Tensor) -> torch.Tensor:
    return out != NEG_INF


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


# --------------------------------------------------------------------------------------
# The pairs
# --------------------------------------------------------------------------------------


def one_step(draw: Draw, dtype: torch.dtype, vocab: int | None, id_high: int | None = None):
    batch, vocab = draw_shape(draw, vocab)
    source = LogitSource(draw, batch, vocab, dtype)
    length = draw.int(1, 20)
    ids = source.ids(length, None if id_high is None else min(id_high, vocab))
    return vocab, [(source.next(), ids)]


def case_temperature(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    t = draw.float(0.05, 5.0, specials=(1.0, 0.5, 0.7, 2.0, 1.3, 0.1))
    _, steps = one_step(draw, dtype, vocab)
    return Case(Temperature(t), TemperatureLogitsWarper(t), steps)


def case_top_k(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    vocab, steps = one_step(draw, dtype, vocab)
    k = draw.choice((1, 2, 5, 50, vocab, vocab + 5, None)) or draw.int(1, vocab)
    m = draw_min_tokens(draw, vocab)
    return Case(TopK(k, min_tokens_to_keep=m), TopKLogitsWarper(k, min_tokens_to_keep=m), steps)


def case_top_p(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    p = draw.float(1e-3, 1.0, specials=(1.0, 0.999, 0.95, 0.9, 0.5, 0.1, 1e-6))
    vocab, steps = one_step(draw, dtype, vocab)
    m = draw_min_tokens(draw, vocab)
    return Case(
        TopP(p, min_tokens_to_keep=m),
        TopPLogitsWarper(p, min_tokens_to_keep=m),
        steps,
        check=make_top_p_check(p),
    )


def case_min_p(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    p = draw.float(0.0, 1.0, specials=(0.0, 1.0, 0.05, 0.1, 0.5, 0.9))
    vocab, steps = one_step(draw, dtype, vocab)
    m = draw_min_tokens(draw, vocab)
    return Case(
        MinP(p, min_tokens_to_keep=m),
        MinPLogitsWarper(p, min_tokens_to_keep=m),
        steps,
        check=make_min_p_check(m),
    )


def case_repetition_penalty(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    penalty = draw.float(0.05, 5.0, specials=(1.0, 1.2, 1.5, 2.0, 0.5, 0.8))
    # Sometimes a small id range, so the history repeats tokens (duplicate scatter ids).
    id_high = draw.choice((None, 3, 10))
    _, steps = one_step(draw, dtype, vocab, id_high)
    return Case(RepetitionPenalty(penalty), RepetitionPenaltyLogitsProcessor(penalty), steps)


def case_no_repeat_ngram(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    n = draw.int(1, 4)
    batch, vocab = draw_shape(draw, vocab)
    source = LogitSource(draw, batch, vocab, dtype)
    # Ids from a tiny range so that n-grams actually repeat.
    id_high = min(draw.int(1, 4), vocab)
    ids = source.ids(draw.int(1, 24), id_high)
    return Case(NoRepeatNGram(n), NoRepeatNGramLogitsProcessor(n), [(source.next(), ids)])


def case_min_new_tokens(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    """A simulated generation: the prompt call, then one call per appended token."""
    batch, vocab = draw_shape(draw, vocab)
    source = LogitSource(draw, batch, vocab, dtype)
    prompt_length = draw.int(1, 6)
    min_new = draw.int(0, 6)
    calls = draw.int(1, 9)
    if draw.choice((True, False)):
        eos: int | list[int] = draw.int(0, vocab - 1)
    else:  # several ids, possibly repeated
        eos = [draw.int(0, vocab - 1) for _ in range(draw.int(1, 3))]
    # A tiny id range makes rows share prompts/prefixes, which the tracker must handle.
    id_high = draw.choice((None, 2))
    ids = source.ids(prompt_length, None if id_high is None else min(id_high, vocab))
    steps = []
    for _ in range(calls):
        steps.append((source.next(), ids))
        ids = torch.cat([ids, source.ids(1)], 1)
    return Case(
        MinNewTokens(min_new, eos_token_id=eos),
        MinNewTokensLengthLogitsProcessor(prompt_length, min_new, eos),
        steps,
    )


def case_logit_bias(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    vocab, steps = one_step(draw, dtype, vocab)
    count = draw.int(1, min(5, vocab))
    token_ids: list[int] = []
    while len(token_ids) < count:
        token_id = draw.int(0, vocab - 1)
        if token_id not in token_ids:
            token_ids.append(token_id)
    # float32-representable biases: the oracle stores them in float32 (see
    # test_logit_bias_float64_adds_the_exact_bias_where_oracle_adds_it_in_float32). |bias| <= 1e4
    # keeps half-precision sums finite (no inf - inf).
    specials = (-100.0, 100.0, -1e4, 1e4, 5.0, -1.5, 0.0, 0.25)
    bias = {t: draw.float(-50.0, 50.0, specials=specials) for t in token_ids}
    return Case(
        LogitBias(bias),
        SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()}),
        steps,
    )


def case_suppress_tokens(draw: Draw, dtype: torch.dtype, vocab: int | None = None) -> Case:
    vocab, steps = one_step(draw, dtype, vocab)
    token_ids = [draw.int(0, vocab - 1) for _ in range(draw.int(0, 5))]  # may repeat
    return Case(SuppressTokens(token_ids), SuppressTokensLogitsProcessor(token_ids), steps)


CASES: dict[str, Callable[..., Case]] = {
    "Temperature": case_temperature,
    "TopK": case_top_k,
    "TopP": case_top_p,
    "MinP": case_min_p,
    "RepetitionPenalty": case_repetition_penalty,
    "NoRepeatNGram": case_no_repeat_ngram,
    "MinNewTokens": case_min_new_tokens,
    "LogitBias": case_logit_bias,
    "SuppressTokens": case_suppress_tokens,
}


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------


@pytest.mark.support("oracle", backend="transformers")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", list(CASES))
@SETTINGS
@given(data=st.data())
def test_matches_transformers_oracle(name: str, dtype: torch.dtype, data: st.DataObject) -> None:
    run_case(CASES[name](HypothesisDraw(data), dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_transformers_oracle_at_vocab_32000(name: str, dtype: torch.dtype) -> None:
    for seed in range(2):
        run_case(CASES[name](RandomDraw(zlib.crc32(f"{name}/{seed}".encode())), dtype, BIG_VOCAB))


# Smallest share of generated cases in which the processor must change the logits. The
# draws include no-op settings (temperature 1, penalty 1, no suppressed ids, ...), hence
# not 1.0; the measured shares are far above these.
MIN_CHANGED_SHARE = {**{name: 0.5 for name in CASES}, "TopK": 0.3}


@pytest.mark.parametrize("name", list(CASES))
def test_changes_logits_on_generated_inputs(name: str) -> None:
    """Guards against a no-op implementation: the generated inputs do get changed."""
    cases = [CASES[name](RandomDraw(seed), DTYPES[seed % 4]) for seed in range(60)]
    for case in cases:
        run_case(case)
    share = sum(case.changed for case in cases) / len(cases)
    assert share >= MIN_CHANGED_SHARE[name], f"{name} changed only {share:.0%} of cases"


def test_no_repeat_ngram_cases_do_ban_tokens() -> None:
    """Most generated NoRepeatNGram cases ban some token, so agreement is not vacuous."""
    cases = [case_no_repeat_ngram(RandomDraw(seed), DTYPES[seed % 4]) for seed in range(100)]
    for case in cases:
        run_case(case)
    share = sum(case.banned for case in cases) / len(cases)
    assert share >= 0.6, f"only {share:.0%} of NoRepeatNGram cases ban a token"


FIXED_EXAMPLES: dict[str, tuple[LogitsProcessor, Any, list, list[list[int]], list]] = {
    # name: (ours, oracle, logits, ids, expected)
    "Temperature": (
        Temperature(2.0),
        TemperatureLogitsWarper(2.0),
        [[2.0, -4.0, 1.0]],
        [[0]],
        [[1.0, -2.0, 0.5]],
    ),
    "TopK": (
        TopK(2),
        TopKLogitsWarper(2),
        [[1.0, 3.0, 2.0, 0.0]],
        [[0]],
        [[NEG_INF, 3.0, 2.0, NEG_INF]],
    ),
    "TopP": (
        TopP(0.7),
        TopPLogitsWarper(0.7),
        [[0.0, -0.5, -1.0, -2.0]],
        [[0]],
        [[0.0, -0.5, NEG_INF, NEG_INF]],
    ),
    "MinP": (
        MinP(0.5),
        MinPLogitsWarper(0.5),
        [[0.0, -0.5, -1.0, -2.0]],
        [[0]],
        [[0.0, -0.5, NEG_INF, NEG_INF]],
    ),
    "RepetitionPenalty": (
        RepetitionPenalty(2.0),
        RepetitionPenaltyLogitsProcessor(2.0),
        [[2.0, -2.0, 2.0]],
        [[0, 1, 1]],
        [[1.0, -4.0, 2.0]],
    ),
    "NoRepeatNGram": (
        NoRepeatNGram(2),
        NoRepeatNGramLogitsProcessor(2),
        [[0.0] * 6],
        [[5, 1, 2, 5]],
        [[0.0, NEG_INF, 0.0, 0.0, 0.0, 0.0]],
    ),
    "MinNewTokens": (
        MinNewTokens(1, eos_token_id=2),
        MinNewTokensLengthLogitsProcessor(2, 1, 2),
        [[0.0, 0.0, 0.0]],
        [[7, 8]],
        [[0.0, 0.0, NEG_INF]],
    ),
    "LogitBias": (
        LogitBias({1: 5.0, 2: -1.0}),
        SequenceBiasLogitsProcessor({(1,): 5.0, (2,): -1.0}),
        [[0.0, 0.0, 0.0, 0.0]],
        [[0]],
        [[0.0, 5.0, -1.0, 0.0]],
    ),
    "SuppressTokens": (
        SuppressTokens([0, 2]),
        SuppressTokensLogitsProcessor([0, 2]),
        [[1.0, 1.0, 1.0]],
        [[0]],
        [[NEG_INF, 1.0, NEG_INF]],
    ),
}


@pytest.mark.parametrize("name", list(FIXED_EXAMPLES))
def test_fixed_example_changes_logits(name: str) -> None:
    ours, oracle, logits, ids, expected = FIXED_EXAMPLES[name]
    x = torch.tensor(logits)
    input_ids = torch.tensor(ids)
    expected_tensor = torch.tensor(expected)
    assert not torch.equal(expected_tensor, x)
    out = Pipeline([ours])(x.clone(), input_ids)
    assert torch.equal(out, expected_tensor), out
    assert torch.equal(oracle(input_ids, x.clone()), expected_tensor)


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


def test_min_new_tokens_lifts_the_ban_after_min_new_tokens() -> None:
    """The step-by-step simulation, spelled out: EOS is banned for exactly n calls."""
    pipeline = Pipeline([MinNewTokens(2, eos_token_id=[0, 3])])
    oracle = MinNewTokensLengthLogitsProcessor(3, 2, [0, 3])
    ids = torch.tensor([[5, 6, 7], [1, 1, 1]])
    for step, banned in enumerate([True, True, False, False]):
        x = torch.randn(2, 4)
        out = pipeline(x.clone(), ids)
        assert torch.equal(out, oracle(ids, x.clone())), step
        assert bool(out[:, [0, 3]].isneginf().all()) is banned
        assert torch.equal(out[:, [1, 2]], x[:, [1, 2]])
        ids = torch.cat([ids, torch.tensor([[2], [2]])], 1)


def test_logit_bias_float64_adds_the_exact_bias_where_oracle_adds_it_in_float32() -> None:
    """The one legitimate LogitBias difference, pinned exactly.

    ``SequenceBiasLogitsProcessor`` stores biases in a float32 tensor and adds them into
    a zero tensor of the logits dtype, so float64 logits get ``float32(bias)``; ours
    adds the float64 bias. For float32-representable biases (the ones drawn above) the
    two are identical; otherwise they differ by exactly that rounding.
    """
    bias = 0.1
    x = torch.tensor([[0.3, -1.0, 2.0]], dtype=torch.float64)
    ids = torch.zeros(1, 1, dtype=torch.int64)
    ours = Pipeline([LogitBias({1: bias})])(x.clone(), ids)
    oracle = SequenceBiasLogitsProcessor({(1,): bias})(ids, x.clone())
    bias32 = torch.tensor(bias, dtype=torch.float32).item()
    assert bias32 != bias
    assert torch.equal(ours, torch.tensor([[0.3, -1.0 + bias, 2.0]], dtype=torch.float64))
    assert torch.equal(oracle, torch.tensor([[0.3, -1.0 + bias32, 2.0]], dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_logit_bias_half_matches_oracle_for_any_float_bias(dtype: torch.dtype) -> None:
    """In half dtypes the oracle rounds a bias to float32, then to the dtype. So does ours:
    torch converts a Python float to float16/bfloat16 through float32. Checked with a
    bias where rounding once and rounding through float32 disagree
    (1 + 2**-11 + 2**-30 for float16: float32 rounds it to the float16 midpoint, which
    then rounds to even, 1.0; rounding once gives 1 + 2**-10)."""
    bias = {torch.float16: 1 + 2**-11 + 2**-30, torch.bfloat16: 1 + 2**-8 + 2**-30}[dtype]
    x = torch.zeros(1, 3, dtype=dtype)
    ids = torch.zeros(1, 1, dtype=torch.int64)
    ours = Pipeline([LogitBias({1: bias})])(x.clone(), ids)
    oracle = SequenceBiasLogitsProcessor({(1,): bias})(ids, x.clone())
    assert torch.equal(ours, oracle)
    assert ours[0, 1].item() == torch.tensor(bias, dtype=torch.float32).to(dtype).item()


# Divergences found by the property tests, fixed, and pinned here.


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_top_p_one_keeps_every_token(dtype: torch.dtype) -> None:
    x = torch.tensor([[0.0, -20.0, -20.0]], dtype=dtype)
    ids = torch.zeros(1, 1, dtype=torch.int64)
    assert torch.equal(TopPLogitsWarper(1.0)(ids, x.clone()), x)
    assert torch.equal(Pipeline([TopP(1.0)])(x.clone(), ids), x)


@pytest.mark.parametrize("name", ["RepetitionPenalty", "NoRepeatNGram"])
def test_history_ids_beyond_logits_width(name: str) -> None:
    x = torch.tensor([[1.0, 2.0, 3.0]])
    ids = torch.tensor([[0, 5, 0, 5]])
    ours, oracle = {
        "RepetitionPenalty": (RepetitionPenalty(2.0), RepetitionPenaltyLogitsProcessor(2.0)),
        "NoRepeatNGram": (NoRepeatNGram(2), NoRepeatNGramLogitsProcessor(2)),
    }[name]
    expected = oracle(ids, x.clone())  # [[0.5, 2, 3]] and [[-inf, 2, 3]]
    assert not torch.equal(expected, x)
    assert torch.equal(Pipeline([ours])(x.clone(), ids), expected)
