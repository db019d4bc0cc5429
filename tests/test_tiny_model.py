"""Tests of the tiny deterministic Llama that other tests and the demo run on.

The first run builds the models into the anylogits cache (``ANYLOGITS_CACHE_DIR`` or
``~/.cache/anylogits``), downloading llama.cpp's vocab files unless ``ANYLOGITS_VOCAB_DIR``
points at a folder that has them; later runs load them from there in well under a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

for _module in ("transformers", "tokenizers", "gguf", "safetensors"):
    pytest.importorskip(_module)

import torch  # noqa: E402

from anylogits.testing import tiny_model as tm  # noqa: E402
from anylogits.testing.tiny_model.weights import layer_sizes  # noqa: E402

# A golden slice of the default weights: if make_weights changes on purpose, bump
# BUILDER_VERSION (cached folders and other formats built from the old weights become
# stale) and update these numbers.
_GOLDEN_EMBED_ROW0 = [
    -1.1258398294448853 * 0.02,
    -1.152360200881958 * 0.02,
    -0.2505785822868347 * 0.02,
]


@pytest.fixture(scope="session")
def model_dir() -> Callable[..., Path]:
    """Build (or find in the cache) a tiny model; memoized for the session."""
    built: dict[tm.TinyModelSpec, Path] = {}

    def get(vocab: str = tm.DEFAULT_VOCAB, **fields: object) -> Path:
        spec = tm.TinyModelSpec(vocab=vocab, **fields)  # type: ignore[arg-type]
        if spec not in built:
            built[spec] = tm.build_tiny_model(spec)
        return built[spec]

    return get


@pytest.fixture(scope="session")
def load() -> Callable[[Path], tuple[Any, Any]]:
    """Load a folder with the Auto classes; memoized, as the 128k-token tokenizer.json
    alone takes about a second to parse."""
    loaded: dict[Path, tuple[Any, Any]] = {}

    def get(folder: Path) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if folder not in loaded:
            model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
            # Every tensor written is one the model expects, and the reverse.
            assert not info["missing_keys"] and not info["unexpected_keys"], info
            loaded[folder] = model.eval(), AutoTokenizer.from_pretrained(folder)
        return loaded[folder]

    return get


def test_import_does_not_load_heavy_libraries() -> None:
    code = (
        "import sys, anylogits.testing.tiny_model\n"
        "print(sorted(m for m in ('transformers', 'tokenizers', 'gguf', 'safetensors')"
        " if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("vocab", tm.SUPPORTED_VOCABS)
def test_tokenizer_matches_llama_cpp_test_vectors(
    model_dir: Callable[..., Path], load: Callable[[Path], tuple[Any, Any]], vocab: str
) -> None:
    # The saved and reloaded tokenizer, i.e. what every consumer of the folder gets.
    _, tokenizer = load(model_dir(vocab))
    vectors = tm.vocab_test_vectors(vocab)
    assert len(vectors) >= 40
    mismatches = [
        (text, expected, got)
        for text, expected in vectors
        if (got := tokenizer.encode(text, add_special_tokens=False)) != expected
    ]
    assert not mismatches, f"{len(mismatches)}/{len(vectors)} differ, first: {mismatches[0]}"
    # Decoding gives the text back (llama.cpp's vectors contain no special tokens).
    assert all(tokenizer.decode(ids) == text for text, ids in vectors)


@pytest.mark.parametrize(
    ("vocab", "bos_added"), [("llama-bpe", True), ("gpt-2", False), ("llama-spm", True)]
)
def test_special_tokens_follow_llama_cpp(
    model_dir: Callable[..., Path],
    load: Callable[[Path], tuple[Any, Any]],
    vocab: str,
    bos_added: bool,
) -> None:
    _, tokenizer = load(model_dir(vocab))
    ids = tokenizer("Hello world").input_ids
    assert (ids[0] == tokenizer.bos_token_id) is bos_added
    assert tokenizer.encode("Hello world", add_special_tokens=False) == ids[int(bos_added) :]
    # Special tokens in the text are one token each, never split into pieces.
    eos = tokenizer.eos_token
    assert tokenizer.encode(f"a{eos}b", add_special_tokens=False)[1] == tokenizer.eos_token_id


def test_folder_loads_with_auto_classes(
    model_dir: Callable[..., Path], load: Callable[[Path], tuple[Any, Any]]
) -> None:
    folder = model_dir()
    names = {p.name for p in folder.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= names

    raw = json.loads((folder / "config.json").read_text())
    # mlx-lm reads a top-level rope_theta and silently uses 10000 if it is missing.
    assert raw["rope_theta"] == raw["rope_parameters"]["rope_theta"] == 500000.0
    assert raw["head_dim"] == 32
    assert raw["dtype"] == raw["torch_dtype"] == "float32"
    assert raw["tie_word_embeddings"] is False

    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["do_sample"] is False
    assert not {"temperature", "top_k", "top_p"} & gen.keys()

    model, tokenizer = load(folder)
    config = model.config
    assert config.head_dim == 32
    assert config.num_hidden_layers == 2 and config.hidden_size == 64
    assert config.vocab_size == len(tokenizer) == 128256
    assert config.rope_parameters["rope_theta"] == 500000.0
    assert (config.bos_token_id, config.eos_token_id) == (128000, 128001)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (128000, 128001)
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


def test_padded_vocab(
    model_dir: Callable[..., Path], load: Callable[[Path], tuple[Any, Any]]
) -> None:
    padded_size = 128256 + 64
    model, tokenizer = load(model_dir(pad_vocab_to=padded_size))
    plain, _ = load(model_dir())
    assert model.config.vocab_size == padded_size > len(tokenizer) == 128256

    ids = tokenizer("Padding rows never win", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
        plain_logits = plain(ids).logits
    assert logits.shape[-1] == padded_size
    # Extra rows are zero: their logits are exactly 0, the others are the unpadded model's.
    assert torch.all(logits[..., len(tokenizer) :] == 0)
    torch.testing.assert_close(logits[..., : len(tokenizer)], plain_logits, rtol=0, atol=1e-5)

    with pytest.raises(ValueError, match="smaller than"):
        tm.build_tiny_model(tm.TinyModelSpec(vocab="gpt-2", pad_vocab_to=1000))


def test_greedy_generation_is_not_degenerate(
    model_dir: Callable[..., Path], load: Callable[[Path], tuple[Any, Any]]
) -> None:
    model, tokenizer = load(model_dir())
    ids = tokenizer("The quick brown fox", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False)
    new = out[0, ids.shape[1] :].tolist()
    assert len(new) == 20
    assert len(set(new)) >= 10, new

    # The next token depends on the context, not only on the last token.
    changed = ids.clone()
    changed[0, 1] = 1000
    with torch.no_grad():
        a, b = model(ids).logits[0, -1], model(changed).logits[0, -1]
    assert (a - b).abs().max() > 0.5


def test_weights_are_seeded_and_stable() -> None:
    from transformers import LlamaConfig

    spec = tm.TinyModelSpec()
    config = LlamaConfig(vocab_size=1000, **layer_sizes(spec))
    a, b = tm.make_weights(spec, config), tm.make_weights(spec, config)
    c = tm.make_weights(tm.TinyModelSpec(seed=1), config)
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])
    assert all(t.dtype == torch.float32 for t in a.values())
    assert a["model.layers.1.self_attn.q_proj.weight"].shape == (64, 64)
    assert a["model.layers.0.mlp.down_proj.weight"].shape == (64, 128)
    assert torch.equal(a["model.norm.weight"], torch.ones(64))
    torch.testing.assert_close(
        a["model.embed_tokens.weight"][0, :3], torch.tensor(_GOLDEN_EMBED_ROW0), rtol=0, atol=1e-6
    )

    # Padding rows are zero and the real rows are unchanged.
    padded = tm.make_weights(
        spec, LlamaConfig(**{**config.to_dict(), "vocab_size": 1064}), num_tokens=1000
    )
    assert torch.equal(padded["lm_head.weight"][:1000], a["lm_head.weight"])
    assert not padded["lm_head.weight"][1000:].any()


def test_builds_are_byte_identical(model_dir: Callable[..., Path], tmp_path: Path) -> None:
    # gpt-2: the smallest byte-level vocab, so that two forced builds stay cheap.
    spec = tm.TinyModelSpec(vocab="gpt-2")
    first = tm.build_tiny_model(spec, cache_dir=tmp_path / "a", force=True)
    second = tm.build_tiny_model(spec, cache_dir=tmp_path / "b", force=True)
    cached = model_dir("gpt-2")  # possibly built by an earlier process
    assert first.name == second.name == cached.name
    files = sorted(p.name for p in first.iterdir())
    assert (
        files
        == sorted(p.name for p in second.iterdir())
        == sorted(p.name for p in cached.iterdir())
    )
    for name in files:
        data = (first / name).read_bytes()
        assert data == (second / name).read_bytes() == (cached / name).read_bytes(), name
    # Nothing but the finished folder is left in the cache folder.
    assert [p.name for p in (tmp_path / "a").iterdir()] == [first.name]


def test_second_call_uses_the_cache(model_dir: Callable[..., Path]) -> None:
    folder = model_dir()
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    start = time.perf_counter()
    again = tm.build_tiny_model()
    assert time.perf_counter() - start < 1.0
    assert again == folder
    assert weights.stat().st_mtime_ns == before


def test_force_replaces_the_folder(tmp_path: Path) -> None:
    spec = tm.TinyModelSpec(vocab="gpt-2")
    folder = tm.build_tiny_model(spec, cache_dir=tmp_path)
    (folder / "stray").write_text("left by someone")
    # What a build killed half-way leaves: removed by a later build once it is old enough.
    stale, fresh = tmp_path / f".{folder.name}.killed", tmp_path / f".{folder.name}.running"
    stale.mkdir()
    fresh.mkdir()
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert tm.build_tiny_model(spec, cache_dir=tmp_path, force=True) == folder
    assert not (folder / "stray").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folder.name, fresh.name])


def test_cache_key_covers_spec_and_vocab_file() -> None:
    base = tm.TinyModelSpec()
    assert base.cache_key("x") == tm.TinyModelSpec().cache_key("x")
    assert tm.TinyModelSpec(seed=1).cache_key("x") != base.cache_key("x")
    assert tm.TinyModelSpec(pad_vocab_to=128320).cache_key("x") != base.cache_key("x")
    assert base.cache_key("y") != base.cache_key("x")


def test_unsupported_vocab_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unsupported vocab 'falcon'"):
        tm.TinyModelSpec(vocab="falcon")
    with pytest.raises(ValueError, match="unsupported vocab 'falcon'"):
        tm.build_tokenizer("falcon")


def test_vocab_dir_override_without_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANYLOGITS_VOCAB_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"ggml-vocab-gpt-2\.gguf"):
        tm.vocab_gguf_path("gpt-2")


def test_the_first_run_download_is_described_until_the_files_are_cached(
    model_dir: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir()
    assert tm.vocab_download() is None
    assert tm.tiny_model_cached()
    assert not tm.tiny_model_cached(cache_dir=tmp_path / "models")
    monkeypatch.delenv("ANYLOGITS_VOCAB_DIR", raising=False)
    monkeypatch.setenv("ANYLOGITS_CACHE_DIR", str(tmp_path))
    described = tm.vocab_download()
    assert described is not None
    # Which file from where, and where its vocab files are kept.
    assert f"llama_cpp_python-{tm.LLAMA_CPP_PYTHON_VERSION}.tar.gz" in described
    assert "PyPI" in described and str(tmp_path / "vocab") in described
    assert not tm.tiny_model_cached()
    monkeypatch.setenv("ANYLOGITS_VOCAB_DIR", str(tmp_path))  # nothing is downloaded then
    assert tm.vocab_download() is None


def test_cache_root_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYLOGITS_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tm.cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("ANYLOGITS_CACHE_DIR")
    assert tm.cache_root() == tmp_path / "xdg" / "anylogits"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tm.cache_root() == Path.home() / ".cache" / "anylogits"


def test_command_line(model_dir: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    expected = model_dir("llama-spm")
    assert tm.main(["--vocab", "llama-spm"]) == 0
    assert capsys.readouterr().out.strip() == str(expected)
    with pytest.raises(SystemExit):
        tm.main(["--vocab", "no-such-vocab"])
