"""The cases every engine must give transformers' greedy tokens for, on the tiny model."""

from __future__ import annotations

from collections.abc import Callable

from anylogits import (
    DRY,
    XTC,
    BadWords,
    Choice,
    CiteFromPrompt,
    EpsilonCutoff,
    EtaCutoff,
    ExponentialDecayLength,
    ForceLastPhrase,
    ForceSequence,
    FrequencyPenalty,
    GenLength,
    Grammar,
    JSONSchema,
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    MinP,
    MultipleChoice,
    NoRepeatNGram,
    PresencePenalty,
    Regex,
    RepetitionPenalty,
    SequenceBias,
    StopStrings,
    SuppressTokens,
    Temperature,
    TopH,
    TopK,
    TopNSigma,
    TopP,
    TriggerPhrase,
    TypicalP,
    Watermark,
)
from test_support.catalogue import SMALL_CHOICES, SMALL_GBNF, SMALL_REGEX, SMALL_SCHEMA
from test_support.probes import GeneratedHashBias, ReverseRanks

COUNTING = "1 2 3 4 5 6 7 8 9 10 11 12"  # a prompt where penalties change greedy output


# The tiny model's end-of-text id (llama-bpe ``<|end_of_text|>``). Cases name it
# explicitly: llama.cpp's vocabulary counts more end-of-generation ids than the HF
# tokenizer does, and a processor defaulting to "every EOS id" would differ there.
EOS = 128001
TINY_VOCAB_SIZE = 128256  # the tiny model's logits width (llama-bpe)

# Helpers around a processor that greedy decoding cannot show by itself: TopK(8) keeps a
# few tokens whose logits are well apart (engines' logits differ in the 5th decimal), and
# ReverseRanks makes greedy take the least likely token left, i.e. shows where a
# truncation cut.
_FEW = 8


def _truncation(processor: LogitsProcessor) -> list[LogitsProcessor]:
    return [TopK(_FEW), processor, ReverseRanks()]


# Processors every engine must apply with the same greedy tokens as transformers, built
# from the engine's unprocessed greedy output (so that each one changes it).
CROSS_ENGINE_CASES: dict[str, Callable[[list[int]], list[LogitsProcessor]]] = {
    "repetition_penalty": lambda plain: [RepetitionPenalty(1.3)],
    "no_repeat_ngram": lambda plain: [NoRepeatNGram(2)],
    "suppress_tokens": lambda plain: [SuppressTokens(sorted(set(plain[:4])))],
    "logit_bias": lambda plain: [LogitBias({plain[-1]: 4.0})],
    "stateful_probe": lambda plain: [GeneratedHashBias(12.0)],
    # Structured: the same grammar over each engine's own vocabulary (llama.cpp reads its
    # pieces from the GGUF file) must pick the same tokens.
    "json_schema": lambda plain: [JSONSchema(SMALL_SCHEMA)],
    "regex": lambda plain: [Regex(SMALL_REGEX)],
    "choice": lambda plain: [Choice(SMALL_CHOICES)],
    "grammar": lambda plain: [Grammar(SMALL_GBNF, syntax="gbnf")],
    # Sampling shape, made visible by the helpers above.
    "temperature": lambda plain: [TopK(_FEW), Temperature(0.25), MinP(0.3), ReverseRanks()],
    "top_k": lambda plain: [TopK(3), ReverseRanks()],
    "top_p": lambda plain: _truncation(TopP(0.5)),
    "min_p": lambda plain: _truncation(MinP(0.6)),
    "typical_p": lambda plain: _truncation(TypicalP(0.5)),
    "epsilon_cutoff": lambda plain: _truncation(EpsilonCutoff(0.12)),
    "eta_cutoff": lambda plain: _truncation(EtaCutoff(0.5)),
    "top_n_sigma": lambda plain: _truncation(TopNSigma(0.5)),
    "top_h": lambda plain: _truncation(TopH(0.7)),
    "xtc": lambda plain: [XTC(threshold=0.02, probability=0.6, seed=3)],
    # Penalties: the greedy output repeats itself (tokens and a 3-token phrase).
    "presence_penalty": lambda plain: [PresencePenalty(1.5)],
    "frequency_penalty": lambda plain: [FrequencyPenalty(1.0)],
    "dry": lambda plain: [DRY(multiplier=2.0, allowed_length=1)],
    # Control.
    "min_new_tokens": lambda plain: [LogitBias({EOS: 30.0}), MinNewTokens(5, eos_token_id=EOS)],
    "bad_words": lambda plain: [BadWords([[plain[4], plain[5]]])],
    "sequence_bias": lambda plain: [SequenceBias([[[plain[4], plain[5]], -20.0]])],
    "exponential_decay_length": lambda plain: [
        ExponentialDecayLength(start_index=3, decay_factor=3.0, eos_token_id=EOS)
    ],
    "stop_strings": lambda plain: [StopStrings([" scrolling"], eos_token_id=EOS)],
    "watermark": lambda plain: [Watermark(bias=4.0, seeding_scheme="selfhash")],
    # Phrases.
    "force_sequence": lambda plain: [ForceSequence([plain[3], plain[2]])],
    "trigger_phrase": lambda plain: [
        TriggerPhrase([plain[2]], [plain[5], plain[6]], trigger_count=2)
    ],
    "force_last_phrase": lambda plain: [
        LogitBias({EOS: 30.0}),
        ForceLastPhrase([plain[0], plain[1]], eos_token_id=EOS),
    ],
    "gen_length": lambda plain: [GenLength(10.0, p=1, boost_token=EOS)],
    "cite_from_prompt": lambda plain: [CiteFromPrompt(10.0, boost_eos=False)],
    "multiple_choice": lambda plain: [MultipleChoice(sorted(set(plain))[:3])],
}

# What a case runs without its processor under test, where it has helpers: the test
# that the processor changed the output compares with this (default: no processor).
WITHOUT_THE_PROCESSOR: dict[str, Callable[[list[int]], list[LogitsProcessor]]] = {
    "temperature": lambda plain: [TopK(_FEW), MinP(0.3), ReverseRanks()],
    "top_k": lambda plain: [ReverseRanks()],
    **{
        name: lambda plain: [TopK(_FEW), ReverseRanks()]
        for name in (
            "top_p",
            "min_p",
            "typical_p",
            "epsilon_cutoff",
            "eta_cutoff",
            "top_n_sigma",
            "top_h",
        )
    },
    "min_new_tokens": lambda plain: [LogitBias({EOS: 30.0})],
    "force_last_phrase": lambda plain: [LogitBias({EOS: 30.0})],
}


def check_watermark_detected(case: str, tokens: list[int], plain: list[int]) -> None:
    """Under the watermark case, the detector finds the watermark in what the engine
    generated (and not in its unprocessed output): one detector for every backend."""
    if case != "watermark":
        return
    from anylogits import detect_watermark

    (watermark,) = CROSS_ENGINE_CASES[case](plain)
    settings = {
        "vocab_size": TINY_VOCAB_SIZE,
        "seeding_scheme": watermark.seeding_scheme,
        "context_width": watermark.context_width,
        "greenlist_ratio": watermark.greenlist_ratio,
        "hashing_key": watermark.hashing_key,
    }
    assert detect_watermark(tokens, **settings).prediction, "the watermark was not detected"
    assert not detect_watermark(plain, **settings).prediction
