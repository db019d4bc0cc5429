"""Watermark and detector behaviour that needs no oracle (transformers' is in
conformance_tests/test_oracles_watermark.py): validation, specs, what seeds a greenlist,
short rows, the detector's counting and its inputs."""

from __future__ import annotations

import doctest
import json
import math

import pytest
import torch

import anylogits.processors.watermark as watermark_module
import anylogits.processors.watermark_detection as detection_module
from anylogits import Pipeline, Vocabulary, from_spec
from anylogits.core.batch import Batch
from anylogits.processors._greenlist import GreenlistCache
from anylogits.processors.watermark import Watermark, likeliest_tokens
from anylogits.processors.watermark_detection import WatermarkDetection, detect_watermark

KEY = 15485863
MODULUS = 2**64 - 1


def reference_greenlist(seed: int, vocab_size: int, ratio: float) -> set[int]:
    """The paper's greenlist as transformers draws it, written out independently."""
    generator = torch.Generator().manual_seed(seed % MODULUS)
    return set(torch.randperm(vocab_size, generator=generator)[: int(vocab_size * ratio)].tolist())


def reference_selfhash_seed(window: list[int], key: int) -> int:
    table = torch.randperm(1_000_003, generator=torch.Generator().manual_seed(key))
    hashed = table[torch.tensor(window) % 1_000_003] + 1
    return int((key * hashed * hashed[-1]).min()) % MODULUS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"greenlist_ratio": 0.0}, r"greenlist_ratio must lie in \(0, 1\), got 0.0"),
        ({"greenlist_ratio": 1.0}, r"greenlist_ratio must lie in \(0, 1\), got 1.0"),
        ({"greenlist_ratio": "half"}, "greenlist_ratio must be a number, got 'half'"),
        ({"bias": math.inf}, "bias must be finite, got inf"),
        ({"bias": None}, "bias must be a number, got None"),
        ({"hashing_key": -1}, "hashing_key must be >= 0, got -1"),
        ({"hashing_key": 2**63}, r"hashing_key must be < 2\*\*63, got 9223372036854775808"),
        ({"hashing_key": 1.5}, "hashing_key must be an integer, got 1.5"),
        ({"seeding_scheme": "hash"}, "seeding_scheme must be 'lefthash' or 'selfhash', got 'hash'"),
        ({"context_width": 0}, "context_width must be >= 1, got 0"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Watermark(**kwargs)
    detector_kwargs = {k: v for k, v in kwargs.items() if k != "bias"}
    if detector_kwargs:
        with pytest.raises(ValueError, match=message):
            detect_watermark([1, 2, 3], vocab_size=10, **detector_kwargs)


@pytest.mark.parametrize(
    "processor",
    [Watermark(), Watermark(0.5, -1.5, 7, "selfhash", 3)],
    ids=["defaults", "selfhash"],
)
def test_spec_round_trips_through_json(processor: Watermark) -> None:
    spec = processor.to_spec()
    assert spec["type"] == "watermark"
    rebuilt = from_spec(json.loads(json.dumps(spec)))
    assert isinstance(rebuilt, Watermark)
    assert rebuilt.config() == processor.config()


@pytest.mark.parametrize("module", [watermark_module, detection_module])
def test_doctests_pass(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_lefthash_raises_exactly_the_greenlist_of_the_previous_token() -> None:
    vocab, ratio, bias = 200, 0.3, 2.5
    ids = torch.tensor([[4, 9, 17], [17, 3, 150]])
    out = Pipeline([Watermark(ratio, bias)])(torch.zeros(2, vocab), ids)
    for row, previous in enumerate((17, 150)):
        raised = set((out[row] == bias).nonzero().flatten().tolist())
        assert raised == reference_greenlist(KEY * previous, vocab, ratio)
        assert bool(((out[row] == 0) | (out[row] == bias)).all())
    assert not torch.equal(out[0], out[1])


def test_selfhash_raises_the_green_ones_among_the_40_likeliest_tokens() -> None:
    vocab, ratio, bias, width = 300, 0.4, 3.0, 3
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(1))
    history = [11, 22, 33]
    out = Pipeline([Watermark(ratio, bias, seeding_scheme="selfhash", context_width=width)])(
        logits.clone(), torch.tensor([history])
    )
    likeliest = set(logits[0].topk(40).indices.tolist())
    expected = {
        token
        for token in likeliest
        if token
        in reference_greenlist(reference_selfhash_seed([*history[-2:], token], KEY), vocab, ratio)
    }
    raised = set((out[0] != logits[0]).nonzero().flatten().tolist())
    assert expected and raised == expected
    assert torch.equal(out[0, list(raised)], logits[0, list(raised)] + bias)


@pytest.mark.parametrize(
    ("scheme", "width"), [("lefthash", 1), ("lefthash", 3), ("selfhash", 1), ("selfhash", 3)]
)
def test_greenlist_depends_only_on_the_seeding_tokens(scheme: str, width: int) -> None:
    """Rows are not sequences: reordering rows or changing older history changes nothing."""
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 500, generator=generator)
    ids = torch.randint(500, (4, 6), generator=generator)
    watermark = Watermark(0.5, 1.0, seeding_scheme=scheme, context_width=width)
    out = Pipeline([watermark])(logits.clone(), ids)
    assert not torch.equal(out, logits)

    order = torch.tensor([2, 0, 3, 1])
    reordered = Pipeline([watermark])(logits[order].clone(), ids[order])
    assert torch.equal(reordered, out[order])

    # Only the last token (lefthash) or the last context_width - 1 tokens (selfhash) count:
    # selfhash with context_width 1 seeds each candidate's greenlist with itself alone.
    kept = 1 if scheme == "lefthash" else width - 1
    older = ids.clone()
    older[:, : ids.shape[1] - kept] = torch.randint(500, (4, ids.shape[1] - kept))
    assert torch.equal(Pipeline([watermark])(logits.clone(), older), out)
    if kept:
        changed = ids.clone()
        changed[:, -1] = (ids[:, -1] + 1) % 500
        assert not torch.equal(Pipeline([watermark])(logits.clone(), changed), out)


