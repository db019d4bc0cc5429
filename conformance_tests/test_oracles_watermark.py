"""Watermark and detector against transformers' ``WatermarkLogitsProcessor`` and
``WatermarkDetector``.

1. Logits: ours through ``Pipeline([Watermark(...)])(logits.clone(), input_ids)`` (what
   the transformers adapter does) against ``WatermarkLogitsProcessor(vocab_size=V,
   device="cpu", ...)(input_ids, logits.clone())``, on hypothesis-drawn inputs: both
   seeding schemes, context widths 1-4, float32/float16/bfloat16/float64, batch 1-4,
   vocabularies from 40 (selfhash's candidate count) up, plus the full 128,256 of the
   tiny model. Some draws round logits to 0.5 steps, so ties straddle selfhash's 40th
   place, and some set part of the rows to ``-inf``. Results must be bit-identical.
2. Generation on the tiny model: ``generate`` with our hook equals ``generate`` with
   ``watermarking_config`` token for token (greedy and seeded sampling), and
   ``detect_watermark`` equals ``WatermarkDetector`` on the same ids (counts exactly,
   z-score and p-value to float rounding); watermarked text is detected, unwatermarked
   text is not.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LogitsProcessorList,
    WatermarkDetector,
    WatermarkingConfig,
)
from transformers.generation.logits_process import WatermarkLogitsProcessor

from anylogits import Pipeline, for_transformers
from anylogits.processors.watermark import Watermark
from anylogits.processors.watermark_detection import detect_watermark
from conformance_tests.comparisons import DTYPES, NEG_INF, dtype_id

pytestmark = pytest.mark.only_backend("transformers")

SCHEMES = ("lefthash", "selfhash")
TINY_VOCAB = 128256


def draw_inputs(
    seed: int, batch: int, vocab: int, length: int, dtype: torch.dtype, kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, V)`` logits and a ``(B, L)`` history; row 0 stays finite so the watermark
    always has a finite green logit to raise (the "changes the logits" precondition)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=generator, dtype=torch.float64) * 2
    if kind in ("ties", "ties_neg_inf"):
        logits = (logits * 2).round() / 2  # 0.5 steps: exact in every dtype, many ties
    if kind in ("neg_inf", "ties_neg_inf") and batch > 1:
        # As after a previous top-k: rows 1.. keep their `keep` largest logits.
        keep = torch.randint(1, vocab + 1, (batch - 1, 1), generator=generator)
        ranks = logits[1:].argsort(dim=-1, descending=True, stable=True).argsort(-1)
        logits[1:] = logits[1:].masked_fill(ranks >= keep, NEG_INF)
    # Ids beyond the logits width occur (embeddings wider than the LM head); both hash them.
    ids = torch.randint(0, vocab + 8, (batch, length), generator=generator)
    return logits.to(dtype), ids


def oracle_result(watermark: Watermark, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """transformers' result; rows where its selfhash crashes are taken as unchanged.

    transformers' selfhash collects a row's green candidates with ``torch.tensor(list)``,
    which is a float tensor when the list is empty, so a row none of whose 40 likeliest
    tokens is green raises ``IndexError`` (see
    ``test_selfhash_row_without_green_candidates_...``). Its rows are independent (one
    loop iteration each), so such batches are replayed row by row and the crashing rows
    compared with their unchanged input, which is what the oracle means to return.
    """
    oracle = WatermarkLogitsProcessor(
        vocab_size=logits.shape[-1], device="cpu", **watermark.config()
    )
    try:
        return oracle(ids, logits.clone())
    except IndexError as error:
        if watermark.seeding_scheme != "selfhash" or "used as indices" not in str(error):
            raise
    rows = []
    for row in range(logits.shape[0]):
        try:
            rows.append(oracle(ids[row : row + 1], logits[row : row + 1].clone()))
        except IndexError:
            rows.append(logits[row : row + 1].clone())
    return torch.cat(rows)


def assert_same_as_oracle(
    watermark: Watermark, logits: torch.Tensor, ids: torch.Tensor, expected: torch.Tensor
) -> None:
    assert not torch.equal(expected, logits), "the oracle left the logits unchanged"
    ours = Pipeline([watermark])(logits.clone(), ids)
    assert ours.dtype == expected.dtype
    if not torch.equal(ours, expected):
        where = (ours != expected).nonzero()[:5].tolist()
        details = [
            (r, c, logits[r, c].item(), ours[r, c].item(), expected[r, c].item()) for r, c in where
        ]
        raise AssertionError(f"ours != oracle at (row, col, input, ours, oracle): {details}")


@pytest.mark.support("oracle", processor="watermark", backend="transformers")
@pytest.mark.parametrize("scheme", SCHEMES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_logits_equal_watermark_logits_processor(scheme: str, data: st.DataObject) -> None:
    width = data.draw(st.integers(1, 4), label="context_width")
    vocab = data.draw(st.sampled_from((40, 41, 64, 100, 257, 1000, 5000)), label="vocab")
    watermark = Watermark(
        greenlist_ratio=data.draw(st.sampled_from((0.1, 0.25, 0.5, 0.9)), label="ratio"),
        bias=data.draw(st.sampled_from((-2.0, 0.7, 2.0, 5.3)), label="bias"),
        hashing_key=data.draw(st.sampled_from((15485863, 0, 1, 2**63 - 1)), label="key"),
        seeding_scheme=scheme,
        context_width=width,
    )
    logits, ids = draw_inputs(
        seed=data.draw(st.integers(0, 2**32 - 1), label="seed"),
        batch=data.draw(st.integers(1, 4), label="batch"),
        vocab=vocab,
        length=data.draw(st.integers(width, width + 4), label="length"),
        dtype=data.draw(st.sampled_from(DTYPES), label="dtype"),
        kind=data.draw(st.sampled_from(("normal", "ties", "neg_inf", "ties_neg_inf"))),
    )
    expected = oracle_result(watermark, logits, ids)
    if scheme == "selfhash":
        # Every row may lack a green candidate (p ~ 0.9**40 per row at ratio 0.1): the
        # logits are then unchanged and prove nothing, so such draws are discarded.
        assume(not torch.equal(expected, logits))
    assert_same_as_oracle(watermark, logits, ids, expected)


@pytest.mark.support("oracle", processor="watermark", backend="transformers")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize(("scheme", "width"), [("lefthash", 1), ("selfhash", 2)])
def test_logits_equal_oracle_at_the_tiny_models_vocabulary(
    scheme: str, width: int, dtype: torch.dtype
) -> None:
    watermark = Watermark(bias=3.0, seeding_scheme=scheme, context_width=width)
    logits, ids = draw_inputs(7, batch=2, vocab=TINY_VOCAB, length=5, dtype=dtype, kind="ties")
    assert_same_as_oracle(watermark, logits, ids, oracle_result(watermark, logits, ids))


def test_selfhash_row_without_green_candidates_is_unchanged_where_the_oracle_crashes() -> None:
    """A pinned divergence: transformers raises ``IndexError``, ours leaves the row alone."""
    vocab = 1000
    watermark = Watermark(greenlist_ratio=0.1, bias=2.0, hashing_key=0, seeding_scheme="selfhash")
    # Key 0 seeds every candidate's greenlist with 0: make the 40 likeliest tokens red.
    generator = torch.Generator().manual_seed(0)
    green = set(torch.randperm(vocab, generator=generator)[: vocab // 10].tolist())
    red = [token for token in range(vocab) if token not in green][:40]
    logits = torch.zeros(1, vocab)
    logits[0, red] = 5.0
    ids = torch.tensor([[3, 4]])
    oracle = WatermarkLogitsProcessor(vocab_size=vocab, device="cpu", **watermark.config())
    with pytest.raises(IndexError, match="tensors used as indices"):
        oracle(ids, logits.clone())
    assert torch.equal(Pipeline([watermark])(logits.clone(), ids), logits)
    # One green token among the 40 and both raise it alone.
    logits[0, red[-1]], logits[0, min(green)] = 0.0, 5.0
    expected = oracle(ids, logits.clone())
    assert (expected != logits).sum() == 1
    assert torch.equal(Pipeline([watermark])(logits.clone(), ids), expected)


# --------------------------------------------------------------------------------------
# Generation with the tiny model, and detection
# --------------------------------------------------------------------------------------

PROMPT = "The history of the city begins"
NEW_TOKENS = 64
CASES = [
    pytest.param({"seeding_scheme": "lefthash", "context_width": 1, "bias": 6.0}, id="lefthash"),
    pytest.param({"seeding_scheme": "lefthash", "context_width": 3, "bias": 6.0}, id="lefthash3"),
    pytest.param({"seeding_scheme": "selfhash", "context_width": 2, "bias": 6.0}, id="selfhash2"),
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def generate(model: Any, tokenizer: Any, sample: bool, **kwargs: Any) -> torch.Tensor:
    """The generated ids (prompt excluded) of one seeded generate() call."""
    inputs = tokenizer(PROMPT, return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(
        **inputs,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=sample,
        top_k=None,
        top_p=None,
        **kwargs,
    )
    return out[0, inputs["input_ids"].shape[1] :]


def both_detections(model: Any, tokenizer: Any, ids: torch.Tensor, params: dict, **kwargs):
    config = WatermarkingConfig(**params)
    detector = WatermarkDetector(model.config, "cpu", config, **kwargs)
    theirs = detector(ids[None], return_dict=True)
    detection_params = {k: v for k, v in params.items() if k != "bias"}
    ours = detect_watermark(ids, tokenizer=tokenizer, **detection_params, **kwargs)
    # Counts are integers; z and p come from the same float64 formula, but numpy and
    # Python may order or round the final division differently by an ulp.
    assert ours.scored_count == int(theirs.num_tokens_scored[0])
    assert ours.green_count == int(theirs.num_green_tokens[0])
    assert math.isclose(ours.z_score, float(theirs.z_score[0]), rel_tol=1e-12, abs_tol=1e-12)
    assert math.isclose(ours.p_value, float(theirs.p_value[0]), rel_tol=1e-9, abs_tol=1e-300)
    assert ours.prediction == bool(theirs.prediction[0])
    return ours


@pytest.mark.slow
@pytest.mark.support("generation", processor="watermark", backend="transformers")
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("params", CASES)
def test_generation_and_detection_match_transformers(
    model: Any, tokenizer: Any, params: dict, sample: bool
) -> None:
    plain = generate(model, tokenizer, sample)
    native = generate(model, tokenizer, sample, watermarking_config=WatermarkingConfig(**params))
    assert not torch.equal(native, plain), "transformers' watermark did not change the text"
    hook = for_transformers(Watermark(**params), tokenizer=tokenizer)
    ours = generate(model, tokenizer, sample, logits_processor=LogitsProcessorList([hook]))
    assert ours.tolist() == native.tolist()

    for ignore_repeated_ngrams in (False, True):
        unmarked = both_detections(
            model, tokenizer, plain, params, ignore_repeated_ngrams=ignore_repeated_ngrams
        )
        assert not unmarked.prediction
    marked = both_detections(model, tokenizer, ours, params)
    assert marked.prediction
    both_detections(model, tokenizer, ours, params, ignore_repeated_ngrams=True)
    # A leading BOS (the prompt's) is dropped by both.
    with_bos = torch.cat([torch.tensor([tokenizer.bos_token_id]), ours])
    assert both_detections(model, tokenizer, with_bos, params) == marked
