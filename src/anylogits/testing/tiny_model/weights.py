"""The tiny model's configuration and its weights, drawn as a pure function of the spec so
that every format (Hugging Face, GGUF, MLX) holds the very same tensors."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from anylogits.testing.tiny_model.gguf_vocab import GGUFVocab
from anylogits.testing.tiny_model.spec import TinyModelSpec

if TYPE_CHECKING:
    import torch
    from transformers import GenerationConfig, LlamaConfig


def _model_vocab_size(spec: TinyModelSpec, num_tokens: int) -> int:
    if spec.pad_vocab_to is None:
        return num_tokens
    if spec.pad_vocab_to < num_tokens:
        raise ValueError(
            f"pad_vocab_to={spec.pad_vocab_to} is smaller than the {num_tokens} tokens "
            f"of vocab {spec.vocab!r}"
        )
    return spec.pad_vocab_to


def layer_sizes(spec: TinyModelSpec) -> dict[str, int]:
    """The ``LlamaConfig`` sizes of the tiny model's layers: what :func:`make_weights` reads
    besides ``vocab_size``."""
    return {
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
    }


def _special_token_ids(vocab: GGUFVocab) -> dict[str, int | None]:
    """The vocabulary's special ids, as both the model and the generation config name them."""
    return {
        "bos_token_id": vocab.bos_token_id,
        "eos_token_id": vocab.eos_token_id,
        "pad_token_id": vocab.pad_token_id,
    }


def make_config(spec: TinyModelSpec, vocab: GGUFVocab) -> LlamaConfig:
    """The ``LlamaConfig`` of the tiny model (float32, untied embeddings)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=_model_vocab_size(spec, len(vocab)),
        **layer_sizes(spec),
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        hidden_act="silu",
        **_special_token_ids(vocab),
        tie_word_embeddings=False,
        dtype="float32",
    )


def make_generation_config(vocab: GGUFVocab) -> GenerationConfig:
    """Greedy by default, with no sampling parameters that would add logits processors."""
    from transformers import GenerationConfig

    return GenerationConfig(**_special_token_ids(vocab), do_sample=False)


def make_weights(
    spec: TinyModelSpec, config: LlamaConfig, *, num_tokens: int | None = None
) -> dict[str, torch.Tensor]:
    """Draw the tiny model's weights: a pure function of ``spec.seed`` and the shapes.

    Args:
        spec: Supplies the seed and the standard deviations.
        config: Supplies the shapes (``vocab_size``, sizes, heads, ``head_dim``).
        num_tokens: Number of real tokens, if ``config.vocab_size`` is padded past the
            tokenizer; the padding rows of the embedding and the LM head are zero, and the
            real rows are the same as in the unpadded model. Defaults to
            ``config.vocab_size``.

    Returns:
        float32 CPU tensors under Hugging Face Llama names (``model.embed_tokens.weight``,
        ``model.layers.{i}.self_attn.q_proj.weight``, ..., ``lm_head.weight``), in the
        order they were drawn. q/k are in Hugging Face's rotate-half layout; a GGUF
        writer must permute them as ``convert_hf_to_gguf.py`` does.

    Linear layers are drawn with std ``1/sqrt(fan_in)`` rather than the usual 0.02 so
    that attention and MLP outputs are as large as the residual stream: the next token
    then depends on the whole context (a KV-cache or RoPE bug changes the output), not
    only on the last token. Norm weights are ones.
    """
    import torch

    vocab_size = config.vocab_size
    n_real = vocab_size if num_tokens is None else num_tokens
    if not 0 < n_real <= vocab_size:
        raise ValueError(f"num_tokens={num_tokens} must be in 1..{vocab_size}")
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = config.head_dim
    q_out = config.num_attention_heads * head_dim
    kv_out = config.num_key_value_heads * head_dim

    gen = torch.Generator(device="cpu").manual_seed(spec.seed)

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen, dtype=torch.float32) * std

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return normal(out_features, in_features, 1.0 / math.sqrt(in_features))

    def ones() -> torch.Tensor:
        return torch.ones(hidden, dtype=torch.float32)

    def pad_rows(t: torch.Tensor) -> torch.Tensor:
        if vocab_size == n_real:
            return t
        return torch.cat([t, t.new_zeros(vocab_size - n_real, t.shape[1])])

    # The draw order is part of the format: changing it changes every weight.
    weights: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": pad_rows(normal(n_real, hidden, spec.embed_std))
    }
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        weights[p + "self_attn.q_proj.weight"] = linear(q_out, hidden)
        weights[p + "self_attn.k_proj.weight"] = linear(kv_out, hidden)
        weights[p + "self_attn.v_proj.weight"] = linear(kv_out, hidden)
        weights[p + "self_attn.o_proj.weight"] = linear(hidden, q_out)
        weights[p + "mlp.gate_proj.weight"] = linear(inter, hidden)
        weights[p + "mlp.up_proj.weight"] = linear(inter, hidden)
        weights[p + "mlp.down_proj.weight"] = linear(hidden, inter)
        weights[p + "input_layernorm.weight"] = ones()
        weights[p + "post_attention_layernorm.weight"] = ones()
    weights["model.norm.weight"] = ones()
    weights["lm_head.weight"] = pad_rows(normal(n_real, hidden, spec.lm_head_std))
    return weights