@pytest.mark.parametrize("scheme", ["lefthash", "selfhash"])
def test_rows_shorter_than_the_context_are_left_unchanged(scheme: str) -> None:
    logits = torch.randn(2, 100, generator=torch.Generator().manual_seed(3))
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])  # row 0 holds 2 real tokens
    watermark = Watermark(0.5, 4.0, seeding_scheme=scheme, context_width=3)
    out = Pipeline([watermark])(logits.clone(), ids, lengths=torch.tensor([2, 3]))
    assert torch.equal(out[0], logits[0])
    assert not torch.equal(out[1], logits[1])
    # Too short a history for every row: nothing to seed from.
    short = Pipeline([watermark])(logits.clone(), torch.tensor([[1, 2], [3, 4]]))
    assert torch.equal(short, logits)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_bias_is_added_in_the_logits_dtype(dtype: torch.dtype) -> None:
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(4)).to(dtype)
    out = Pipeline([Watermark(0.5, 1.3)])(logits.clone(), torch.tensor([[1], [2], [3]]))
    assert out.dtype == dtype
    raised = out != logits
    assert raised.any()
    assert torch.equal(out[raised], (logits + 1.3)[raised])


def test_tied_candidates_are_scored_in_sort_order() -> None:
    """A tie straddling the 40th place: the candidates are the first 40 of the row's sort."""
    logits = torch.zeros(1, 100)
    logits[0, :30] = 1.0  # 30 clear winners, then 70 tied tokens for the last 10 places
    candidates = likeliest_tokens(logits, 40)
    assert candidates.shape == (1, 40)
    assert set(candidates[0].tolist()) == set(logits[0].sort(descending=True).indices[:40].tolist())


def test_lefthash_seeds_from_a_host_history_without_reading_the_device() -> None:
    # Logits on `meta` hold no values: a read of one fails, where a GPU's would stall. The
    # history is on the host, as vLLM's runner holds it: its last tokens are read there.
    history = torch.tensor([[1, 2], [3, 4]])
    out = Pipeline([Watermark(0.5, 2.0)])(torch.empty(2, 64, device="meta"), history)
    assert out.device.type == "meta"


def test_a_batch_gives_the_host_history_as_the_engine_made_it() -> None:
    history = torch.tensor([[1, 2], [3, 4]])
    batch = Batch(2, lambda: history, device=torch.device("meta"))
    assert batch.history_on_host
    assert batch.host_token_ids is history
    assert batch.token_ids.device.type == "meta"
    on_device = Batch(2, torch.zeros(2, 2, dtype=torch.int64, device="meta"))
    assert not on_device.history_on_host


def test_greenlist_cache_is_bounded_by_ids_held() -> None:
    cache = GreenlistCache()
    cache.max_ids = 250
    lists = [cache.get(seed, 1000, 100) for seed in range(10)]
    assert all(len(greenlist) == 100 for greenlist in lists)
    assert cache._held <= cache.max_ids
    assert torch.equal(cache.get(9, 1000, 100), lists[9])
    assert set(cache.get(3, 1000, 100).tolist()) == reference_greenlist(3, 1000, 0.1)


# --------------------------------------------------------------------------------------
# Detector
# --------------------------------------------------------------------------------------


def watermarked_sequence(watermark: Watermark, vocab: int, steps: int, seed: int) -> list[int]:
    """Sampled decoding of random logits under ``watermark``."""
    generator = torch.Generator().manual_seed(seed)
    pipeline = Pipeline([watermark])
    ids = [int(torch.randint(vocab, (1,), generator=generator))] * watermark.context_width
    for _ in range(steps):
        logits = pipeline(torch.randn(1, vocab, generator=generator) * 2, torch.tensor([ids]))
        ids.append(int(torch.multinomial(logits.softmax(-1), 1, generator=generator)))
    return ids


