"""A llama.cpp model's own vocabulary (see the package's docstring for what it relies on)."""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

import llama_cpp

from anylogits.core.vocab import Vocabulary

_VOCABULARIES: weakref.WeakKeyDictionary[Any, Vocabulary] = weakref.WeakKeyDictionary()


def vocabulary_of(model: llama_cpp.Llama) -> Vocabulary:
    """The model's own vocabulary, read through llama.cpp (``llama_token_to_piece``).

    End-of-sequence ids are every end-of-generation token (``llama_vocab_is_eog``:
    e.g. Llama 3's ``<|end_of_text|>``, ``<|eot_id|>``, ``<|eom_id|>``), since llama.cpp
    stops on any of them; a Hugging Face tokenizer usually names only one.
    """
    cached = _VOCABULARIES.get(model)
    if cached is not None:
        return cached
    handle = model._model.vocab
    size = model.n_vocab()
    buffer = ctypes.create_string_buffer(256)
    tokens: list[bytes] = []
    eos: set[int] = set()
    special: set[int] = set()
    for token_id in range(size):
        length = llama_cpp.llama_token_to_piece(handle, token_id, buffer, len(buffer), 0, True)
        if length < 0:
            buffer = ctypes.create_string_buffer(-length)
            length = llama_cpp.llama_token_to_piece(handle, token_id, buffer, -length, 0, True)
        tokens.append(buffer.raw[:length])
        if llama_cpp.llama_vocab_is_eog(handle, token_id):
            eos.add(token_id)
        if llama_cpp.llama_vocab_is_control(handle, token_id):
            special.add(token_id)
    bos = model.token_bos()
    model_ref = weakref.ref(model)

    def encode(text: str) -> list[int]:
        live = model_ref()
        if live is None:
            raise RuntimeError("the llama.cpp model this vocabulary came from no longer exists")
        return list(live.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    vocab = Vocabulary(
        tokens=tuple(tokens),
        eos_token_ids=frozenset(eos),
        special_token_ids=frozenset(special),
        bos_token_id=bos if bos >= 0 else None,
        encode=encode,
    )
    _VOCABULARIES[model] = vocab
    return vocab
