"""``anylogits cache``: the cache's parts with paths and sizes, and removing them."""

from __future__ import annotations

from pathlib import Path

import pytest

from anylogits.cli import main


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ANYLOGITS_CACHE_DIR", str(tmp_path))
    (tmp_path / "models" / "real-v1").mkdir(parents=True)
    (tmp_path / "models" / "real-v1" / "model.safetensors").write_bytes(b"x" * 2_500_000)
    (tmp_path / "models" / "tiny").mkdir()
    (tmp_path / "models" / "tiny" / "config.json").write_bytes(b"x" * 1500)
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "ggml-vocab-llama-bpe.gguf").write_bytes(b"x" * 10)
    return tmp_path


def test_the_cache_is_listed_with_paths_and_sizes(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"anylogits cache: {cache} (ANYLOGITS_CACHE_DIR sets another)"
    assert lines[1].split() == ["2.5", "MB", "models/real-v1", str(cache / "models" / "real-v1")]
    assert lines[2].split() == ["1.5", "KB", "models/tiny", str(cache / "models" / "tiny")]
    assert lines[3].split() == ["10", "B", "vocab", str(cache / "vocab")]
    assert lines[4].split()[:4] == ["2.5", "MB", "in", "all."]


def test_named_parts_are_removed_and_others_kept(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", "--remove", "models/real-v1", "vocab"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "removed models/real-v1 (2.5 MB)",
        "removed vocab (10 B)",
    ]
    assert sorted(path.name for path in cache.rglob("*")) == ["config.json", "models", "tiny"]
    assert main(["cache", "--remove", "all"]) == 0
    assert list((cache / "models").iterdir()) == []


def test_a_name_not_in_the_cache_is_refused_naming_the_parts(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", "--remove", "models/nope", "vocab"]) == 2
    error = capsys.readouterr().err
    assert "not in" in error and "models/nope" in error and "models/real-v1" in error
    assert (cache / "vocab").exists()  # nothing removed when a name is wrong


def test_each_model_part_says_what_model_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The files a server's --model takes, not only their folders: a user found the
    quantized GGUF only by listing the folder."""
    monkeypatch.setenv("ANYLOGITS_CACHE_DIR", str(tmp_path))
    quantized = tmp_path / "models" / "real-q4_1"
    quantized.mkdir(parents=True)
    (quantized / "Real.Q4_1.gguf").write_bytes(b"x")
    real = tmp_path / "models" / "real-v1"
    real.mkdir()
    for name in ("config.json", "model.safetensors", "model-f32.gguf"):
        (real / name).write_bytes(b"x")
    assert main(["cache"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert lines[2] == ["--model", str(quantized / "Real.Q4_1.gguf"), "(llama-cpp)"]
    assert lines[4] == ["--model", str(real), "(vllm,", "mlx,", "transformers)"]
    assert lines[5] == ["--model", str(real / "model-f32.gguf"), "(llama-cpp)"]
