"""The real-schema level (issue 35): ``JSONSchema`` on 888 real-world JSON schemas (862
Kubernetes kinds, 26 SchemaStore schemas: ``test_support.schema_corpus``), with the real
model's 49,152-token vocabulary (SmolLM2-135M-Instruct).

- Parity: in both modes (``lenient`` off and on), anylogits accepts a schema (built in
  Python and bound through ``for_transformers``) exactly when llguidance alone compiles it
  with the same options (``json_options``) and the same parser limits, and computes its
  first mask. A refusal of ours that llguidance would not make (a byte-size cap, a
  schema-shape bound, a guard of ours) fails here, and names the schemas.
- Masks and outputs: for a seeded sample of schemas that compile (small and large, strict
  and lenient-only, three over 32 KB), the real model generates under the hook, greedily,
  prompted with an example instance to copy. At every step the mask our hook applied (its
  finite logits) equals the mask of an independent llguidance matcher (llguidance's own
  tokenizer from the HF tokenizer, not ours) fed the same generated token ids; that mask
  must constrain (not every token allowed). Finished outputs validate with ``jsonschema``
  (lenient-mode outputs under what ``lenient`` approximates: ``oneOf`` as ``anyOf``,
  unimplemented keywords ignored).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

import llguidance  # noqa: E402
import llguidance.hf  # noqa: E402
import llguidance.torch  # noqa: E402
import torch  # noqa: E402

from anylogits import JSONSchema, for_transformers  # noqa: E402
from anylogits.core.limits import llguidance_limits  # noqa: E402
from anylogits.engines.generation import TransformersEngine  # noqa: E402
from anylogits.engines.real_model import chat_ids  # noqa: E402
from anylogits.processors.structured import json_options  # noqa: E402
from anylogits.processors.structured.engine import ENGINE  # noqa: E402
from test_support.schema_corpus import RealSchema, load  # noqa: E402
from test_support.schema_examples import NoExample, example, lenient_validator  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("transformers")]

MODES = (False, True)  # lenient
MIN_CORPUS = 800  # 888 when written: 862 Kubernetes kinds, 26 SchemaStore schemas
MIN_LENIENT = 850  # 882 compile in lenient mode (625 in strict mode) with llguidance 1.9
LARGE = 32 << 10  # bytes of schema JSON
SEED = 35
NEW_TOKENS = 128
# The sample: (lenient, large) per slot. Strict slots draw from schemas that compile in
# strict mode; lenient slots from those that compile in lenient mode only (what it adds).
SLOTS = ((False, False), (False, False), (False, True), (True, False), (True, True), (True, True))


class Verdict(NamedTuple):
    ours: bool
    raw: bool
    ours_error: str | None
    raw_error: str | None


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread for this module: with two on a busy 2-core machine, OpenMP's
    waiting threads made the model's forward 20 times slower (1.5 s a token)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus() -> list[RealSchema]:
    schemas = load()
    assert len(schemas) >= MIN_CORPUS, f"the corpus holds {len(schemas)} schemas only"
    return schemas


@pytest.fixture(scope="module")
def model(real_model_dir: Path) -> TransformersEngine:
    return TransformersEngine.load(real_model_dir)


def _ours(schema: dict, lenient: bool, tokenizer: Any) -> tuple[bool, str | None]:
    """Whether anylogits accepts ``schema``: built in Python, compiled when bound."""
    try:
        for_transformers(JSONSchema(schema, lenient=lenient), tokenizer=tokenizer)
    except ValueError as error:
        return False, str(error)
    return True, None


def _raw(schema: dict, lenient: bool, lltokenizer: Any) -> tuple[bool, str | None]:
    """Whether llguidance alone compiles ``schema`` with our options and limits."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults=json_options(False, lenient)
        )
    except ValueError as error:
        return False, str(error)
    limits = llguidance.LLParserLimits(**llguidance_limits())
    matcher = llguidance.LLMatcher(lltokenizer, grammar, log_level=0, limits=limits)
    if not matcher.is_error():
        matcher.compute_bitmask()
    if matcher.is_error():
        return False, matcher.get_error()
    return True, None


