"""Structured generation on transformers with the tiny model (real llama-bpe vocabulary),
beyond what every engine is checked for in ``test_generation``: beam search and assisted
(prompt-lookup) decoding satisfy the constraint; outputs cut by ``max_new_tokens`` are
valid prefixes; real-world MaskBench schemas: coverage, valid instances accepted token
by token and invalid ones rejected."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from anylogits import JSONSchema, for_transformers  # noqa: E402
from anylogits.core.vocab import hf_vocabulary  # noqa: E402
from anylogits.engines.generation import TransformersEngine  # noqa: E402
from anylogits.processors.structured.engine import ENGINE  # noqa: E402
from conformance_tests.structured_cases import PROMPTS, is_valid_prefix  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("transformers")]

MASKBENCH = Path(__file__).parent / "data" / "maskbench-sample"


@pytest.fixture(scope="module")
def engine(reference: TransformersEngine) -> TransformersEngine:
    return reference


def generate(
    engine: TransformersEngine, processor: Any, batch: int, n: int = 48, **options: Any
) -> list[list[int]]:
    """New token ids of ``batch`` prompts, left-padded into one batch, each cut after EOS."""
    return engine.generate(
        [PROMPTS[i % len(PROMPTS)] for i in range(batch)], processor, n, **options
    )


def finished_text(tokenizer: Any, ids: list[int]) -> str:
    assert ids and ids[-1] == tokenizer.eos_token_id, f"did not finish: {ids}"
    return tokenizer.decode(ids[:-1])


def test_a_hook_keeps_its_tokenizer_alive(engine: TransformersEngine, tiny_model_dir: Any) -> None:
    # The cached vocabulary holds its tokenizer weakly; llguidance tokenizes forced text
    # (JSON keys) with it mid-generation, so the hook must keep it.
    model, tokenizer = engine.model, engine.tokenizer
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "boolean"}},
        "required": ["answer"],
    }
    hook = for_transformers(
        JSONSchema(schema), tokenizer=transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    )
    gc.collect()
    inputs = tokenizer(PROMPTS[:1], return_tensors="pt")
    output = model.generate(
        **inputs,
        max_new_tokens=12,
        do_sample=False,
        logits_processor=transformers.LogitsProcessorList([hook]),
        pad_token_id=tokenizer.eos_token_id,
    )
    ids = output[0, inputs.input_ids.shape[1] :].tolist()
    jsonschema.validate(json.loads(finished_text(tokenizer, ids)), schema)


def test_unconstrained_output_would_not_validate(engine: TransformersEngine) -> None:
    # Without the processor the tiny model's text is no JSON: the validity tests can fail.
    model, tokenizer = engine.model, engine.tokenizer
    (ids,) = generate(engine, JSONSchema({"type": "boolean"}), 1, n=8)
    assert finished_text(tokenizer, ids) in ("true", "false")
    inputs = tokenizer(PROMPTS[:1], return_tensors="pt")
    plain = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(plain[0, inputs.input_ids.shape[1] :])
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


@pytest.mark.parametrize(
    "options",
    [
        {"num_beams": 4, "num_return_sequences": 4, "do_sample": False},
        {"prompt_lookup_num_tokens": 3, "do_sample": False},
    ],
    ids=["beam_search", "assisted_prompt_lookup"],
)
def test_beam_search_and_assisted_decoding_satisfy_the_schema(
    engine: TransformersEngine, options: dict
) -> None:
    tokenizer = engine.tokenizer
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 99},
            "tags": {"enum": ["a", "b"]},
        },
        "required": ["id", "tags"],
        "additionalProperties": False,
    }
    processor = JSONSchema(schema)
    outputs = generate(engine, processor, 1, n=64, **options)
    assert len(outputs) == options.get("num_return_sequences", 1)
    finished = [ids for ids in outputs if ids[-1] == tokenizer.eos_token_id]
    assert finished
    for ids in finished:
        jsonschema.validate(json.loads(finished_text(tokenizer, ids)), schema)
    for ids in outputs:  # beams cut by max_new_tokens are still valid prefixes
        if ids not in finished:
            assert is_valid_prefix(processor.grammar, hf_vocabulary(tokenizer), ids)


def test_output_cut_by_max_new_tokens_is_a_valid_prefix(engine: TransformersEngine) -> None:
    tokenizer = engine.tokenizer
    processor = JSONSchema({"type": "array", "items": {"type": "string", "maxLength": 40}})
    vocab = hf_vocabulary(tokenizer)
    for ids in generate(engine, processor, 3, n=6, do_sample=True, top_k=0):
        assert tokenizer.eos_token_id not in ids  # cut, not finished
        assert is_valid_prefix(processor.grammar, vocab, ids)


def _maskbench() -> list[tuple[str, dict]]:
    return [(path.stem, json.loads(path.read_text())) for path in sorted(MASKBENCH.glob("*.json"))]


def test_maskbench_coverage_and_token_level_acceptance(engine: TransformersEngine) -> None:
    tokenizer = engine.tokenizer
    vocab = hf_vocabulary(tokenizer)
    cases = _maskbench()
    assert len(cases) == 180
    compiled, valid, invalid = 0, 0, 0
    for name, case in cases:
        try:
            processor = JSONSchema(case["schema"])
            processor.bind(vocab)
        except ValueError:
            continue
        compiled += 1
        for test in case.get("tests", []):
            # The processor's layout is json.dumps' (", " and ": ").
            ids = tokenizer.encode(json.dumps(test["data"]), add_special_tokens=False)
            matcher = ENGINE.start(processor.grammar, vocab)
            accepted = matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()
            assert accepted == test["valid"], (name, test.get("description"))
            valid += test["valid"]
            invalid += not test["valid"]
    # Strict compilation: schemas using keywords llguidance cannot enforce (not, oneOf
    # without coercion, contains, uniqueItems, dependencies, unknown formats) are refused
    # rather than half-enforced. Measured: 131 of 180.
    assert compiled >= 125, compiled
    assert valid >= 150 and invalid >= 240, (valid, invalid)


def test_maskbench_generated_outputs_validate(engine: TransformersEngine) -> None:
    tokenizer = engine.tokenizer
    validated = 0
    vocab = hf_vocabulary(tokenizer)
    for name, case in _maskbench()[::6]:
        try:
            processor = JSONSchema(case["schema"])
            processor.bind(vocab)  # built in Python: compiled (or refused) when bound
        except ValueError:
            continue
        (ids,) = generate(engine, processor, 1, n=160, do_sample=False)
        if ids and ids[-1] == tokenizer.eos_token_id:
            jsonschema.validate(json.loads(finished_text(tokenizer, ids)), case["schema"])
            validated += 1
        else:  # ran out of tokens: still a valid prefix
            assert is_valid_prefix(processor.grammar, hf_vocabulary(tokenizer), ids), name
    assert validated >= 10, validated
