"""The GGUF form of the tiny model (``build_tiny_gguf``) against its Hugging Face form.

- the file reads back with ``gguf.GGUFReader``: metadata, tensor names and shapes, the
  very weights of ``model.safetensors`` (q/k permuted the way ``convert_hf_to_gguf.py``
  permutes them), and the source vocab file's tokens;
- llama.cpp loads it, tokenizes like the Hugging Face tokenizer, computes the same logits
  (float32 weights and float32 KV cache: max abs diff about 1e-5 on logits of std ~3) and
  generates the same greedy tokens as transformers;
- the same holds for padded vocabularies, whose placeholder tokens fill the GGUF token list.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from anylogits.testing.tiny_model import (  # noqa: E402
    GGUF_FILENAME,
    TinyModelSpec,
    build_tiny_gguf,
    build_tiny_model,
    main,
    read_gguf_vocab,
)

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("llama_cpp")]

GGML_TYPE_F32 = 0
NEW_TOKENS = 24
PROMPTS = [
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "the cat sat on the mat",
    "Grüße, 世界! naïve café 🙂\n\tend",
]
# The padded variants: a Llama-3 vocabulary (BPE) and a SentencePiece one, each padded to a
# multiple of 128 as real checkpoints are.
PADDED_SPECS = [
    TinyModelSpec(vocab="llama-bpe", pad_vocab_to=128384),
    TinyModelSpec(vocab="llama-spm", pad_vocab_to=32128),
]


def _load_llama(path: Path) -> Any:
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=256,
        n_batch=256,
        logits_all=True,  # llm.scores holds every position's logits after eval()
        verbose=False,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        seed=0,
        n_threads=1,
    )


def _load_hf(folder: Path) -> tuple[Any, Any]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return tokenizer, model.eval()


def _llama_greedy(llm: Any, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        out.append(token)
        if len(out) == n:
            break
    return out


def _hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=n,
        )
    return out[0, len(prompt) :].tolist()


def _unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf.py's permute: llama.cpp's interleaved RoPE pairs back
    to Hugging Face's rotate-half layout."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return build_tiny_gguf()


@pytest.fixture(scope="module")
def llm(gguf_path: Path) -> Any:
    return _load_llama(gguf_path)


@pytest.fixture(scope="module")
def hf(gguf_path: Path) -> tuple[Any, Any]:
    return _load_hf(gguf_path.parent)


def test_gguf_lives_in_the_hf_folder_and_is_cached(gguf_path: Path) -> None:
    assert gguf_path.name == GGUF_FILENAME
    assert gguf_path.parent == build_tiny_model()
    assert (gguf_path.parent / "model.safetensors").is_file()
    assert not list(gguf_path.parent.glob(f".{GGUF_FILENAME}.*")), "temporary file left"
    mtime = gguf_path.stat().st_mtime_ns
    start = time.perf_counter()
    assert build_tiny_gguf() == gguf_path
    assert time.perf_counter() - start < 1.0
    assert gguf_path.stat().st_mtime_ns == mtime


def test_command_line_prints_folder_and_gguf(gguf_path: Path, capsys: Any) -> None:
    assert main(["--gguf"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(gguf_path.parent), str(gguf_path)]


def test_gguf_reads_back(gguf_path: Path) -> None:
    spec = TinyModelSpec()
    config = transformers.AutoConfig.from_pretrained(gguf_path.parent)
    reader = gguf.GGUFReader(gguf_path)

    def field(key: str) -> Any:
        return reader.fields[key].contents()

    head_dim = spec.head_dim
    expected = {
        "general.architecture": "llama",
        "general.file_type": int(gguf.LlamaFileType.ALL_F32),
        "llama.context_length": spec.max_position_embeddings,
        "llama.embedding_length": spec.hidden_size,
        "llama.block_count": spec.num_hidden_layers,
        "llama.feed_forward_length": spec.intermediate_size,
        "llama.attention.head_count": spec.num_attention_heads,
        "llama.attention.head_count_kv": spec.num_key_value_heads,
        "llama.attention.key_length": head_dim,
        "llama.attention.value_length": head_dim,
        "llama.rope.dimension_count": head_dim,
        "llama.vocab_size": config.vocab_size,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }
    assert {k: field(k) for k in expected} == expected
    assert isinstance(field("general.name"), str)
    assert field("llama.rope.freq_base") == pytest.approx(spec.rope_theta)
    assert field("llama.attention.layer_norm_rms_epsilon") == pytest.approx(spec.rms_norm_eps)

    vocab = read_gguf_vocab(spec.vocab)
    assert tuple(field("tokenizer.ggml.tokens")) == vocab.tokens
    assert tuple(field("tokenizer.ggml.token_type")) == vocab.token_types
    assert tuple(field("tokenizer.ggml.merges")) == vocab.merges
    assert field("tokenizer.ggml.bos_token_id") == vocab.bos_token_id == config.bos_token_id
    assert field("tokenizer.ggml.eos_token_id") == vocab.eos_token_id

    # Tensors: names, GGUF shapes (ne0 first), float32, and the safetensors' very values.
    hf_weights = safetensors_torch.load_file(str(gguf_path.parent / "model.safetensors"))
    tensors = {t.name: t for t in reader.tensors}
    names = {"token_embd.weight": "model.embed_tokens.weight"}
    names["output_norm.weight"] = "model.norm.weight"
    names["output.weight"] = "lm_head.weight"
    for i in range(spec.num_hidden_layers):
        hf_layer = f"model.layers.{i}."
        for gguf_suffix, hf_suffix in [
            ("attn_norm", "input_layernorm"),
            ("attn_q", "self_attn.q_proj"),
            ("attn_k", "self_attn.k_proj"),
            ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"),
            ("ffn_norm", "post_attention_layernorm"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ]:
            names[f"blk.{i}.{gguf_suffix}.weight"] = f"{hf_layer}{hf_suffix}.weight"
    assert set(tensors) == set(names)
    for name, hf_name in names.items():
        tensor, expected_w = tensors[name], hf_weights[hf_name].numpy()
        assert tensor.tensor_type == gguf.GGMLQuantizationType.F32, name
        assert list(tensor.shape) == list(reversed(expected_w.shape)), name
        data = np.asarray(tensor.data).reshape(expected_w.shape)
        if ".attn_q." in name:
            data = _unpermute_qk(data, spec.num_attention_heads)
        elif ".attn_k." in name:
            data = _unpermute_qk(data, spec.num_key_value_heads)
        np.testing.assert_array_equal(data, expected_w, err_msg=name)
    # The permutation is not the identity for these shapes (else the check above is void).
    q = np.asarray(tensors["blk.0.attn_q.weight"].data)
    assert not np.array_equal(q, hf_weights["model.layers.0.self_attn.q_proj.weight"].numpy())


def test_llama_cpp_tokenizes_like_hf(llm: Any, hf: tuple[Any, Any]) -> None:
    tokenizer, model = hf
    assert llm.n_vocab() == model.config.vocab_size
    texts = [*PROMPTS, " leading space", "don't STOP 12345678 ... \r\n\n  x", "Ñandú ẞ ÿ 😀😀"]
    for text in texts:
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert ids == tokenizer.encode(text, add_special_tokens=False), text
        # add_bos=True adds the special tokens the model asks for: BOS, as in HF.
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        assert ids == tokenizer(text).input_ids, text


def test_logits_match_transformers(llm: Any, hf: tuple[Any, Any]) -> None:
    tokenizer, model = hf
    worst = 0.0
    for text in PROMPTS:
        ids = tokenizer(text).input_ids
        llm.reset()
        llm.eval(ids)
        ours = np.asarray(llm.scores[: len(ids)])
        with torch.no_grad():
            theirs = model(torch.tensor([ids])).logits[0].numpy()
        assert ours.shape == theirs.shape
        diff = float(np.abs(ours - theirs).max())
        worst = max(worst, diff)
        assert diff < 1e-3, (text, diff)
        # Measured: about 1e-5, against logits of standard deviation about 3.
        assert (ours.argmax(-1) == theirs.argmax(-1)).all(), text
    print(f"llama.cpp vs transformers logits, max abs diff over all positions: {worst:.3g}")


@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_tokens_match_transformers(llm: Any, hf: tuple[Any, Any], text: str) -> None:
    tokenizer, model = hf
    prompt = tokenizer(text).input_ids
    assert prompt[0] == tokenizer.bos_token_id
    assert llm.tokenize(text.encode(), add_bos=True, special=False) == prompt
    expected = _hf_greedy(model, prompt, NEW_TOKENS)
    assert len(expected) == NEW_TOKENS  # no EOS on these prompts
    assert _llama_greedy(llm, prompt, NEW_TOKENS) == expected


@pytest.mark.parametrize("spec", PADDED_SPECS, ids=lambda s: f"{s.vocab}-{s.pad_vocab_to}")
def test_padded_vocab(spec: TinyModelSpec) -> None:
    path = build_tiny_gguf(spec)
    vocab = read_gguf_vocab(spec.vocab)
    assert spec.pad_vocab_to is not None and spec.pad_vocab_to > len(vocab)
    tokenizer, model = _load_hf(path.parent)
    assert model.config.vocab_size == spec.pad_vocab_to

    pads = range(len(vocab), spec.pad_vocab_to)
    if len(vocab) < 50_000:  # GGUFReader takes ~10 s on a 128k vocabulary
        reader = gguf.GGUFReader(path)
        tokens = reader.fields["tokenizer.ggml.tokens"].contents()
        types = reader.fields["tokenizer.ggml.token_type"].contents()
        assert len(tokens) == len(types) == spec.pad_vocab_to
        assert tuple(tokens[: len(vocab)]) == vocab.tokens
        assert tokens[len(vocab) :] == [f"[PAD{i}]" for i in pads]
        assert set(types[len(vocab) :]) == {5}  # UNUSED, as convert_hf_to_gguf.py writes them
        if vocab.scores:
            scores = reader.fields["tokenizer.ggml.scores"].contents()
            assert len(scores) == spec.pad_vocab_to
            assert set(scores[len(vocab) :]) == {-1000.0}
        embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
        assert list(embd.shape) == [spec.hidden_size, spec.pad_vocab_to]
        del reader

    llm = _load_llama(path)
    try:
        assert llm.n_vocab() == spec.pad_vocab_to
        # llama.cpp's own view of the placeholders: their text and the UNUSED attribute.
        lvocab = llama_cpp.llama_model_get_vocab(llm.model)
        for i in (pads[0], pads[-1]):
            assert llama_cpp.llama_vocab_get_text(lvocab, i) == f"[PAD{i}]".encode()
            assert llama_cpp.llama_vocab_get_attr(lvocab, i) == llama_cpp.LLAMA_TOKEN_ATTR_UNUSED
        for text in PROMPTS:
            prompt = tokenizer(text).input_ids
            assert llm.tokenize(text.encode(), add_bos=True, special=False) == prompt, text
            llm.reset()
            llm.eval(prompt)
            ours = np.asarray(llm.scores[: len(prompt)])
            with torch.no_grad():
                theirs = model(torch.tensor([prompt])).logits[0].numpy()
            assert float(np.abs(ours - theirs).max()) < 1e-3, text
            assert not ours[:, len(vocab) :].any()  # zero rows give logits of exactly 0
            expected = _hf_greedy(model, prompt, NEW_TOKENS)
            assert len(expected) == NEW_TOKENS
            assert _llama_greedy(llm, prompt, NEW_TOKENS) == expected, text
    finally:
        llm.close()
