"""The demo's cases: anylogits processors, and the transformers ``generate`` arguments
that do the same job (the reference, and what each engine's own parameters are
translated from, see :mod:`anylogits.engines.native`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from anylogits import (
    JSONSchema,
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    NoRepeatNGram,
    Regex,
    RepetitionPenalty,
    StopStrings,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
    Watermark,
    detect_watermark,
)
from anylogits.engines.native import CHAIN, Job, chain_processors_in_generate_order
from anylogits.installation import pip_install
from anylogits.processors.structured.warm import llguidance_installed

# The sampling parameters every engine has natively, in transformers' order of application.
SAMPLING: Job = {"temperature": 0.8, "top_k": 50, "top_p": 0.9}

SEED = 0  # of every sampled run

Tokens = list[int]


@dataclass(frozen=True)
class Outcome:
    """What a case's text means (the parsed JSON, the regex match, the watermark's
    z-scores), shown under its reference; ``ok``: what the case promises holds."""

    label: str
    text: str
    ok: bool


@dataclass(frozen=True)
class Case:
    """One processor (or chain) of the table."""

    label: str
    # Fresh instances for every run: processors hold per-run bound state.
    processors: Callable[[], list[LogitsProcessor]]
    # transformers' generate arguments for the same job. None: transformers has none,
    # so the reference is transformers through anylogits, and no engine is timed natively.
    job: Job | None = field(default_factory=dict)
    sample: bool = False
    # A chat message of its own (a job shows on some questions only); None: the demo's.
    prompt: str | None = None
    # At least this many new tokens, whatever --max-new-tokens says: a stop string must be
    # reached, a JSON object close to parse, and a z-score needs tokens to count.
    new_tokens: int = 0
    # How the reference line names transformers' way; None: generate(**job), or without a
    # job, that transformers has none and the reference is anylogits on transformers.
    call: str | None = None
    # What the engines lack when job is None, in the table's "no native (...)".
    no_native: str = ""
    # The part of anylogits' tokens compared with the reference, given the engine's
    # EOS ids (None: all of them).
    compared: Callable[[Tokens, Collection[int]], Tokens] | None = None
    # (tokens, the same prompt's unprocessed tokens) -> what the text means.
    outcome: Callable[[Tokens, Tokens], Outcome] | None = None

    @property
    def unprocessed(self) -> bool:
        return self.job == {}


UNPROCESSED = Case("unprocessed greedy", list)

# Each message asks for what its case shows, so that the effect reads in plain text.
STOP_PROMPT = "Name the planets of the solar system in order."
STOP = "Mars"
JSON_PROMPT = "Extract the person as JSON: Maria is a 34 year old engineer from Lisbon."
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer"},
        "city": {"type": "string"},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
# Unconstrained, the model answers '... is 2022-0'; the date it converts is in the prompt.
DATE_PROMPT = "What date was July 20, 1969 in ISO format?"
# [0-9], not \d: llguidance's \d is Unicode's, and random weights then pick digits of
# other scripts.
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
WATERMARK_PROMPT = "Write a short poem about the sea."
# WatermarkingConfig's defaults but the bias (2.0): 3.0 is detected within 32 greedy tokens.
WATERMARK_BIAS = 3.0
WATERMARK_TOKENS = 32
STOP_TOKENS = 24  # 'Mars' is the 18th
DATE_TOKENS = 16  # ten characters in eleven tokens, the end of text included
Z_THRESHOLD = 3.0  # detect_watermark's default, and transformers' detector's
JSON_TOKENS = 48


def demo_cases(
    plain: Tokens,
    eos: int,
    *,
    tokenizer: Any,
    vocab_size: int,
    trained: bool = True,
    device: Any = "cpu",
) -> list[Case]:
    """The processed cases, from the unprocessed greedy tokens ``plain`` of the demo's
    prompt (which they must change) and the end-of-text id ``eos``; ``tokenizer`` is
    transformers', ``vocab_size`` the logits' width (the watermark's), ``trained``
    False on the tiny random-weight model (see :func:`_stop_case`), ``device`` where
    transformers runs (see :func:`_watermark_case`)."""

    def text(tokens: Tokens) -> str:
        return tokenizer.decode(tokens, skip_special_tokens=True)

    banned = sorted(set(plain[:4]))
    # The last token it says, favoured: said earlier. Not the end of text, which a short
    # answer (a real model's) ends with, where a bias on it would change nothing.
    favoured = next((token for token in reversed(plain) if token != eos), plain[-1])
    # The values show on the reference's line, as transformers' generate arguments.
    chain = chain_processors_in_generate_order
    names = " ".join(type(processor).__name__ for processor in chain())
    return [
        Case(
            "RepetitionPenalty(1.3)", lambda: [RepetitionPenalty(1.3)], {"repetition_penalty": 1.3}
        ),
        Case("NoRepeatNGram(2)", lambda: [NoRepeatNGram(2)], {"no_repeat_ngram_size": 2}),
        Case(
            f"SuppressTokens({banned})",
            lambda: [SuppressTokens(banned)],
            {"suppress_tokens": banned},
        ),
        Case(
            f"LogitBias({{{favoured}: 4.0}})",
            lambda: [LogitBias({favoured: 4.0})],
            {"sequence_bias": {(favoured,): 4.0}},
        ),
        Case(
            "LogitBias({eos: 30.0}) MinNewTokens(5)",
            lambda: [LogitBias({eos: 30.0}), MinNewTokens(5, eos_token_id=eos)],
            {"sequence_bias": {(eos,): 30.0}, "min_new_tokens": 5},
        ),
        Case(f"sampled, seed {SEED}: {names}", chain, dict(CHAIN), sample=True),
        # What every engine samples with natively, transformers' continuous batching per
        # request included.
        Case(
            f"sampled, seed {SEED}: Temperature TopK TopP",
            lambda: [
                Temperature(SAMPLING["temperature"]),
                TopK(SAMPLING["top_k"]),
                TopP(SAMPLING["top_p"]),
            ],
            dict(SAMPLING),
            sample=True,
        ),
        _stop_case(plain, text, tokenizer, trained),
        *_structured_cases(text, trained),
        _watermark_case(vocab_size, str(device)),
    ]


#: What adds the JSON schema and regex cases where llguidance is missing.
STRUCTURED_INSTALL = pip_install("structured")


def _structured_cases(text: Callable[[Tokens], str], trained: bool) -> list[Case]:
    """The JSON schema and regex cases, where llguidance is installed."""
    if not structured_available():
        return []
    # Random weights never close a JSON string: the object would not parse.
    return [_json_case(text), _regex_case(text)] if trained else [_regex_case(text)]


def structured_available() -> bool:
    """Whether the JSON schema and regex cases can run (their engine, llguidance, is
    installed: the ``structured`` extra, which the README's first command does not add)."""
    return llguidance_installed()


def _stop_case(plain: Tokens, text: Callable[[Tokens], str], tokenizer: Any, trained: bool) -> Case:
    """Stop at a planet the model names; random weights name none, so on them the stop
    string is a word the demo's own prompt makes them say."""
    stop = STOP if trained else _said_word(plain, text)
    prompt = STOP_PROMPT if trained else None

    def compared(tokens: Tokens, eos_ids: Collection[int]) -> Tokens:
        # transformers' stopping criterion ends on the token that completes the stop;
        # StopStrings forces EOS at the next step. Any other continuation is compared
        # whole, so that a stop that did not stop differs.
        cut = next(
            (tokens[: end + 1] for end in range(len(tokens)) if stop in text(tokens[: end + 1])),
            tokens,
        )
        rest = tokens[len(cut) :]
        return cut if len(rest) <= 1 and set(rest) <= set(eos_ids) else tokens

    return Case(
        f"StopStrings([{stop!r}])",
        lambda: [StopStrings([stop])],
        {"stop_strings": [stop], "tokenizer": tokenizer},  # generate() matches text with it
        prompt=prompt,
        new_tokens=STOP_TOKENS,
        call=f"generate(stop_strings=[{stop!r}], tokenizer=tokenizer)",
        compared=compared,
    )


def _said_word(plain: Tokens, text: Callable[[Tokens], str]) -> str:
    """A word of ``plain`` after its first two tokens: the first token that decodes to
    ASCII letters alone."""
    for token in plain[2:]:
        word = text([token]).strip()
        if len(word) >= 3 and word.isascii() and word.isalpha():
            return word
    return text(plain[2:4]).strip() or text(plain)


def _json_case(text: Callable[[Tokens], str]) -> Case:
    def parsed(tokens: Tokens, without: Tokens) -> Outcome:
        try:
            return Outcome("parsed", repr(json.loads(text(tokens))), ok=True)
        except json.JSONDecodeError as error:
            return Outcome("parsed", f"NOT JSON ({error})", ok=False)

    return Case(
        "JSONSchema({name: string minLength 1, age: integer, city: string})",
        lambda: [JSONSchema(PERSON)],
        None,
        prompt=JSON_PROMPT,
        new_tokens=JSON_TOKENS,
        no_native="JSON schema",
        outcome=parsed,
    )


def _regex_case(text: Callable[[Tokens], str]) -> Case:
    def match(tokens: Tokens, without: Tokens) -> Outcome:
        said = text(tokens)
        found = re.fullmatch(DATE, said)
        return Outcome("match", repr(found[0]) if found else f"NO MATCH in {said!r}", bool(found))

    return Case(
        f"Regex({DATE!r})",
        lambda: [Regex(DATE)],
        None,
        prompt=DATE_PROMPT,
        new_tokens=DATE_TOKENS,
        no_native="regex",
        outcome=match,
    )


# transformers' WatermarkLogitsProcessor draws greenlists with a generator on the
# model's device: on CUDA (Philox) they differ from its own on the CPU (Mersenne
# Twister), and its detector must run on the device that generated. anylogits draws them
# on the CPU wherever the logits are, so its watermark is detected the same everywhere.
WATERMARK_ON_ACCELERATOR = (
    "watermarking_config off the CPU: its greenlists follow the device's generator"
)


def _watermark_case(vocab_size: int, device: str = "cpu") -> Case:
    def detected(tokens: Tokens, without: Tokens) -> Outcome:
        marked, unmarked = (
            detect_watermark(ids, vocab_size=vocab_size, z_threshold=Z_THRESHOLD)
            for ids in (tokens, without)
        )
        verdicts = ", ".join(
            f"{what} z = {result.z_score:.2f} ({'' if result.prediction else 'not '}detected)"
            for what, result in (("watermarked", marked), ("unwatermarked", unmarked))
        )
        shown = f"{verdicts}; threshold z > {Z_THRESHOLD}"
        return Outcome("detection", shown, marked.prediction and not unmarked.prediction)

    label = f"Watermark(bias={WATERMARK_BIAS})"
    if not device.startswith("cpu"):
        return Case(
            label,
            lambda: [Watermark(bias=WATERMARK_BIAS)],
            None,
            prompt=WATERMARK_PROMPT,
            new_tokens=WATERMARK_TOKENS,
            no_native=WATERMARK_ON_ACCELERATOR,
            outcome=detected,
        )
    return Case(
        label,
        lambda: [Watermark(bias=WATERMARK_BIAS)],
        # A dict: generate() makes it a WatermarkingConfig (transformers is not imported here).
        {"watermarking_config": {"bias": WATERMARK_BIAS}},
        prompt=WATERMARK_PROMPT,
        new_tokens=WATERMARK_TOKENS,
        call=f"generate(watermarking_config=WatermarkingConfig(bias={WATERMARK_BIAS}))",
        outcome=detected,
    )
