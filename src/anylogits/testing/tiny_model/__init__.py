"""A deterministic tiny random-weight Llama model with a real tokenizer vocabulary.

The model is saved as a Hugging Face folder (``model.safetensors``, ``config.json``,
``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json``) under a cache
folder, so that tests and demos can load it with ``from_pretrained`` in well under a second
after the first build.

Where the pieces come from:

* The vocabulary is a real one, read from the vocab-only GGUF files that llama.cpp ships for
  its tokenizer tests (``ggml-vocab-<name>.gguf``). They are taken from the
  llama-cpp-python source distribution on PyPI, which vendors llama.cpp; only the few files
  needed are extracted into the cache. Set ``ANYLOGITS_VOCAB_DIR`` to a folder holding
  ``ggml-vocab-*.gguf`` files to skip the download.
* The tokenizer is rebuilt from the GGUF fields as a ``tokenizers.Tokenizer`` whose
  pre-tokenizer mirrors llama.cpp's for that vocabulary; it reproduces llama.cpp's own
  tokenizer test vectors (``.gguf.inp`` / ``.gguf.out``) exactly.
* The weights come from :func:`make_weights`, a pure function of the spec (seeded), kept
  separate from the writer so that other formats (GGUF, MLX) can be produced from the very
  same tensors.
* :func:`build_tiny_gguf` adds the llama.cpp form of the same weights (``model-f32.gguf``,
  float32, written with the ``gguf`` package) to the same folder.

Heavy libraries (transformers, tokenizers, gguf, safetensors, torch) are imported inside the
functions that need them, so importing this module is cheap.

One module per step: ``spec`` (what a model is), ``vocab_files`` (llama.cpp's vocab files and
test vectors), ``gguf_vocab`` (their tokenizer fields), ``tokenizer`` (the Hugging Face
tokenizer), ``weights`` (config and weights), ``hf_folder`` (the cached folder), ``gguf_model``
(the GGUF file) and ``cli`` (``python -m anylogits.testing.tiny_model``).
"""

from anylogits.testing.pins import LLAMA_CPP_PYTHON_VERSION
from anylogits.testing.tiny_model.cli import main
from anylogits.testing.tiny_model.gguf_model import GGUF_FILENAME, build_tiny_gguf
from anylogits.testing.tiny_model.gguf_vocab import GGUFVocab, read_gguf_vocab
from anylogits.testing.tiny_model.hf_folder import build_tiny_model, tiny_model_cached
from anylogits.testing.tiny_model.spec import (
    BUILDER_VERSION,
    DEFAULT_VOCAB,
    SUPPORTED_VOCABS,
    TinyModelSpec,
)
from anylogits.testing.tiny_model.tokenizer import build_tokenizer
from anylogits.testing.tiny_model.vocab_files import (
    cache_root,
    vocab_download,
    vocab_gguf_path,
    vocab_test_vectors,
)
from anylogits.testing.tiny_model.weights import (
    make_config,
    make_generation_config,
    make_weights,
)

__all__ = [
    "BUILDER_VERSION",
    "DEFAULT_VOCAB",
    "GGUF_FILENAME",
    "LLAMA_CPP_PYTHON_VERSION",
    "SUPPORTED_VOCABS",
    "GGUFVocab",
    "TinyModelSpec",
    "build_tiny_gguf",
    "build_tiny_model",
    "build_tokenizer",
    "cache_root",
    "main",
    "make_config",
    "make_generation_config",
    "make_weights",
    "read_gguf_vocab",
    "tiny_model_cached",
    "vocab_download",
    "vocab_gguf_path",
    "vocab_test_vectors",
]
