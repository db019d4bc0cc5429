"""The llama.cpp form of a tiny model: its very weights written as a float32 GGUF file in
the model's Hugging Face folder."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anylogits.testing.tiny_model.gguf_vocab import TT_UNUSED, GGUFVocab, read_gguf_vocab
from anylogits.testing.tiny_model.hf_folder import build_tiny_model, remove_stale_temporaries
from anylogits.testing.tiny_model.spec import TinyModelSpec
from anylogits.testing.tiny_model.weights import make_config, make_weights

if TYPE_CHECKING:
    import torch
    from transformers import LlamaConfig


#: Name of the GGUF file that :func:`build_tiny_gguf` writes into the model folder. The
#: GGUF bytes are a pure function of the folder's contents, so the folder's cache key
#: (:data:`BUILDER_VERSION`) covers them too: bump it when the GGUF writer changes.
GGUF_FILENAME = "model-f32.gguf"

# Hugging Face Llama tensor names (after "model.layers.{i}.") -> llama.cpp's (after "blk.{i}.").
_GGUF_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GGUF_GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _permute_qk(w: Any, n_head: int) -> Any:
    """``convert_hf_to_gguf.py``'s ``LlamaModel.permute``: from Hugging Face's rotate-half
    layout of each head's q/k rows (all first halves, then all second halves) to the
    interleaved pairs that llama.cpp's ``rope`` (normal mode) rotates."""
    head_rows = w.shape[0] // n_head
    return w.reshape(n_head, 2, head_rows // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_tensors(config: LlamaConfig, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Hugging Face Llama tensors -> float32 numpy arrays under llama.cpp's names.

    Shapes stay in PyTorch order ``(out_features, in_features)``; the GGUF writer stores
    them with the dimensions reversed (``ne0`` = in_features), as llama.cpp expects.
    """
    import numpy as np

    out: dict[str, Any] = {}
    expected = set(_GGUF_GLOBAL_TENSORS)
    for name, gguf_name in _GGUF_GLOBAL_TENSORS.items():
        out[gguf_name] = weights[name]
    for i in range(config.num_hidden_layers):
        for suffix, gguf_suffix in _GGUF_LAYER_TENSORS.items():
            name = f"model.layers.{i}.{suffix}"
            expected.add(name)
            out[f"blk.{i}.{gguf_suffix}"] = weights[name]
    if set(weights) != expected:
        raise ValueError(f"unexpected tensors: {sorted(set(weights) ^ expected)}")
    arrays = {k: np.ascontiguousarray(v.detach().cpu().numpy()) for k, v in out.items()}
    for k, a in arrays.items():
        if a.dtype != np.float32:
            raise ValueError(f"{k} is {a.dtype}, expected float32")
    for i in range(config.num_hidden_layers):
        q, k = f"blk.{i}.attn_q.weight", f"blk.{i}.attn_k.weight"
        arrays[q] = np.ascontiguousarray(_permute_qk(arrays[q], config.num_attention_heads))
        arrays[k] = np.ascontiguousarray(_permute_qk(arrays[k], config.num_key_value_heads))
    return arrays


def _gguf_token_fields(
    vocab: GGUFVocab, vocab_size: int
) -> tuple[list[str], list[int], list[float]]:
    """Tokens, token types and scores, padded to ``vocab_size`` entries.

    llama.cpp takes the number of tokens as the vocabulary size and requires it to equal
    the embedding's rows, so a padded model gets placeholder tokens as
    ``convert_hf_to_gguf.py`` writes them: ``[PAD<id>]``, type UNUSED, score -1000 where
    the vocabulary has scores (SentencePiece).
    """
    tokens = list(vocab.tokens)
    types = list(vocab.token_types)
    scores = list(vocab.scores)
    taken = set(tokens)
    for i in range(len(tokens), vocab_size):
        placeholder = f"[PAD{i}]"
        if placeholder in taken:
            raise ValueError(f"vocab {vocab.name!r} already has a token {placeholder!r}")
        tokens.append(placeholder)
        types.append(TT_UNUSED)
        if scores:
            scores.append(-1000.0)
    return tokens, types, scores


def _write_gguf(
    path: Path,
    spec: TinyModelSpec,
    vocab: GGUFVocab,
    config: LlamaConfig,
    weights: dict[str, torch.Tensor],
) -> None:
    import gguf

    tensors = _gguf_tensors(config, weights)
    tokens, types, scores = _gguf_token_fields(vocab, config.vocab_size)
    if tensors["token_embd.weight"].shape[0] != len(tokens):
        raise ValueError("the embedding's rows must equal the number of GGUF tokens")

    w = gguf.GGUFWriter(path, arch="llama")  # also writes general.architecture
    w.add_name(f"anylogits tiny-llama {spec.vocab}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    # head_dim is explicit in the config; llama.cpp would otherwise derive it as
    # embedding_length / head_count.
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_dimension_count(config.head_dim)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(config.vocab_size)

    # The tokenizer: the source vocab file's fields, with BOS/EOS insertion written out
    # (rather than left to llama.cpp's per-tokenizer defaults) so that it matches the
    # Hugging Face tokenizer's post-processor by construction.
    w.add_tokenizer_model(vocab.model)
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores:
        w.add_token_scores(scores)
    if vocab.merges:
        w.add_token_merges(list(vocab.merges))
    if vocab.bos_token_id is not None:
        w.add_bos_token_id(vocab.bos_token_id)
    if vocab.eos_token_id is not None:
        w.add_eos_token_id(vocab.eos_token_id)
    if vocab.unk_token_id is not None:
        w.add_unk_token_id(vocab.unk_token_id)
    if vocab.pad_token_id is not None:
        w.add_pad_token_id(vocab.pad_token_id)
    w.add_add_bos_token(vocab.add_bos_token)
    w.add_add_eos_token(vocab.add_eos_token)

    write_tensors_and_close(w, tensors)


def write_tensors_and_close(writer: Any, tensors: dict[str, Any]) -> None:
    """Add ``tensors`` to a ``gguf.GGUFWriter`` whose metadata is set, and write the file."""
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def build_tiny_gguf(
    spec: TinyModelSpec | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> Path:
    """Build (or find in the cache) the tiny model's GGUF file and return its path.

    The file is ``model-f32.gguf`` (:data:`GGUF_FILENAME`) inside the Hugging Face folder
    of :func:`build_tiny_model` (built first if needed), so one folder holds both forms.
    It holds the folder's very weights (read back from ``model.safetensors`` and checked
    against :func:`make_weights`), all float32, for llama.cpp's ``llama`` architecture:
    tensor names as ``convert_hf_to_gguf.py`` writes them, q/k rows permuted to llama.cpp's
    RoPE layout, and the source vocab file's tokenizer fields; a padded vocabulary
    (``pad_vocab_to``) gets ``[PAD<id>]`` placeholder tokens of type UNUSED, since
    llama.cpp requires one token per embedding row.

    With float32 weights and a float32 KV cache (``type_k=type_v=0`` in llama-cpp-python),
    llama.cpp's logits match transformers' to about 1e-5 and greedy tokens are equal.

    The file is written under a temporary name next to it and renamed into place, so a
    reader sees a complete file or none; a second call returns at once.

    Args:
        spec: The model; defaults to ``TinyModelSpec()``.
        cache_dir: As for :func:`build_tiny_model`.
        force: Rebuild the Hugging Face folder and the GGUF file even if cached.
    """
    spec = spec or TinyModelSpec()
    folder = build_tiny_model(spec, cache_dir=cache_dir, force=force)
    final = folder / GGUF_FILENAME
    if final.is_file():
        return final

    import torch
    from safetensors.torch import load_file

    vocab = read_gguf_vocab(spec.vocab)
    config = make_config(spec, vocab)
    weights = load_file(str(folder / "model.safetensors"))
    drawn = make_weights(spec, config, num_tokens=len(vocab))
    if weights.keys() != drawn.keys() or not all(torch.equal(weights[k], drawn[k]) for k in drawn):
        raise RuntimeError(
            f"{folder / 'model.safetensors'} does not hold make_weights({spec}); "
            "rebuild it with force=True"
        )
    del drawn

    remove_stale_temporaries(folder, GGUF_FILENAME)
    tmp = folder / f".{GGUF_FILENAME}.{uuid.uuid4().hex}"
    try:
        _write_gguf(tmp, spec, vocab, config, weights)
        tmp.chmod(0o644)
        os.replace(tmp, final)  # a concurrent build writes the same bytes: last one wins
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return final
