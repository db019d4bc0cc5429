"""What a tiny model is: the spec whose fields determine every byte written, and the
vocabularies it can be built with."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

#: Bump whenever the bytes written for a given spec change (weights, config, tokenizer):
#: it is part of the cache key, so stale folders are never reused.
BUILDER_VERSION = 3

DEFAULT_VOCAB = "llama-bpe"

#: Vocabularies whose tokenizer is rebuilt faithfully (checked against llama.cpp's vectors).
SUPPORTED_VOCABS: tuple[str, ...] = ("llama-bpe", "gpt-2", "qwen2", "llama-spm")


@dataclass(frozen=True)
class TinyModelSpec:
    """Every choice that determines the bytes of a tiny model; hashed into the cache key.

    The defaults give a 2-layer Llama with hidden size 64 (about 16.5 M parameters with the
    128256-token Llama-3 vocabulary, almost all of them in the embedding and the LM head).

    Attributes:
        vocab: Name of the llama.cpp vocab file (``ggml-vocab-<vocab>.gguf``); one of
            :data:`SUPPORTED_VOCABS`.
        seed: Seed of the ``torch.Generator`` that draws every weight.
        pad_vocab_to: If set, the model's ``vocab_size`` (the logits width) is this number,
            which must be at least the number of tokens; rows past the tokenizer are zero in
            both the embedding and the LM head, so those logits are exactly 0 and the first
            ``len(tokenizer)`` logits equal those of the unpadded model with the same seed.
        num_hidden_layers: Number of decoder layers.
        hidden_size: Model width.
        intermediate_size: MLP width.
        num_attention_heads: Query heads.
        num_key_value_heads: Key/value heads (equal to the query heads: plain multi-head
            attention, the layout every backend supports).
        head_dim: Per-head width, explicit because ``hidden_size / heads`` would not be used
            by every loader; at least 32 because vLLM's CPU attention rejects 16.
        max_position_embeddings: Context length written to the config.
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base. 500000 (Llama 3's) rather than the 10000 fallback that some
            loaders silently use when they miss the value, so such a bug shows up as
            different logits.
        embed_std: Standard deviation of the token embedding. Small (transformers'
            ``initializer_range``) so that attention and MLP outputs dominate the residual
            stream: the model then repeats itself the way real models do, and penalties
            such as repetition and no-repeat-ngram change greedy output on ordinary prompts.
        lm_head_std: Standard deviation of the LM head; with unit-RMS final hidden states
            the logits have a standard deviation of about ``lm_head_std * sqrt(hidden)``
            (3.2 by default): peaked enough that greedy decoding has clear winners, flat
            enough that sampling still has many candidates.
    """

    vocab: str = DEFAULT_VOCAB
    seed: int = 0
    pad_vocab_to: int | None = None
    num_hidden_layers: int = 2
    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    embed_std: float = 0.02
    lm_head_std: float = 0.4

    def __post_init__(self) -> None:
        check_vocab_name(self.vocab)
        if self.pad_vocab_to is not None and self.pad_vocab_to <= 0:
            raise ValueError(f"pad_vocab_to must be positive, got {self.pad_vocab_to}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (RoPE rotates pairs)")

    def cache_key(self, vocab_sha256: str = "") -> str:
        """Hex digest over the spec, :data:`BUILDER_VERSION` and the vocab file's hash."""
        payload = {
            "builder_version": BUILDER_VERSION,
            "spec": dataclasses.asdict(self),
            "vocab_sha256": vocab_sha256,
        }
        blob = json.dumps(payload, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def check_vocab_name(vocab: str) -> None:
    if vocab not in SUPPORTED_VOCABS:
        raise ValueError(
            f"unsupported vocab {vocab!r}: the tiny model's tokenizer can be rebuilt from "
            f"these llama.cpp vocab files only: {', '.join(SUPPORTED_VOCABS)}"
        )