@pytest.fixture(scope="module")
def verdicts(
    corpus: list[RealSchema], model: TransformersEngine
) -> dict[tuple[str, bool], Verdict]:
    """Each schema's verdict per mode, ours and llguidance's."""
    lltokenizer = ENGINE.tokenizer(model.vocabulary)
    found = {}
    for lenient in MODES:
        for schema in corpus:
            ours, ours_error = _ours(schema.schema, lenient, model.tokenizer)
            raw, raw_error = _raw(schema.schema, lenient, lltokenizer)
            found[schema.id, lenient] = Verdict(ours, raw, ours_error, raw_error)
    return found


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:160] if lines else ""


def _listing(found: list[str]) -> str:
    """The first few of ``found``, and how many there are."""
    return f"{len(found)}: {found[:12]}" + (" ..." if len(found) > 12 else "")


def test_anylogits_accepts_exactly_the_schemas_llguidance_compiles(
    corpus: list[RealSchema], verdicts: dict[tuple[str, bool], Verdict]
) -> None:
    counts = []
    for lenient in MODES:
        mode = [(schema, verdicts[schema.id, lenient]) for schema in corpus]
        raw, ours = sum(v.raw for _, v in mode), sum(v.ours for _, v in mode)
        both = sum(v.ours and v.raw for _, v in mode)
        counts.append(
            f"lenient={lenient}: {len(mode)} schemas, llguidance compiles {raw}, "
            f"anylogits accepts {ours}, both {both}"
        )
    summary = "; ".join(counts)
    limited = [
        f"{schema_id} (lenient={lenient}): {_first_line(v.ours_error)}"
        for (schema_id, lenient), v in verdicts.items()
        if v.raw and not v.ours and "anylogits limit" in (v.ours_error or "")
    ]
    assert not limited, (
        f"an anylogits limit refuses schemas llguidance compiles, {_listing(limited)}; {summary}"
    )
    refused = [
        f"{schema_id} (lenient={lenient}): {_first_line(v.ours_error)}"
        for (schema_id, lenient), v in verdicts.items()
        if v.raw and not v.ours
    ]
    accepted = [
        f"{schema_id} (lenient={lenient}): llguidance: {_first_line(v.raw_error)}"
        for (schema_id, lenient), v in verdicts.items()
        if v.ours and not v.raw
    ]
    assert not refused, (
        f"anylogits refuses schemas llguidance compiles, {_listing(refused)}; {summary}"
    )
    assert not accepted, (
        f"anylogits accepts schemas llguidance refuses, {_listing(accepted)}; {summary}"
    )
    lenient_compiled = sum(verdicts[schema.id, True].raw for schema in corpus)
    assert lenient_compiled >= MIN_LENIENT, f"too few schemas compile: {summary}"
    strict_compiled = sum(verdicts[schema.id, False].raw for schema in corpus)
    assert strict_compiled < lenient_compiled, f"lenient mode compiles nothing more: {summary}"
    print(summary)


# The sample's prompts show the model an example instance to copy: a 135M model asked
# for "a minimal instance" of a Kubernetes kind nests free-form objects until it runs
# out of tokens (and shown "[]" or "{}", it fills them). The example is built from the
# schema (required properties, a few optional scalar ones, one item per list), checked
# with jsonschema, and must be accepted token by token by llguidance; a schema without
# such an example is passed over when drawing.
EXAMPLE_CHARS = 240


class Case(NamedTuple):
    schema: RealSchema
    lenient: bool
    example: str


def _accepts(grammar: str, lltokenizer: Any, ids: list[int]) -> bool:
    matcher = llguidance.LLMatcher(lltokenizer, grammar, log_level=0)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


def _draw(
    corpus: list[RealSchema], verdicts: dict[tuple[str, bool], Verdict], model: TransformersEngine
) -> Iterator[Case]:
    rng = random.Random(SEED)
    lltokenizer = ENGINE.tokenizer(model.vocabulary)
    taken: set[str] = set()
    for lenient, large in SLOTS:
        pool = [
            schema
            for schema in corpus
            if verdicts[schema.id, True].raw
            and verdicts[schema.id, False].raw != lenient
            and (schema.size > LARGE) == large
        ]
        rng.shuffle(pool)
        for schema in pool:
            if schema.id in taken:
                continue
            try:
                instance = example(schema.schema, schema.schema)
            except (NoExample, RecursionError):
                continue
            text = json.dumps(instance)
            valid = lenient_validator(schema.schema, lenient).is_valid(instance)
            if len(text) > EXAMPLE_CHARS or not valid:
                continue
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                schema.schema, defaults=json_options(False, lenient)
            )
            ids = model.tokenizer.encode(text, add_special_tokens=False)
            if not _accepts(grammar, lltokenizer, ids):
                continue
            taken.add(schema.id)
            yield Case(schema, lenient, text)
            break
        else:
            raise AssertionError(
                f"no schema of slot lenient={lenient}, large={large} has an example"
            )


