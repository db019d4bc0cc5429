"""Level 4 on transformers: real generate() on the tiny model, what only transformers
has (every catalogue processor against a step-by-step loop is in ``test_generation``).

Three kinds of check (one job through every engine's own parameters is in
``test_generation``):
- greedy tokens under each processor equal those under the matching transformers-native
  processor where only transformers has it, and the native one must change the output
  first;
- constraints hold (no repeated n-grams, min new tokens on a padded vocabulary);
- a stateful probe equals its stateless recompute-from-prefix twin in every decoding
  mode (beam search reorders rows; assisted generation rejects draft tokens).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from anylogits import (  # noqa: E402
    MinNewTokens,
    NoRepeatNGram,
    RepetitionPenalty,
    SuppressTokens,
    TopK,
    for_transformers,
)
from anylogits.engines.generation import NEW_TOKENS  # noqa: E402
from test_support.generation_cases import COUNTING, EOS  # noqa: E402
from test_support.probes import (  # noqa: E402
    GeneratedHashBias,
    GeneratedHashBiasRecompute,
)

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("transformers")]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def assistant(tiny_model_dir: Path) -> Any:
    # Same weights as the target: every draft token is accepted until the probe's boost
    # (applied to the target only through its own processors) makes them disagree.
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def generate(model: Any, tokenizer: Any, prompts: str | list[str], **kwargs: Any) -> torch.Tensor:
    """New token ids only; neutral sampling settings so only the processors act."""
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    kwargs.setdefault("do_sample", False)
    if kwargs["do_sample"]:
        torch.manual_seed(kwargs.pop("seed", 0))
    kwargs.setdefault("max_new_tokens", NEW_TOKENS)
    output = model.generate(
        **inputs,
        temperature=1.0,
        top_k=None,
        top_p=1.0,
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )
    return output[:, inputs["input_ids"].shape[1] :]


def hooked(*processors: Any, tokenizer: Any = None) -> LogitsProcessorList:
    return LogitsProcessorList([for_transformers(*processors, tokenizer=tokenizer)])


def assert_same_and_effective(
    ours: torch.Tensor, native: torch.Tensor, plain: torch.Tensor
) -> None:
    assert not torch.equal(native, plain), "the native processor did not change the output"
    assert torch.equal(ours, native), f"\nours   {ours.tolist()}\nnative {native.tolist()}"


# -- the cases of every engine ----------------------------------------------------------


def test_the_cases_name_the_tiny_models_eos(tokenizer: Any) -> None:
    assert tokenizer.eos_token_id == EOS


# -- greedy and sampled tokens equal the native processors' -------------------------------


@pytest.mark.support("generation", processor="no_repeat_ngram", backend="transformers")
def test_no_repeat_ngram_matches_native_and_holds(model: Any, tokenizer: Any) -> None:
    prompt = "the cat the cat the cat the cat"
    plain = generate(model, tokenizer, prompt, max_new_tokens=32)
    native = generate(
        model,
        tokenizer,
        prompt,
        max_new_tokens=32,
        logits_processor=LogitsProcessorList([NoRepeatNGramLogitsProcessor(2)]),
    )
    ours = generate(
        model, tokenizer, prompt, max_new_tokens=32, logits_processor=hooked(NoRepeatNGram(2))
    )
    assert_same_and_effective(ours, native, plain)
    full = tokenizer(prompt, return_tensors="pt")["input_ids"][0].tolist() + ours[0].tolist()
    bigrams = list(itertools.pairwise(full))
    new_bigrams = bigrams[-ours.shape[1] :]
    assert all(bigrams.count(b) == 1 for b in new_bigrams), "a generated bigram repeats"


def test_processors_compose_in_one_hook(model: Any, tokenizer: Any) -> None:
    natives = [
        RepetitionPenaltyLogitsProcessor(1.3),
        NoRepeatNGramLogitsProcessor(3),
        SuppressTokensLogitsProcessor([16]),
    ]
    plain = generate(model, tokenizer, [COUNTING, "the cat the cat"])
    native = generate(
        model,
        tokenizer,
        [COUNTING, "the cat the cat"],
        logits_processor=LogitsProcessorList(natives),
    )
    ours = generate(
        model,
        tokenizer,
        [COUNTING, "the cat the cat"],
        logits_processor=hooked(RepetitionPenalty(1.3), NoRepeatNGram(3), SuppressTokens([16])),
    )
    assert_same_and_effective(ours, native, plain)


@pytest.mark.parametrize("do_sample", [False, True])
def test_output_logits_stay_raw_and_output_scores_are_each_steps_own(
    model: Any, tokenizer: Any, do_sample: bool
) -> None:
    # generate keeps the tensor it passes (output_logits) and the one the hook returns
    # (output_scores), step after step: the hook must edit neither in place nor hand the
    # same memory out twice.
    from anylogits import Pipeline

    processors = (RepetitionPenalty(1.3), TopK(5))
    output = model.generate(
        **tokenizer([COUNTING, "the cat the cat"], return_tensors="pt", padding=True),
        max_new_tokens=6,
        do_sample=do_sample,
        temperature=1.0,
        top_k=None,
        top_p=1.0,
        pad_token_id=tokenizer.pad_token_id,
        logits_processor=hooked(*processors),
        return_dict_in_generate=True,
        output_logits=True,
        output_scores=True,
    )
    assert len(output.logits) == len(output.scores) == 6
    assert len({scores.data_ptr() for scores in output.scores}) == 6
    pipeline = Pipeline(processors)
    width = output.sequences.shape[1] - 6
    for step, (raw, scores) in enumerate(zip(output.logits, output.scores, strict=True)):
        assert torch.isfinite(raw).all(), f"step {step}: the raw logits were edited"
        history = output.sequences[:, : width + step]
        assert torch.equal(scores, pipeline(raw.clone(), history)), f"step {step}"


def test_in_place_gives_the_same_tokens_and_edits_the_logits_generate_passes(
    model: Any, tokenizer: Any
) -> None:
    # in_place=True: the hook masks the scores transformers passes (documented: the
    # output_logits of generate then come back processed) and the tokens stay the same.
    prompts = [COUNTING, "the cat the cat"]
    processors = (RepetitionPenalty(1.3), NoRepeatNGram(3), SuppressTokens([16]))
    runs = {}
    for in_place in (False, True):
        hook = for_transformers(*processors, in_place=in_place)
        runs[in_place] = model.generate(
            **tokenizer(prompts, return_tensors="pt", padding=True),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            temperature=1.0,
            top_k=None,
            top_p=1.0,
            pad_token_id=tokenizer.pad_token_id,
            logits_processor=LogitsProcessorList([hook]),
            return_dict_in_generate=True,
            output_logits=True,
            output_scores=True,
        )
    plain = generate(model, tokenizer, prompts)
    assert not torch.equal(runs[False].sequences[:, -NEW_TOKENS:], plain), (
        "the processors changed nothing"
    )
    assert torch.equal(runs[True].sequences, runs[False].sequences)
    for raw, scores in zip(runs[True].logits, runs[True].scores, strict=True):
        assert raw.data_ptr() == scores.data_ptr()
    for raw, scores in zip(runs[False].logits, runs[False].scores, strict=True):
        assert raw.data_ptr() != scores.data_ptr()
    with pytest.raises(ValueError, match="in_place must be a bool, got 'yes'"):
        for_transformers(*processors, in_place="yes")  # type: ignore[arg-type]


def min_new_tokens_runs(model: Any, tokenizer: Any, minimum: int) -> tuple[torch.Tensor, ...]:
    """Unprocessed, native and our tokens when a +30 EOS bias makes the model stop at once."""
    eos = tokenizer.eos_token_id
    push_eos = {"sequence_bias": {(eos,): 30.0}}
    hook = hooked(MinNewTokens(minimum), tokenizer=tokenizer)
    return (
        generate(model, tokenizer, COUNTING, **push_eos),
        generate(model, tokenizer, COUNTING, min_new_tokens=minimum, **push_eos),
        generate(model, tokenizer, COUNTING, **push_eos, logits_processor=hook),
    )


# -- a stateful probe equals its stateless twin in every decoding mode --------------------

# The tiny model's logits reach ~14: a boost of 12 wins often but not always, so outputs
# mix the model's choices and the probe's.
PROBE_BIAS = 12.0

MODES: dict[str, dict[str, Any]] = {
    "greedy": {},
    "sampling": {"do_sample": True, "seed": 3},
    "sampling_num_return_sequences": {"do_sample": True, "seed": 4, "num_return_sequences": 3},
    "beam_search": {"num_beams": 4, "num_return_sequences": 2},
    "beam_sampling": {"num_beams": 3, "do_sample": True, "seed": 5},
    "prompt_lookup": {"prompt_lookup_num_tokens": 3},
    "assistant_model": {"assistant_model": "fixture"},
    "batched_left_padded": {"prompts": ["1 2 3", "the cat sat on the mat and the cat"]},
    "batched_beams": {
        "prompts": ["1 2 3", "the cat sat on the mat and the cat"],
        "num_beams": 3,
    },
}


@pytest.mark.parametrize("mode", list(MODES))
def test_stateful_probe_equals_stateless_twin(
    model: Any, tokenizer: Any, assistant: Any, mode: str
) -> None:
    options = dict(MODES[mode])
    prompts = options.pop("prompts", "1 2 3 1 2 3 1 2 3 1 2 3")
    if options.get("assistant_model") == "fixture":
        options["assistant_model"] = assistant
    seed = options.pop("seed", 0)
    if options.get("do_sample"):
        options["seed"] = seed
    plain = generate(model, tokenizer, prompts, **dict(options))
    prompt_width = tokenizer(prompts, return_tensors="pt", padding=True)["input_ids"].shape[1]
    stateless = generate(
        model,
        tokenizer,
        prompts,
        **dict(options),
        logits_processor=hooked(GeneratedHashBiasRecompute(prompt_width, PROBE_BIAS)),
    )
    probe = GeneratedHashBias(PROBE_BIAS)
    stateful = generate(model, tokenizer, prompts, **dict(options), logits_processor=hooked(probe))
    assert not torch.equal(stateless, plain), "the probe did not change the output"
    assert torch.equal(stateful, stateless), (
        f"\nstateful  {stateful.tolist()}\nstateless {stateless.tolist()}"
    )
    assert probe.advance_calls > 0  # the state really was advanced, not recomputed


def test_text_generation_pipeline_accepts_the_hook(model: Any, tokenizer: Any) -> None:
    generator = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer)
    plain = generator(COUNTING, max_new_tokens=8, do_sample=False, return_tensors=True)
    banned = plain[0]["generated_token_ids"][-8:][:3]
    hooked_out = generator(
        COUNTING,
        max_new_tokens=8,
        do_sample=False,
        return_tensors=True,
        logits_processor=hooked(SuppressTokens(banned)),
    )
    new_ids = hooked_out[0]["generated_token_ids"][-8:]
    assert not set(new_ids) & set(banned)
    assert new_ids != plain[0]["generated_token_ids"][-8:]


def test_padded_vocabulary_model_works_with_vocabulary_bound_processors(tokenizer: Any) -> None:
    from anylogits.testing.tiny_model import TinyModelSpec, build_tiny_model

    folder = build_tiny_model(TinyModelSpec(pad_vocab_to=128320))
    padded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert padded.config.vocab_size == 128320 > len(tokenizer)
    plain, native, ours = min_new_tokens_runs(padded, tokenizer, 4)
    assert_same_and_effective(ours, native, plain)
    assert ours[0, 4] == tokenizer.eos_token_id