@pytest.mark.parametrize(("scheme", "width"), [("lefthash", 1), ("lefthash", 2), ("selfhash", 2)])
def test_watermarked_text_is_detected_and_random_text_is_not(scheme: str, width: int) -> None:
    params = {"greenlist_ratio": 0.25, "seeding_scheme": scheme, "context_width": width}
    ids = watermarked_sequence(Watermark(bias=6.0, **params), 1000, 60, seed=5)
    found = detect_watermark(ids, vocab_size=1000, **params)
    assert isinstance(found, WatermarkDetection)
    assert found.prediction and found.z_score > 4 and found.p_value < 1e-4
    # Recount independently: the greenlist each scored token was drawn from.
    if scheme == "lefthash":
        green = [
            ids[i] in reference_greenlist(KEY * ids[i - 1], 1000, 0.25)
            for i in range(width, len(ids))
        ]
    else:
        green = [
            ids[i]
            in reference_greenlist(
                reference_selfhash_seed(ids[i - width + 1 : i + 1], KEY), 1000, 0.25
            )
            for i in range(width - 1, len(ids))
        ]
    assert (found.green_count, found.scored_count) == (sum(green), len(green))
    expected_z = (sum(green) - 0.25 * len(green)) / math.sqrt(len(green) * 0.25 * 0.75)
    assert found.z_score == pytest.approx(expected_z, rel=1e-12)
    assert found.p_value == pytest.approx(0.5 * math.erfc(expected_z / math.sqrt(2)), rel=1e-9)

    unmarked = watermarked_sequence(Watermark(bias=0.0, **params), 1000, 60, seed=5)
    assert not detect_watermark(unmarked, vocab_size=1000, **params).prediction
    other_key = detect_watermark(ids, vocab_size=1000, hashing_key=KEY + 1, **params)
    assert not other_key.prediction


def test_ignore_repeated_ngrams_scores_each_ngram_once() -> None:
    ids = [5, 6] * 20 + [7]
    every = detect_watermark(ids, vocab_size=50)
    once = detect_watermark(ids, vocab_size=50, ignore_repeated_ngrams=True)
    assert every.scored_count == 40
    assert once.scored_count == 3  # (5, 6), (6, 5), (6, 7)
    green = [b in reference_greenlist(KEY * a, 50, 0.25) for a, b in ((5, 6), (6, 5), (6, 7))]
    assert once.green_count == sum(green)
    assert every.green_count == 20 * green[0] + 19 * green[1] + green[2]


def test_text_is_encoded_with_the_tokenizer_and_a_leading_bos_is_dropped() -> None:
    letters = "abcdefghij"
    vocab = Vocabulary(
        tokens=(b"<s>", *(c.encode() for c in letters)),
        bos_token_id=0,
        encode=lambda text: [letters.index(c) + 1 for c in text],
    )
    from_text = detect_watermark("abcabdjj", tokenizer=vocab)
    from_ids = detect_watermark([1, 2, 3, 1, 2, 4, 10, 10], vocab_size=11)
    assert from_text == from_ids
    with_bos = detect_watermark(torch.tensor([0, 1, 2, 3, 1, 2, 4, 10, 10]), tokenizer=vocab)
    assert with_bos == from_ids
    kept_bos = detect_watermark([0, 1, 2, 3, 1, 2, 4, 10, 10], vocab_size=11)
    assert kept_bos.scored_count == from_ids.scored_count + 1


@pytest.mark.parametrize(
    ("tokens", "kwargs", "message"),
    [
        ([1], {"vocab_size": 10}, "tokens must hold more than context_width=1 ids"),
        ([1, 2, 3], {"vocab_size": 10, "context_width": 3}, "more than context_width=3"),
        (torch.ones(2, 5, dtype=torch.int64), {"vocab_size": 10}, r"one sequence .* \(2, 5\)"),
        ([1.5, 2.0], {"vocab_size": 10}, "must be integer token ids"),
        ([1, 2, 3], {}, "needs the logits width: pass vocab_size"),
        ([1, 2, 3], {"vocab_size": 0}, "vocab_size must be an integer >= 1, got 0"),
        ("some text", {"vocab_size": 10}, "tokens is text: pass tokenizer"),
        ("ab", {"tokenizer": Vocabulary(tokens=(b"a", b"b"))}, "cannot encode text"),
        ([1, 2, 3], {"vocab_size": 10, "z_threshold": "high"}, "z_threshold must be a number"),
    ],
)
def test_bad_detector_inputs_raise_value_errors(tokens, kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detect_watermark(tokens, **kwargs)
