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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, LlamaConfig, PreTrainedTokenizerFast

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
    "vocab_gguf_path",
    "vocab_test_vectors",
]

#: Bump whenever the bytes written for a given spec change (weights, config, tokenizer):
#: it is part of the cache key, so stale folders are never reused.
BUILDER_VERSION = 3

#: The llama-cpp-python source distribution whose vendored llama.cpp provides the vocab files.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

DEFAULT_VOCAB = "llama-bpe"

#: Vocabularies whose tokenizer is rebuilt faithfully (checked against llama.cpp's vectors).
SUPPORTED_VOCABS: tuple[str, ...] = ("llama-bpe", "gpt-2", "qwen2", "llama-spm")

# SHA-256 of the vocab files in llama-cpp-python 0.3.36, checked after a download so that a
# corrupted or changed upstream file fails loudly instead of silently changing the model.
_VOCAB_SHA256 = {
    "llama-bpe": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "gpt-2": "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
    "qwen2": "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    "llama-spm": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
}

_SDIST_MODELS_DIR = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/models"

# Pre-tokenizer regexes, as in the original Hugging Face tokenizer.json files. llama.cpp
# rewrites the case-insensitive group by hand because its regex engine lacks (?i:...);
# the tokenizers library (Oniguruma) supports it, so the originals are used.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# llama.cpp token types (enum llama_token_type in llama.h).
_TT_NORMAL, _TT_UNKNOWN, _TT_CONTROL, _TT_USER_DEFINED, _TT_UNUSED, _TT_BYTE = 1, 2, 3, 4, 5, 6

_MARKER = "anylogits_tiny_model.json"
_TEST_SEPARATOR = "\n__ggml_vocab_test__\n"


# --------------------------------------------------------------------------------------
# Spec
# --------------------------------------------------------------------------------------


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
        _check_vocab_name(self.vocab)
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


def _check_vocab_name(vocab: str) -> None:
    if vocab not in SUPPORTED_VOCABS:
        raise ValueError(
            f"unsupported vocab {vocab!r}: the tiny model's tokenizer can be rebuilt from "
            f"these llama.cpp vocab files only: {', '.join(SUPPORTED_VOCABS)}"
        )


# --------------------------------------------------------------------------------------
# Cache and vocab files
# --------------------------------------------------------------------------------------


def cache_root() -> Path:
    """Root of anylogits' cache.

    ``$ANYLOGITS_CACHE_DIR``, else ``$XDG_CACHE_HOME/anylogits``, else
    ``~/.cache/anylogits``.
    """
    if env := os.environ.get("ANYLOGITS_CACHE_DIR"):
        return Path(env).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "anylogits"
    return Path.home() / ".cache" / "anylogits"


def _vocab_cache_dir() -> Path:
    return cache_root() / "vocab" / f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}"


def _override_dir() -> Path | None:
    env = os.environ.get("ANYLOGITS_VOCAB_DIR")
    return Path(env).expanduser() if env else None


def vocab_gguf_path(vocab: str = DEFAULT_VOCAB) -> Path:
    """Path of ``ggml-vocab-<vocab>.gguf``, downloading it into the cache if needed.

    With ``ANYLOGITS_VOCAB_DIR`` set, the file is taken from that folder and nothing is
    downloaded. Otherwise the llama-cpp-python sdist is fetched once with pip (about
    77 MB), the vocab files of every supported vocabulary (about 16 MB) and their test
    vectors are extracted into the cache, and the tarball is deleted.

    Raises:
        ValueError: ``vocab`` is not in :data:`SUPPORTED_VOCABS`.
        FileNotFoundError: ``ANYLOGITS_VOCAB_DIR`` is set but lacks the file.
    """
    _check_vocab_name(vocab)
    name = f"ggml-vocab-{vocab}.gguf"
    override = _override_dir()
    if override is not None:
        path = override / name
        if not path.is_file():
            raise FileNotFoundError(f"ANYLOGITS_VOCAB_DIR={override} has no {name}")
        return path
    path = _vocab_cache_dir() / name
    if not path.is_file():
        _fetch_vocab_files(_vocab_cache_dir())
    return path


