"""A Hugging Face fast tokenizer rebuilt from a llama.cpp vocab file, tokenizing as
llama.cpp does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anylogits.testing.tiny_model.gguf_vocab import (
    TT_CONTROL,
    TT_NORMAL,
    TT_UNKNOWN,
    TT_USER_DEFINED,
    GGUFVocab,
    read_gguf_vocab,
)
from anylogits.testing.tiny_model.spec import DEFAULT_VOCAB

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

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
            if v.token_types[i] not in (TT_NORMAL, TT_USER_DEFINED):
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
        AddedToken(tok_str, special=t != TT_USER_DEFINED, normalized=False)
        for tok_str, t in zip(v.tokens, v.token_types, strict=True)
        if t in (TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED)
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
