"""anylogits.processors.dry against llama.cpp's ``dry`` sampler
(``llama_sampler_init_dry(vocab, multiplier, base, allowed_length, last_n, breakers, n)``)
with the real llama-bpe vocabulary (``ggml-vocab-llama-bpe.gguf`` loaded with
``vocab_only=True``), fed the whole history, on identical float32 logits.

Identical for default, empty and multi-token sequence breakers, windows and long loops.
This llama.cpp version has no ``-1`` window (negative is clamped to 0, i.e. disabled), so
ours with ``penalty_last_n=-1`` is compared with ``last_n = len(history)``. Ours runs the
way an adapter runs it: ``Pipeline`` called first with the prompt, then with prompt +
generated tokens (prompt lengths from sequence tracking).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st

from anylogits import Pipeline
from anylogits.processors import DRY
from conformance_tests.comparisons import oracle_settings, right_aligned
from conformance_tests.llama_cpp_rows import llama_cpp_result

SETTINGS = oracle_settings(50)


@pytest.fixture(scope="module")
def llama_bpe(llama_cpp: Any) -> tuple[Any, Any]:
    """A vocabulary-only llama.cpp model of llama-bpe and our Vocabulary of it."""
    from anylogits.adapters.llama_cpp import vocabulary_of
    from anylogits.testing.tiny_model import vocab_gguf_path

    model = llama_cpp.Llama(
        model_path=str(vocab_gguf_path("llama-bpe")), vocab_only=True, verbose=False
    )
    return model, vocabulary_of(model)


def llama_cpp_dry(
    llama_cpp: Any,
    model: Any,
    logits: np.ndarray,
    history: Sequence[int],
    dry: DRY,
) -> np.ndarray:
    breakers = [b.encode("utf-8") for b in dry.sequence_breakers]
    array = (ctypes.c_char_p * len(breakers))(*breakers)
    last_n = dry.penalty_last_n if dry.penalty_last_n >= 0 else len(history)
    sampler = llama_cpp.llama_sampler_init_dry(
        model._model.vocab,
        dry.multiplier,
        dry.base,
        dry.allowed_length,
        last_n,
        array,
        len(breakers),
    )
    return llama_cpp_result(sampler, logits, history)


BREAKER_SETS = (
    ("\n", ":", '"', "*"),
    (),
    ("\n\n###", "User:", " the"),  # multi-token: tokens ending in "\n", "User", " t", ...
    ("cat sat",),
)


DRY_TEXT = b'User: the cat sat on the mat:\n\n### "the cat" *sat*\n\nUser: on the mat'


@pytest.mark.support("oracle", processor="dry", backend="llama_cpp")
@pytest.mark.only_backend("llama_cpp")
@settings(SETTINGS, max_examples=30)
@given(data=st.data())
def test_dry_matches_llama_cpp(
    llama_cpp: Any, llama_bpe: tuple[Any, Any], data: st.DataObject
) -> None:
    """Several histories in one batch (ours), each against its own llama.cpp sampler."""
    draw = data.draw
    model, vocab = llama_bpe
    pool = sorted(set(model.tokenize(DRY_TEXT, add_bos=False)))
    generator = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dry = DRY(
        multiplier=draw(st.floats(0.05, 3.0)),
        base=draw(st.sampled_from([1.0, 1.1, 1.75, 3.0, 300.0])),  # 300: exponent cap
        allowed_length=draw(st.integers(0, 4)),
        sequence_breakers=draw(st.sampled_from(BREAKER_SETS)),
        penalty_last_n=draw(st.sampled_from([-1, 0, 1, 7, 40])),
    )
    histories = []
    for _ in range(draw(st.integers(1, 3))):
        used = pool[: int(generator.integers(2, len(pool) + 1))]
        history = generator.choice(used, int(generator.integers(1, 40))).tolist()
        if draw(st.booleans()):  # a loop, the case DRY is for
            segment = generator.choice(used, int(generator.integers(1, 10))).tolist()
            history += segment * int(generator.integers(2, 30))
            history = history[: len(history) - int(generator.integers(0, len(segment)))]
        histories.append([int(token) for token in history])
    logits = (generator.standard_normal((len(histories), vocab.size)) * 3).astype(np.float32)

    ids, lengths = right_aligned(histories)
    ours = Pipeline([dry], vocab)(torch.from_numpy(logits.copy()), ids, lengths=lengths)
    for row, history in enumerate(histories):
        expected = llama_cpp_dry(llama_cpp, model, logits[row], history, dry)
        np.testing.assert_array_equal(ours[row].numpy(), expected)


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.parametrize("breakers", BREAKER_SETS)
def test_dry_changes_the_logits_like_llama_cpp(
    llama_cpp: Any, llama_bpe: tuple[Any, Any], breakers: tuple[str, ...]
) -> None:
    model, vocab = llama_bpe
    history = model.tokenize(b"one two three four five " * 4 + b"one two", add_bos=False)
    logits = np.random.default_rng(1).standard_normal(vocab.size).astype(np.float32)
    dry = DRY(0.8, sequence_breakers=breakers)
    expected = llama_cpp_dry(llama_cpp, model, logits, history, dry)
    assert (expected < logits).sum() >= 1
    ours = Pipeline([dry], vocab)(torch.from_numpy(logits.copy())[None], torch.tensor([history]))
    np.testing.assert_array_equal(ours[0].numpy(), expected)


@pytest.mark.only_backend("llama_cpp")
def test_dry_breakers_stop_repeats_like_llama_cpp(
    llama_cpp: Any, llama_bpe: tuple[Any, Any]
) -> None:
    """The same loop, split by a newline breaker: no repeat reaches across it."""
    model, vocab = llama_bpe
    line = b"the cat sat on the mat\n"
    history = model.tokenize(line * 3 + b"the cat", add_bos=False)
    logits = np.random.default_rng(2).standard_normal(vocab.size).astype(np.float32)
    with_breakers = DRY(0.8)
    without = DRY(0.8, sequence_breakers=())
    native_with = llama_cpp_dry(llama_cpp, model, logits, history, with_breakers)
    native_without = llama_cpp_dry(llama_cpp, model, logits, history, without)
    sat = model.tokenize(b" sat", add_bos=False)[0]
    # "the cat" -> " sat" repeats 2 tokens either way; without breakers the repeat reaches
    # back through the previous lines and the penalty grows.
    assert native_with[sat] < logits[sat]
    assert native_without[sat] < native_with[sat]
    for dry, expected in ((with_breakers, native_with), (without, native_without)):
        ours = Pipeline([dry], vocab)(
            torch.from_numpy(logits.copy())[None], torch.tensor([history])
        )
        np.testing.assert_array_equal(ours[0].numpy(), expected)
