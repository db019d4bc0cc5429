"""Vocabulary from Hugging Face tokenizers built from llama.cpp's real vocab files."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from anylogits import Pipeline, SuppressTokens, Vocabulary
from anylogits.testing.tiny_model import build_tokenizer

TEXT = "Hello wörld — 漢字 🙂\tend  two  spaces\n"


@pytest.mark.parametrize(
    ("name", "prefix"),
    [("llama-bpe", b""), ("gpt-2", b""), ("qwen2", b""), ("llama-spm", b" ")],
)
def test_token_bytes_concatenate_to_the_text(name: str, prefix: bytes) -> None:
    tokenizer = build_tokenizer(name)
    vocab = Vocabulary.from_hf_tokenizer(tokenizer)
    assert vocab.size == len(tokenizer)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    # Emoji and CJK split into partial UTF-8 tokens: bytes, not text, must round-trip.
    assert any(not _is_utf8(vocab.token_bytes(i)) for i in ids)
    # SentencePiece marks a word start with a space: the dummy prefix of the first word.
    assert b"".join(vocab.token_bytes(i) for i in ids) == prefix + TEXT.encode()


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_special_ids_come_from_the_tokenizer() -> None:
    tokenizer = build_tokenizer("llama-bpe")
    vocab = Vocabulary.from_hf_tokenizer(tokenizer)
    assert vocab.eos_token_ids == {tokenizer.eos_token_id}
    assert vocab.bos_token_id == tokenizer.bos_token_id
    assert tokenizer.convert_tokens_to_ids("<|eot_id|>") in vocab.special_token_ids
    assert vocab.token_bytes(tokenizer.eos_token_id) == b"<|end_of_text|>"
    override = Vocabulary.from_hf_tokenizer(tokenizer, eos_token_ids=[1, 2])
    assert override.eos_token_ids == {1, 2}


def test_padded_logits_are_accepted_and_narrow_ones_rejected() -> None:
    vocab = Vocabulary.from_hf_tokenizer(build_tokenizer("gpt-2"))
    padded = Pipeline([SuppressTokens([50256])], vocab)(torch.zeros(1, 50304))
    assert padded[0, 50256] == float("-inf") and padded[0, 50257:].eq(0).all()
    with pytest.raises(ValueError, match="logits width 50000 is smaller than the vocabulary"):
        Pipeline([SuppressTokens([1])], vocab)(torch.zeros(1, 50000))


def test_hf_vocabulary_is_cached_per_tokenizer_until_it_changes() -> None:
    from anylogits.core.vocab import hf_vocabulary

    tokenizer = build_tokenizer("gpt-2")
    first = hf_vocabulary(tokenizer)
    assert hf_vocabulary(tokenizer) is first
    assert hf_vocabulary(tokenizer, eos_token_ids=[1]).eos_token_ids == {1}
    tokenizer.add_tokens(["<brand-new-token>"])
    grown = hf_vocabulary(tokenizer)
    assert grown is not first and grown.size == first.size + 1


def test_tokenizer_json_leaves_out_padding_and_truncation_and_keeps_the_tokenizer_s() -> None:
    import json

    tokenizer = build_tokenizer("llama-bpe")
    plain = json.loads(Vocabulary.from_hf_tokenizer(tokenizer).tokenizer_json())
    assert plain["padding"] is None and plain["truncation"] is None
    backend = tokenizer.backend_tokenizer
    backend.enable_padding(length=16)
    backend.enable_truncation(max_length=8)
    written = json.loads(Vocabulary.from_hf_tokenizer(tokenizer).tokenizer_json())
    assert written == plain
    assert backend.padding is not None and backend.truncation is not None