def _fetch_vocab_files(dest: Path) -> None:
    """Download the llama-cpp-python sdist and extract the supported vocab files into dest.

    Each file is written to a temporary folder inside ``dest`` and moved into place with
    an atomic rename, the ``.gguf`` last: a reader sees a complete file or none, and two
    processes fetching at once both end with the same bytes in place.
    """
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {
        f"{_SDIST_MODELS_DIR}/ggml-vocab-{v}.gguf{ext}": f"ggml-vocab-{v}.gguf{ext}"
        for v in SUPPORTED_VOCABS
        for ext in ("", ".inp", ".out")
    }
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest) as tmp_name:
        tmp = Path(tmp_name)
        download = tmp / "download"
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--no-binary=:all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
            "-d", str(download),
        ]  # fmt: skip
        try:
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise RuntimeError(
                f"could not download llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} with "
                f"`{' '.join(cmd)}` (needs pip in this interpreter and access to PyPI); "
                "alternatively set ANYLOGITS_VOCAB_DIR to a folder holding the "
                "ggml-vocab-*.gguf files"
            ) from exc
        sdists = sorted(download.glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            raise RuntimeError(f"pip download left no llama-cpp-python sdist in {download}")
        staged = tmp / "staged"
        staged.mkdir()
        # Stream through the gzip once; only the wanted members are ever written out.
        with tarfile.open(sdists[0], mode="r|gz") as tar:
            for member in tar:
                target = wanted.get(member.name)
                if target is None or not member.isfile():
                    continue
                src = tar.extractfile(member)
                assert src is not None  # a regular file always has a payload
                with src, open(staged / target, "wb") as out:
                    shutil.copyfileobj(src, out)
        for vocab, digest in _VOCAB_SHA256.items():
            path = staged / f"ggml-vocab-{vocab}.gguf"
            if not path.is_file():
                raise RuntimeError(f"{path.name} missing from {sdists[0].name}")
            if _sha256(path) != digest:
                raise RuntimeError(f"{path.name} from {sdists[0].name} has an unexpected hash")
        # Test vectors first, .gguf last: vocab_gguf_path() only checks for the .gguf.
        for path in sorted(staged.iterdir(), key=lambda p: (p.suffix == ".gguf", p.name)):
            os.replace(path, dest / path.name)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def vocab_test_vectors(vocab: str = DEFAULT_VOCAB) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test vectors for ``vocab``: (text, expected ids) pairs.

    Read from ``ggml-vocab-<vocab>.gguf.inp`` / ``.out`` next to the vocab file (falling
    back to the download cache when ``ANYLOGITS_VOCAB_DIR`` lacks them). The format is the
    one ``tests/test-tokenizer-0.cpp`` reads: inputs separated by a line
    ``__ggml_vocab_test__``, one output line of space-separated ids per input; the ids
    are what llama.cpp produces without adding special tokens and without parsing special
    tokens in the text.
    """
    gguf = vocab_gguf_path(vocab)
    inp, out = Path(f"{gguf}.inp"), Path(f"{gguf}.out")
    if not (inp.is_file() and out.is_file()):
        cached = _vocab_cache_dir() / gguf.name
        if not cached.is_file():
            _fetch_vocab_files(_vocab_cache_dir())
        inp, out = Path(f"{cached}.inp"), Path(f"{cached}.out")
    # newline="" keeps "\r\n" and lone "\r" in the inputs as they are in the file.
    with open(inp, encoding="utf-8", newline="") as f:
        raw = f.read()
    texts: list[str] = []
    pos = 0
    while pos < len(raw):  # same splitting as read_tests() in test-tokenizer-0.cpp
        nxt = raw.find(_TEST_SEPARATOR, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(_TEST_SEPARATOR)
    with open(out, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if len(texts) != len(lines):
        raise ValueError(f"{inp.name} has {len(texts)} inputs but {out.name} {len(lines)} lines")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines, strict=True)]


# --------------------------------------------------------------------------------------
# Vocabulary and tokenizer
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer fields of a llama.cpp vocab file, as plain Python values.

    ``merges`` is empty for SentencePiece vocabularies and ``scores`` empty for BPE ones;
    the ``*_token_id`` fields are ``None`` where the file does not set them.
    """

    name: str
    model: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    pre: str  # tokenizer.ggml.pre: llama.cpp's pre-tokenizer name
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    scores: tuple[float, ...]
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool
    add_eos_token: bool
    sha256: str

    def __len__(self) -> int:
        return len(self.tokens)


@functools.lru_cache(maxsize=4)
def _read_gguf_vocab_cached(path: str, sha256: str) -> GGUFVocab:
    from gguf import GGUFReader

    # GGUFReader parses every array element into its own numpy view: about 10 s for the
    # 128k-token Llama-3 vocab. Hence the cache here and the built folders on disk.
    fields = GGUFReader(path).fields

    def get(key: str, default: Any = None) -> Any:
        field = fields.get(key)
        return default if field is None else field.contents()

    model = get("tokenizer.ggml.model")
    pre = get("tokenizer.ggml.pre", "default")
    # llama.cpp's defaults when the file does not say (llama_vocab::impl::load).
    add_bos_default = model == "llama" or pre in ("llama-bpe", "llama3", "llama-v3")
    return GGUFVocab(
        name=Path(path).name.removeprefix("ggml-vocab-").removesuffix(".gguf"),
        model=model,
        pre=pre,
        tokens=tuple(get("tokenizer.ggml.tokens")),
        token_types=tuple(int(t) for t in get("tokenizer.ggml.token_type")),
        merges=tuple(get("tokenizer.ggml.merges", ())),
        scores=tuple(float(s) for s in get("tokenizer.ggml.scores", ())),
        bos_token_id=get("tokenizer.ggml.bos_token_id"),
        eos_token_id=get("tokenizer.ggml.eos_token_id"),
        unk_token_id=get("tokenizer.ggml.unknown_token_id"),
        pad_token_id=get("tokenizer.ggml.padding_token_id"),
        add_bos_token=bool(get("tokenizer.ggml.add_bos_token", add_bos_default)),
        add_eos_token=bool(get("tokenizer.ggml.add_eos_token", False)),
        sha256=sha256,
    )


def read_gguf_vocab(vocab: str = DEFAULT_VOCAB) -> GGUFVocab:
    """Read the tokenizer fields of ``ggml-vocab-<vocab>.gguf`` (memoized per file hash)."""
    path = vocab_gguf_path(vocab)
    return _read_gguf_vocab_cached(str(path), _sha256(path))


def _build_backend_tokenizer(v: GGUFVocab) -> Tokenizer:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers as pre
    from tokenizers import processors as post

    vocab = {tok: i for i, tok in enumerate(v.tokens)}
    if len(vocab) != len(v.tokens):
        raise ValueError(f"vocab {v.name!r} has duplicate tokens")

    if v.model == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in v.merges]
        # llama.cpp's LLAMA3 pre-tokenizer sets ignore_merges: a pre-token that is itself
        # in the vocabulary becomes that token, as in Llama 3's tokenizer.json.
        tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=v.pre == "llama-bpe"))
        if v.pre == "gpt-2":
            tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False, use_regex=True)
        elif v.pre in ("llama-bpe", "qwen2"):
            regex = _LLAMA3_SPLIT if v.pre == "llama-bpe" else _QWEN2_SPLIT
            tok.pre_tokenizer = pre.Sequence(
                [
                    pre.Split(Regex(regex), behavior="isolated", invert=False),
                    pre.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        else:
            raise ValueError(f"vocab {v.name!r}: unsupported pre-tokenizer {v.pre!r}")
        tok.decoder = decoders.ByteLevel()
    elif v.model == "llama":
        # SentencePiece BPE: llama.cpp merges the adjacent pair whose merged piece has the
        # highest score. A BPE whose merge ranks follow that score does the same; pieces
        # that are not normal text (control, byte, unknown) never result from a merge.
        unk = v.tokens[v.unk_token_id] if v.unk_token_id is not None else None
        ranked: list[tuple[float, int, int, str, str]] = []
        for piece, i in vocab.items():
            if v.token_types[i] not in (_TT_NORMAL, _TT_USER_DEFINED):
                continue
            for k in range(1, len(piece)):
                left, right = piece[:k], piece[k:]
                if left in vocab and right in vocab:
                    ranked.append((-v.scores[i], vocab[left], vocab[right], left, right))
        ranked.sort()
        merges = [(left, right) for *_, left, right in ranked]
        tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
        # add_space_prefix (llama.cpp's default for SPM) and spaces as "▁".
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        tok.decoder = decoders.Sequence(
            [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        )
    else:
        raise ValueError(f"vocab {v.name!r}: unsupported tokenizer model {v.model!r}")

    # Control and unknown tokens are special (never split, skipped by decode(...,
    # skip_special_tokens=True)); user-defined ones are plain added tokens, matched whole.
    added = [
        AddedToken(tok_str, special=t != _TT_USER_DEFINED, normalized=False)
        for tok_str, t in zip(v.tokens, v.token_types, strict=True)
        if t in (_TT_UNKNOWN, _TT_CONTROL, _TT_USER_DEFINED)
    ]
    tok.add_tokens(added)

    template_single, template_pair, specials = "$A:0", "$B:1", []
    if v.add_bos_token and v.bos_token_id is not None:
        bos = v.tokens[v.bos_token_id]
        template_single, template_pair = f"{bos}:0 $A:0", f"{bos}:1 $B:1"
        specials.append((bos, v.bos_token_id))
    if v.add_eos_token and v.eos_token_id is not None:
        eos = v.tokens[v.eos_token_id]
        template_single, template_pair = f"{template_single} {eos}:0", f"{template_pair} {eos}:1"
        specials.append((eos, v.eos_token_id))
    tok.post_processor = post.TemplateProcessing(
        single=template_single,
        pair=f"{template_single} {template_pair}",
        special_tokens=list(dict.fromkeys(specials)),
    )
    return tok


def build_tokenizer(
    vocab: str | GGUFVocab = DEFAULT_VOCAB, *, model_max_length: int | None = None
) -> PreTrainedTokenizerFast:
    """Build a Hugging Face fast tokenizer equivalent to llama.cpp's for ``vocab``.

    ``encode(text, add_special_tokens=False)`` gives the ids that llama.cpp gives for the
    same text (checked against llama.cpp's test vectors). With special tokens, BOS/EOS are
    added where llama.cpp adds them for that vocabulary (Llama 3 and SentencePiece Llama:
    BOS; GPT-2 and Qwen2: nothing). One difference by design: special tokens written in the
    text (``"<|eot_id|>"``) are matched as one token, as Hugging Face tokenizers do, while
    llama.cpp's test vectors tokenize them as text.

    Raises:
        ValueError: the vocabulary is not supported.
    """
    from transformers import PreTrainedTokenizerFast

    v = read_gguf_vocab(vocab) if isinstance(vocab, str) else vocab

    def token(idx: int | None) -> str | None:
        return None if idx is None else v.tokens[idx]

    kwargs: dict[str, Any] = {
        "bos_token": token(v.bos_token_id),
        "eos_token": token(v.eos_token_id),
        "unk_token": token(v.unk_token_id),
        "pad_token": token(v.pad_token_id),
    }
    return PreTrainedTokenizerFast(
        tokenizer_object=_build_backend_tokenizer(v),
        # Explicit, so that tokenizer.add_bos_token tells the truth; transformers 5 then
        # regenerates the same BOS/EOS template as the post-processor built above.
        add_bos_token=v.add_bos_token,
        add_eos_token=v.add_eos_token,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length or int(1e30),
        **{k: val for k, val in kwargs.items() if val is not None},
    )


# --------------------------------------------------------------------------------------
# Config and weights
# --------------------------------------------------------------------------------------


def _model_vocab_size(spec: TinyModelSpec, num_tokens: int) -> int:
    if spec.pad_vocab_to is None:
        return num_tokens
    if spec.pad_vocab_to < num_tokens:
        raise ValueError(
            f"pad_vocab_to={spec.pad_vocab_to} is smaller than the {num_tokens} tokens "
            f"of vocab {spec.vocab!r}"
        )
    return spec.pad_vocab_to


def make_config(spec: TinyModelSpec, vocab: GGUFVocab) -> LlamaConfig:
    """The ``LlamaConfig`` of the tiny model (float32, untied embeddings)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=_model_vocab_size(spec, len(vocab)),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        hidden_act="silu",
        bos_token_id=vocab.bos_token_id,
        eos_token_id=vocab.eos_token_id,
        pad_token_id=vocab.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )


def make_generation_config(vocab: GGUFVocab) -> GenerationConfig:
    """Greedy by default, with no sampling parameters that would add logits processors."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=vocab.bos_token_id,
        eos_token_id=vocab.eos_token_id,
        pad_token_id=vocab.pad_token_id,
        do_sample=False,
    )


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


# --------------------------------------------------------------------------------------
# Writing the folder
# --------------------------------------------------------------------------------------


def _rewrite_json(path: Path, update: dict[str, Any]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(update)
    # The writer's version: builds by different transformers versions (the vLLM and MLX
    # sessions pin their own) must stay byte-identical.
    data.pop("transformers_version", None)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_model_folder(spec: TinyModelSpec, vocab: GGUFVocab, folder: Path) -> None:
    from safetensors.torch import save_file

    config = make_config(spec, vocab)
    config.save_pretrained(folder)
    # transformers 5 writes rope_theta only inside rope_parameters; readers written for
    # transformers 4 (mlx-lm among them) look for a top-level rope_theta and silently fall
    # back to 10000 without it. torch_dtype is the transformers 4 name of dtype.
    _rewrite_json(folder / "config.json", {"rope_theta": spec.rope_theta, "torch_dtype": "float32"})
    make_generation_config(vocab).save_pretrained(folder)
    _rewrite_json(folder / "generation_config.json", {})

    tokenizer = build_tokenizer(vocab, model_max_length=spec.max_position_embeddings)
    tokenizer.save_pretrained(folder)
    # transformers 5 names the class "TokenizersBackend", which transformers 4 (as pinned
    # by some vLLM / mlx-lm installs) does not know; "PreTrainedTokenizerFast" is the
    # name both understand (an alias in 5). transformers 5 drops add_bos_token /
    # add_eos_token on save (tokenizer.json's post-processor is its source of truth), but
    # other readers use them, e.g. gguf's SpecialVocab when converting to GGUF.
    _rewrite_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": vocab.add_bos_token,
            "add_eos_token": vocab.add_eos_token,
        },
    )

    weights = make_weights(spec, config, num_tokens=len(vocab))
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _remove_stale_temporaries(root: Path, name: str, max_age_s: float = 3600.0) -> None:
    """Delete temporary folders (or files) of ``name`` that a killed build left behind.

    Only folders older than any build could take are removed, so a build running
    concurrently in another process keeps its own.
    """
    now = time.time()
    for path in root.glob(f".{name}.*"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > max_age_s:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink()


def build_tiny_model(
    spec: TinyModelSpec | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> Path:
    """Build (or find in the cache) the tiny model's Hugging Face folder and return it.

    The folder is ``<cache_dir>/tiny-llama-<vocab>-<key>``, where the key hashes the spec,
    :data:`BUILDER_VERSION` and the vocab file, so a second call returns at once. The
    folder is assembled under a temporary name in ``cache_dir`` and renamed into place,
    so an interrupted or concurrent build never leaves a partial folder behind.

    Args:
        spec: The model to build; defaults to ``TinyModelSpec()``.
        cache_dir: Folder holding built models; defaults to ``cache_root() / "models"``.
            (Vocab files are always cached under :func:`cache_root`.)
        force: Rebuild even if the folder exists, replacing it.
    """
    spec = spec or TinyModelSpec()
    gguf_path = vocab_gguf_path(spec.vocab)
    vocab_sha256 = _sha256(gguf_path)  # ~10 ms; keys the cache on the vocab file's bytes
    key = spec.cache_key(vocab_sha256)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    final = root / f"tiny-llama-{spec.vocab}-{key[:16]}"
    if not force and (final / _MARKER).is_file():
        return final

    vocab = _read_gguf_vocab_cached(str(gguf_path), vocab_sha256)
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(root, final.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        _write_model_folder(spec, vocab, tmp)
        marker = {
            "builder_version": BUILDER_VERSION,
            "cache_key": key,
            "llama_cpp_python_version": LLAMA_CPP_PYTHON_VERSION,
            "num_tokens": len(vocab),
            "spec": dataclasses.asdict(spec),
            "vocab_sha256": vocab.sha256,
        }
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        # mkdtemp makes the folder private (0700) and safetensors writes 0600: open them up
        # like any other cache entry.
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        if final.exists() and (force or not (final / _MARKER).is_file()):
            # Replacing (or a folder not made here): move it aside first (atomic), then
            # delete it at leisure.
            old = root / f".{final.name}.old-{uuid.uuid4().hex}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:
            # A concurrent build renamed its (identical) folder into place first.
            if not (final / _MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# --------------------------------------------------------------------------------------
# The GGUF (llama.cpp) form
# --------------------------------------------------------------------------------------

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
        types.append(_TT_UNUSED)
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

    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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

    gguf_path = vocab_gguf_path(spec.vocab)
    vocab = _read_gguf_vocab_cached(str(gguf_path), _sha256(gguf_path))
    config = make_config(spec, vocab)
    weights = load_file(str(folder / "model.safetensors"))
    drawn = make_weights(spec, config, num_tokens=len(vocab))
    if weights.keys() != drawn.keys() or not all(torch.equal(weights[k], drawn[k]) for k in drawn):
        raise RuntimeError(
            f"{folder / 'model.safetensors'} does not hold make_weights({spec}); "
            "rebuild it with force=True"
        )
    del drawn

    _remove_stale_temporaries(folder, GGUF_FILENAME)
    tmp = folder / f".{GGUF_FILENAME}.{uuid.uuid4().hex}"
    try:
        _write_gguf(tmp, spec, vocab, config, weights)
        tmp.chmod(0o644)
        os.replace(tmp, final)  # a concurrent build writes the same bytes: last one wins
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return final


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Command line: build the tiny model (or find it in the cache) and print its folder
    (and, with ``--gguf``, the path of its GGUF file)."""
    parser = argparse.ArgumentParser(
        prog=prog or "python -m anylogits.testing.tiny_model",
        description="Build a deterministic tiny random-weight Llama with a real vocabulary "
        "as a Hugging Face folder (and optionally a GGUF file in it), cached, and print "
        "the folder's path.",
    )
    parser.add_argument(
        "--vocab", default=DEFAULT_VOCAB, choices=SUPPORTED_VOCABS, help="llama.cpp vocab"
    )
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument(
        "--pad-vocab-to",
        type=int,
        default=None,
        metavar="N",
        help="make the logits N wide (N >= number of tokens); extra rows are zero",
    )
    parser.add_argument("--cache-dir", default=None, help="folder holding built models")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument(
        "--gguf",
        action="store_true",
        help=f"also write the llama.cpp form ({GGUF_FILENAME}) into the folder and print "
        "its path on a second line",
    )
    args = parser.parse_args(argv)
    spec = TinyModelSpec(vocab=args.vocab, seed=args.seed, pad_vocab_to=args.pad_vocab_to)
    try:
        path = build_tiny_model(spec, cache_dir=args.cache_dir, force=args.force)
        gguf_path = build_tiny_gguf(spec, cache_dir=args.cache_dir) if args.gguf else None
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(path)
    if gguf_path is not None:
        print(gguf_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
