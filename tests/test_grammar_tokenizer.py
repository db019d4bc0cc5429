"""The grammar engine's tokenizer: built natively from a fast tokenizer's JSON, as
llguidance's own users build it, and only where llguidance reads every token as the
vocabulary does (issue 35: the Python callback for forced text was half the slowest 1%
of masks on the real-schema corpus)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pytest

for _module in ("transformers", "tokenizers", "gguf", "safetensors", "llguidance"):
    pytest.importorskip(_module)

import torch  # noqa: E402

from anylogits import JSONSchema, Pipeline  # noqa: E402
from anylogits.core.vocab import Vocabulary, hf_vocabulary  # noqa: E402
from anylogits.processors.structured import engine  # noqa: E402
from anylogits.testing import tiny_model as tm  # noqa: E402

# Required keys and an enum: text the grammar forces, which llguidance tokenizes while it
# computes masks.
SCHEMA = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"enum": ["Deployment", "StatefulSet"]},
        "replicas": {"type": "integer"},
    },
    "required": ["apiVersion", "kind", "replicas"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=tm.SUPPORTED_VOCABS)
def hf_tokenizer(request: pytest.FixtureRequest) -> Any:
    from transformers import AutoTokenizer

    folder = tm.build_tiny_model(tm.TinyModelSpec(vocab=request.param))
    return AutoTokenizer.from_pretrained(folder)


def _counting(vocab: Vocabulary) -> tuple[Vocabulary, list[str]]:
    """``vocab`` whose ``encode`` records the texts it is asked for."""
    calls: list[str] = []
    encode = vocab.encode
    assert encode is not None

    def counted(text: str) -> list[int]:
        calls.append(text)
        return encode(text)

    return dataclasses.replace(vocab, encode=counted), calls


def _masks_along_a_path(vocab: Vocabulary, steps: int = 40) -> list[torch.Tensor]:
    """The masks of SCHEMA's generation that always takes the highest allowed id other
    than EOS (the walk is the same for equal masks), one per step."""
    pipeline = Pipeline([JSONSchema(SCHEMA)], vocab)
    ids = torch.tensor([[0]])
    masks = []
    for _ in range(steps):
        allowed = torch.isfinite(pipeline(torch.zeros(1, vocab.size), ids))[0]
        masks.append(allowed)
        allowed[sorted(vocab.eos_token_ids)] = False
        if not allowed.any():
            break
        token = int(allowed.nonzero().max())
        ids = torch.cat([ids, torch.tensor([[token]])], 1)
    return masks


def test_a_fast_tokenizers_masks_are_computed_without_calling_python(hf_tokenizer: Any) -> None:
    vocab, calls = _counting(hf_vocabulary(hf_tokenizer))
    native = _masks_along_a_path(vocab)
    assert calls == []
    # Around the vocabulary's tokens (no JSON), llguidance calls `encode` back for the
    # forced text, and the masks are the same.
    wrapped_vocab, wrapped_calls = _counting(dataclasses.replace(vocab, tokenizer_json=None))
    wrapped = _masks_along_a_path(wrapped_vocab)
    assert wrapped_calls
    assert len(native) == len(wrapped) > 10
    for step, (ours, theirs) in enumerate(zip(native, wrapped, strict=True)):
        assert torch.equal(ours, theirs), f"step {step}"


def test_a_tokenizer_llguidance_reads_differently_is_wrapped(
    hf_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    vocab = hf_vocabulary(hf_tokenizer)
    tokens = list(vocab.tokens)
    changed = next(i for i, piece in enumerate(tokens) if piece == b"a")
    tokens[changed] = b"<not a>"
    altered = dataclasses.replace(vocab, tokens=tuple(tokens))
    with caplog.at_level(logging.INFO, logger=engine.__name__):
        assert engine._native_tokenizer(altered) is None
    assert f"token {changed} is b'a', not b'<not a>'" in caplog.text
    assert engine._native_tokenizer(vocab) is not None
    # The engine then builds llguidance's tokenizer around the vocabulary's tokens.
    assert engine.ENGINE.tokenizer(altered).decode_bytes([changed]) == b"<not a>"


def test_a_vocabulary_outliving_its_tokenizer_is_wrapped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def gone() -> str:
        raise RuntimeError("the tokenizer this vocabulary came from no longer exists")

    tokenizer_json: Callable[[], str] = gone
    vocab = Vocabulary((b"a", b"b", b"<eos>"), frozenset({2}), tokenizer_json=tokenizer_json)
    with caplog.at_level(logging.INFO, logger=engine.__name__):
        assert engine._native_tokenizer(vocab) is None
    assert "no longer exists" in caplog.text