@pytest.fixture(scope="module")
def sample(
    corpus: list[RealSchema], verdicts: dict[tuple[str, bool], Verdict], model: TransformersEngine
) -> list[Case]:
    return list(_draw(corpus, verdicts, model))


class _Recorder(transformers.LogitsProcessor):
    """Calls the hook and keeps, per step, the row's token ids and the allowed tokens
    (the finite logits the hook returned)."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook
        self.steps: list[tuple[list[int], torch.Tensor]] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = self.hook(input_ids, scores)
        self.steps.append((input_ids[0].tolist(), torch.isfinite(out[0])))
        return out


def _unpack(bitmask: torch.Tensor, size: int) -> torch.Tensor:
    bits = (bitmask[0, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.reshape(-1)[:size].bool()


def test_masks_equal_llguidance_and_outputs_validate(
    sample: list[Case], model: TransformersEngine
) -> None:
    tokenizer = model.tokenizer
    eos = sorted(model.vocabulary.eos_token_ids)
    # The oracle's tokenizer is llguidance's own, from the HF tokenizer: independent of
    # anylogits' vocabulary.
    oracle_tokenizer = llguidance.hf.from_tokenizer(tokenizer, eos_token=eos)
    size = model.model.config.vocab_size
    assert len(sample) == len(SLOTS)
    assert any(case.lenient and case.schema.size > LARGE for case in sample)
    finished, compared, report = 0, 0, []
    for case in sample:
        schema = case.schema.schema
        hook = for_transformers(JSONSchema(schema, lenient=case.lenient), tokenizer=tokenizer)
        recorder = _Recorder(hook)
        title = schema.get("title") or case.schema.name
        prompt = chat_ids(
            tokenizer,
            f"A minimal JSON instance of the JSON schema {title!r} is: {case.example}\n"
            "Write it again, exactly, on one line, JSON only.",
        )
        ids = model.run(
            prompt, transformers.LogitsProcessorList([recorder]), NEW_TOKENS, do_sample=False
        )
        end = next((i for i, token in enumerate(ids) if token in eos), None)
        if end is not None:  # generate pads after the end
            ids = ids[: end + 1]
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults=json_options(False, case.lenient)
        )
        oracle = llguidance.LLMatcher(oracle_tokenizer, grammar, log_level=0)
        bitmask = llguidance.torch.allocate_token_bitmask(1, oracle_tokenizer.vocab_size)
        assert len(recorder.steps) >= len(ids)
        for step, token in enumerate(ids):
            seen, applied = recorder.steps[step]
            assert seen == prompt + ids[:step], f"{case.schema.id}: step {step} saw other ids"
            llguidance.torch.fill_next_token_bitmask(oracle, bitmask)
            expected = _unpack(bitmask, size)
            assert not oracle.is_error(), oracle.get_error()
            assert not expected.all(), f"{case.schema.id}: step {step}'s mask allows every token"
            if not torch.equal(applied, expected):
                extra = torch.nonzero(applied & ~expected).flatten()[:8].tolist()
                missing = torch.nonzero(expected & ~applied).flatten()[:8].tolist()
                raise AssertionError(
                    f"{case.schema.id} (lenient={case.lenient}) step {step}: our mask differs "
                    f"from llguidance's: allowed only by ours {extra}, only by llguidance "
                    f"{missing}; tokens so far {ids[:step]}"
                )
            compared += 1
            assert oracle.consume_token(token), f"{case.schema.id}: llguidance refuses {token}"
        text = tokenizer.decode(ids[:-1] if ids and ids[-1] in eos else ids)
        if ids and ids[-1] in eos:
            finished += 1
            assert oracle.is_stopped()
            instance = json.loads(text)
            errors = list(lenient_validator(schema, case.lenient).iter_errors(instance))
            assert not errors, f"{case.schema.id}: {text!r} is invalid: {errors[0].message}"
        report.append(f"{case.schema.id} ({case.schema.size} B, lenient={case.lenient}): {text!r}")
    print("\n".join(report))
    assert compared >= 100, f"only {compared} masks compared: {report}"
    assert 2 * finished >= len(sample), f"only {finished} of {len(sample)} finished: {report}"
