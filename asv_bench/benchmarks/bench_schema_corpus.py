"""Issues 35 and 50: ``JSONSchema`` on real-world schemas, ours against llguidance called
directly, on the real-schema level's corpus (``test_support.schema_corpus``: 862
Kubernetes kinds, 26 SchemaStore schemas), walking real instances.

The sample: the :data:`LARGEST` largest schemas that compile (in lenient mode, as all
here: ``oneOf`` approximated; ~240 KB of JSON each) and have an example instance, and
:data:`SAMPLE` - :data:`LARGEST` others drawn with :data:`SEED`, the same for both
vocabularies (``vocab``): ``49k``, the real model's (SmolLM2-135M-Instruct, 49,152
tokens), and ``128k``, the tiny model's (the real llama-bpe vocabulary, 128,256 tokens).
Quantities (``measure``), each pooled over the sample and reported as p50 / p95 / p99,
ours, llguidance's, their ratio and the quantiles of the paired ratios (each schema's, or
each step's, ours over llguidance's):

- ``first_mask``: from the schema to the first masked logits. Ours: ``JSONSchema(schema,
  lenient=True)``, ``for_transformers(..., tokenizer=...)`` (which compiles) and the hook's
  first call on a one-token prompt, anylogits' compiled-grammar cache cleared before each
  schema. Direct: ``grammar_from_json_schema`` with the same options (``json_options``),
  ``LLMatcher`` with the same parser limits, ``fill_next_token_bitmask`` and
  ``apply_token_bitmask_inplace``. Each side's least of :data:`FIRST_MASK_REPEATS`
  tries, as ``timeit`` reports.
- ``prompt_mask``: the prompt's mask of a request whose grammar is compiled already (a
  server's later requests with the same schema), each side's least of
  :data:`FIRST_MASK_REPEATS`. Ours: the hook's first call, the hook built untimed (its
  spec parsed, its compiled grammar found). Direct: a copy of the kept matcher, its fill
  and apply. Ours does not fill this mask: the compiled grammar kept it. A copy's first
  mask costs more than the same mask from the matcher it copied (measured with
  llguidance alone, in ``docs/limits.md``), and llguidance's side pays that here,
  where ours pays it at the first step of ``mask_b1``: that step's cost shows in
  ``mask_b1`` and this mask's saving shows here.
- ``request_mask``: a request whose schema the server has seen before, from its parsed
  body to its prompt's mask, each side's least of :data:`FIRST_MASK_REPEATS`. Ours: as
  ``anylogits serve`` runs it, the body's specs (the JSON text ``vllm_xargs`` makes)
  admitted and built (``serving.admit``: the text parsed and found among the specs that
  built, the processor built as checked, taking the grammar its check made), then the
  pipeline's first call. Direct: the schema's ``json.dumps`` as the key of the kept
  matcher (the least a server of parsed bodies does to find it), a copy, its fill and
  apply. No target: what a request costs to admit beyond its grammar (its specs' text
  parsed, linear in the schema's size; its processors and pipeline built).
- ``mask_b1``, ``mask_b1_in_place``, ``mask_b32``, ``mask_b32_in_place``: one decoding
  step along a real instance, with 1 and 32 rows (at B=1 each path walked
  :data:`ONE_ROW_REPEATS` times, for the p99). Each schema's path is the first
  :data:`PATH_TOKENS` tokens of its example instance (``test_support.schema_examples``:
  required properties, up to :data:`OPTIONAL_KEYS` optional scalar ones per object, one
  item per list; valid under what lenient mode enforces), as the vocabulary's tokenizer
  writes its ``json.dumps`` text (the grammar's layout), and accepted token by token by
  llguidance. Ours: the transformers hook fed the growing ``(B, L)`` history as
  ``generate`` feeds it (each row starting from its own prompt token, so rows are
  distinct sequences; every call's mask must allow the path's next token, or the
  comparison would be void); ``mask_b1`` and ``mask_b32`` keep transformers' scores (the
  hook's default: the masked logits go to another tensor), the ``_in_place`` ones mask
  them (``in_place=True``), as llguidance does. Direct: ``consume_token`` per row,
  ``fill_next_token_bitmask`` (B=1) or ``fill_next_token_bitmask_par`` (B=32) and
  ``apply_token_bitmask_inplace``. ``mask_b32_in_place_rows``: ``mask_b32_in_place``
  against llguidance filling the 32 rows one after another in the calling thread
  (``fill_next_token_bitmask`` per row) instead of with its pool: its faster path where
  its default pool has one thread (80% of the CPUs: a 2-core machine), which is what
  anylogits does there. A step on either side consumes the token the last
  step allowed, then fills and applies (ours consumes lazily, at the fill): the same
  work between the same two forwards, so the steps pair up (llguidance's ``consume`` of
  one token can cost more than its fill, and counted in the step before on one side only
  it would skew the per-step quantiles). The first mask (the prompt's) is left out:
  ``first_mask`` measures it, and ``prompt_mask`` with the grammar compiled already.
- ``mask_b1_after_forward``, ``mask_b32_after_forward``: ``mask_b1`` and ``mask_b32``
  with, before each step, a pass over ``schema_walks.FORWARD_BYTES`` of memory and then
  the step's logits written, what a model's forward does to the caches between two
  masks in generation (back to back, as ``mask_b1``, every step finds the last one's
  data and code in the caches). At B=32 that decides what keeping the scores costs:
  back to back, the second 6-16 MB tensor is the one the caches lose, in place or not;
  after a forward both sides start from memory.
- ``requests_b32``: the serving case, 32 requests with a schema each (the 32 longest
  example paths), walked together for as many steps as the shortest path has,
  :data:`REQUEST_REPEATS` times. Ours: ``PersistentBatch``, what vLLM's and transformers'
  continuous-batching adapters run, one request per slot and its tokens pushed as an
  engine pushes them (the requests' grammars stack into one fill and one apply). Direct:
  ``consume_token`` per row, the 32 matchers filled at once
  (``fill_next_token_bitmask_par``), one apply.
- ``requests_b32_mlx`` (where mlx-lm is installed): the same requests on MLX logits, the
  processor part of mlx-lm's ``GenerationBatch`` step as ``anylogits serve mlx`` runs it
  (``adapters.mlx.batch.BatchedHooks``: one copy of the step's logits, one call for the
  batch), from the model's logits to the processed ones evaluated. Direct: a copy of the
  logits torch can edit, ``consume_token`` per row, the rows filled one after another in
  this thread, one apply (llguidance's MLX apply is a Metal kernel). Ours fills the
  masks before it waits for its copy (``PendingLogits``), which MLX makes meanwhile in
  its own thread; llguidance's loop, as its users write it, waits first. In a server
  the same order puts the fills beside the model's forward.
  ``requests_b32_mlx_rows``: ours as mlx-lm's own loop runs each row's hook on its row
  alone (what every release but the one ``BatchedHooks`` copies gets), against the same.

Llguidance direct runs with its own tokenizer from the Hugging Face one
(``llguidance.hf.from_tokenizer``), as its users run it; ours with anylogits' vocabulary
(``hf_vocabulary``). Both sides keep a schema's compiled grammar from its first mask to
its last walk and copy it for each walk (ours: anylogits' compiled-grammar cache; direct:
``_Vocab.template``): copies of a matcher share the lexer it builds lazily, so a side
that compiled afresh for every walk would build that lexer again where the other reuses
it (a warm lexer fills a mask in ~60% of the time at p50, ~45% on average, at 49k).
Both sides' apply kernels are compiled before anything is timed: llguidance's by
``torch.compile`` at its first call, ours prepared as ``anylogits serve llama-cpp|mlx``
prepare them at start (``prepare_structured(..., apply_kernels=True)``; a process that
prepares nothing, a script's ``generate``, applies one row with the eager lookup:
4-6 us more a step at p50, 128k). Both sides of each schema run one after the other, which
goes first alternating, torch on one thread; ``setup_cache`` measures everything once
(~2 minutes on 2 busy cores) and the ``track_*`` methods read it.

The two sides' timed code is :mod:`schema_walks`.
``python -m asv_bench.benchmarks.bench_schema_corpus`` prints the same numbers as a table;
``... --one-row [VOCAB]`` only ``mask_b1``, each walk three times (:func:`one_row_walks`);
``... --requests [VOCAB]`` only the ``requests_*`` measures (:func:`walk_requests`).
"""

from __future__ import annotations

import functools
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from . import common  # one torch thread, as every benchmark
from . import schema_walks as sides

VOCABS = ["49k", "128k"]
MEASURES = [
    "first_mask",
    "prompt_mask",
    "request_mask",
    "mask_b1",
    "mask_b1_in_place",
    "mask_b1_after_forward",
    "mask_b32",
    "mask_b32_in_place",
    "mask_b32_in_place_rows",
    "mask_b32_after_forward",
    "requests_b32",
    "requests_b32_mlx",
    "requests_b32_mlx_rows",
]
# The walks: (measure, rows, the hook's in_place, a forward's memory pass between steps,
# whether llguidance fills several rows with its pool).
WALKS = (
    ("mask_b1", 1, False, False, True),
    ("mask_b1_in_place", 1, True, False, True),
    ("mask_b1_after_forward", 1, False, True, True),
    ("mask_b32", 32, False, False, True),
    ("mask_b32_in_place", 32, True, False, True),
    ("mask_b32_in_place_rows", 32, True, False, False),
    ("mask_b32_after_forward", 32, False, True, True),
)
QUANTILES = [50, 95, 99]
SAMPLE = 40
LARGEST = 8
PATH_TOKENS = 64
# The measures of the requests on mlx-lm's step: its hooks batched, or row by row.
MLX_REQUESTS = (("requests_b32_mlx", True), ("requests_b32_mlx_rows", False))
# ``requests_b32``: requests (one schema each) in one batch, and walks of them.
REQUESTS = 32
# The shortest of those paths has 14 tokens: 168 steps per side (with 84, the ratio of
# the medians moved by up to 0.15 between runs).
REQUEST_REPEATS = 12
# The example instances: optional scalar properties per object, nesting depth.
OPTIONAL_KEYS = 4
MAX_DEPTH = 5
# Each side's first mask is the least of this many (the order alternating): one sample
# of a 1 ms compile moved the ratio of the medians from 1.1 to 1.9 between idle runs.
FIRST_MASK_REPEATS = 3
# Walks of each path at B=1 (which goes first alternating): a p99 of one walk per schema
# (~1,200 steps, ~12 above it) moved by 0.1-0.2 between runs; these walks are cheap.
ONE_ROW_REPEATS = 3
SEED = 35

# {vocab: {measure: (ours' seconds, direct's seconds)}}, one entry per sample.
Times = dict[str, dict[str, tuple[list[float], list[float]]]]


def _has_mlx() -> bool:
    """Whether mlx-lm is installed, for the ``requests_b32_mlx*`` measures."""
    try:
        import mlx_lm.generate  # noqa: F401
    except ImportError:
        return False
    return True


def _require() -> Any:
    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch
        import transformers  # noqa: F401
    except ImportError as error:
        raise NotImplementedError(f"needs transformers and llguidance: {error}") from None
    return llguidance


def _tokenizer(vocab: str) -> Any:
    import transformers

    if vocab == "49k":
        from anylogits.engines.real_model import build_real_model

        return transformers.AutoTokenizer.from_pretrained(build_real_model())
    if vocab == "128k":
        from anylogits.testing.tiny_model import build_tiny_model

        return transformers.AutoTokenizer.from_pretrained(build_tiny_model())
    raise ValueError(f"unknown vocabulary {vocab!r}: one of {VOCABS}")


def _options() -> dict[str, Any]:
    from anylogits.processors.structured import json_options

    return json_options(False, True)


def sample_schemas() -> list[Any]:
    """The :data:`LARGEST` largest schemas that compile, then seeded others that do."""
    llguidance = _require()
    from test_support.schema_corpus import load

    def compiles(schema: Any) -> bool:
        if example_text(schema.schema) is None:
            return False
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema.schema, defaults=_options())
        return not llguidance.LLMatcher.validate_grammar(grammar)

    corpus = sorted(load(), key=lambda schema: (-schema.size, schema.id))
    largest = []
    for schema in corpus:
        if len(largest) == LARGEST:
            break
        if compiles(schema):
            largest.append(schema)
    taken = {schema.id for schema in largest}
    rest = [schema for schema in corpus if schema.id not in taken]
    random.Random(SEED).shuffle(rest)
    others = []
    for schema in rest:
        if len(others) == SAMPLE - LARGEST:
            break
        if compiles(schema):
            others.append(schema)
    return largest + others


def _limits() -> Any:
    import llguidance

    from anylogits.core.limits import llguidance_limits

    return llguidance.LLParserLimits(**llguidance_limits())


class _Vocab:
    """One vocabulary's tokenizers, logits and the direct side's matchers."""

    def __init__(self, vocab: str) -> None:
        import llguidance.hf

        from anylogits.core.vocab import hf_vocabulary

        self.hf = _tokenizer(vocab)
        self.vocabulary = hf_vocabulary(self.hf)  # held: the cache holds it weakly
        self.direct_tokenizer = llguidance.hf.from_tokenizer(self.hf)
        self.size = len(self.hf)
        self.eos = set(self.direct_tokenizer.eos_tokens)
        self.logits = {batch: common.peaked_logits(batch, self.size) for batch in (1, 32)}
        # The direct side's compiled grammars, as anylogits keeps its own: copies of a
        # matcher share its lazily built lexer, so a side that compiled afresh for each
        # walk would build that lexer again where the other reuses it. Keyed by the
        # schema's json.dumps, as ``request_mask`` times a server finding one.
        self.templates: dict[str, Any] = {}

    def template(self, schema: dict) -> Any:
        """The direct side's kept matcher of ``schema`` (compiled on first use), which
        its walks copy, as anylogits' walks copy its compiled grammar."""
        template = self.templates.get(json.dumps(schema))
        return self.keep(schema, self.matcher(schema)) if template is None else template

    def keep(self, schema: dict, matcher: Any) -> Any:
        """Keep ``matcher`` as ``schema``'s template and return it."""
        self.templates[json.dumps(schema)] = matcher
        return matcher

    def matcher(self, schema: dict) -> Any:
        """A freshly compiled matcher of ``schema``."""
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_options())
        matcher = llguidance.LLMatcher(
            self.direct_tokenizer, grammar, log_level=0, limits=_limits()
        )
        if matcher.is_error():
            raise RuntimeError(f"the schema does not compile: {matcher.get_error()}")
        return matcher

    def path(self, schema: dict) -> list[int] | None:
        """The first :data:`PATH_TOKENS` tokens of the schema's example instance
        (:func:`example_text`) as the vocabulary's tokenizer writes them; ``None`` where
        llguidance refuses them."""
        text = example_text(schema)
        if text is None:
            return None
        ids = self.hf.encode(text, add_special_tokens=False)[:PATH_TOKENS]
        if self.matcher(schema).try_consume_tokens(ids) != len(ids):
            return None
        return ids


def example_text(schema: dict) -> str | None:
    """A real instance of ``schema`` as JSON text laid out as the grammar lays it out
    (``json.dumps``): required properties, up to :data:`OPTIONAL_KEYS` optional scalar
    ones per object, one item per list (``test_support.schema_examples``), valid under
    what lenient mode enforces; ``None`` where the schema has no such instance."""
    from test_support.schema_examples import NoExample, example, lenient_validator

    try:
        instance = example(schema, schema, optional_keys=OPTIONAL_KEYS, max_depth=MAX_DEPTH)
    except (NoExample, RecursionError):
        return None
    if not lenient_validator(schema, True).is_valid(instance):
        return None
    return json.dumps(instance)


def _warm_up(vocab: _Vocab) -> None:
    """Both sides' apply kernels (llguidance's is ``torch.compile``d on first use; ours
    are prepared as ``anylogits serve llama-cpp|mlx`` prepare them at start) and lazily
    built state, on a small schema, untimed."""
    from anylogits.processors.structured.warm import prepare_structured

    prepare_structured(vocab.vocabulary, apply_kernels=True)
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    path = vocab.path(schema)
    assert path is not None
    for batch in (1, 32):
        sides.walk_ours(vocab, schema, path, batch)
        sides.walk_direct(vocab, schema, path, batch)
    sides.first_mask_ours(vocab, schema)
    sides.first_mask_direct(vocab, schema)


def _pair(ours: Callable[..., Any], direct: Callable[..., Any], swap: bool, *args: Any) -> tuple:
    """``ours(*args)`` and ``direct(*args)``, in the other order when ``swap``."""
    if swap:
        second = direct(*args)
        return ours(*args), second
    first = ours(*args)
    return first, direct(*args)


def measure(
    vocabs: list[str] = VOCABS,
    schemas: list[Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Times:
    """Every quantity on :func:`sample_schemas` (or ``schemas``) per vocabulary."""
    _require()
    schemas = sample_schemas() if schemas is None else schemas
    times: Times = {}
    for name in vocabs:
        vocab = _Vocab(name)
        _warm_up(vocab)
        found: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in MEASURES}
        started = time.perf_counter()
        for index, corpus_schema in enumerate(schemas):
            schema, swap = corpus_schema.schema, bool(index % 2)
            # The first mask (compiled first), then the prompt's with it compiled.
            for first, ours_side, direct_side in (
                ("first_mask", sides.first_mask_ours, sides.first_mask_direct),
                ("prompt_mask", sides.prompt_mask_ours, sides.prompt_mask_direct),
                ("request_mask", sides.request_mask_ours, sides.request_mask_direct),
            ):
                pairs = [
                    _pair(ours_side, direct_side, swap != bool(repeat % 2), vocab, schema)
                    for repeat in range(FIRST_MASK_REPEATS)
                ]
                found[first][0].append(min(ours for ours, _ in pairs))
                found[first][1].append(min(direct for _, direct in pairs))
            path = vocab.path(schema)
            if path is None:  # this vocabulary's tokens of the example are refused
                continue
            for walk, batch, in_place, forward, pool in WALKS:
                for repeat in range(ONE_ROW_REPEATS if batch == 1 else 1):
                    ours_steps, direct_steps = _pair(
                        lambda *args, in_place=in_place, forward=forward: sides.walk_ours(
                            *args, in_place=in_place, forward=forward
                        ),
                        lambda *args, forward=forward, pool=pool: sides.walk_direct(
                            *args, forward=forward, pool=pool
                        ),
                        swap != bool(repeat % 2),
                        vocab,
                        schema,
                        path,
                        batch,
                    )
                    found[walk][0].extend(ours_steps)
                    found[walk][1].extend(direct_steps)
        walk_requests(vocab, schemas, found)
        sides.clear_compiled(vocab)
        times[name] = found
        if progress is not None:
            progress(
                f"{name}: {len(schemas)} schemas, "
                f"{len(found['mask_b1'][0])} steps per batch size, "
                f"{time.perf_counter() - started:.0f} s"
            )
    return times


def walk_requests(
    vocab: _Vocab, schemas: list[Any], found: dict[str, tuple[list[float], list[float]]]
) -> None:
    """The ``requests_*`` measures into ``found``: the 32 schemas with the longest
    example paths, each its own request, walked together for as many steps as the
    shortest has, :data:`REQUEST_REPEATS` times (the mlx ones where mlx-lm is installed)."""
    walks = sorted(
        ((s.schema, vocab.path(s.schema)) for s in schemas),
        key=lambda walk: -len(walk[1] or ()),
    )[:REQUESTS]
    if len(walks) < REQUESTS or not all(path for _, path in walks):
        return
    sides_of = {"requests_b32": (sides.requests_ours, sides.requests_direct)}
    if _has_mlx():
        for mlx_measure, batched in MLX_REQUESTS:
            ours = functools.partial(sides.requests_mlx_ours, batched=batched)
            sides_of[mlx_measure] = (ours, sides.requests_mlx_direct)
    for repeat in range(REQUEST_REPEATS):
        for name, (ours_side, direct_side) in sides_of.items():
            ours_steps, direct_steps = _pair(ours_side, direct_side, bool(repeat % 2), vocab, walks)
            found[name][0].extend(ours_steps)
            found[name][1].extend(direct_steps)


def quantile(values: list[float], q: int) -> float:
    """The ``q``-th percentile of ``values`` (linear interpolation)."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def paired_ratios(ours: list[float], direct: list[float]) -> list[float]:
    """Each sample's ratio (the same schema, or the same step of the same path, on both
    sides): robust where the quantiles of two skewed samples fall on different schemas."""
    return [mine / theirs for mine, theirs in zip(ours, direct, strict=True)]


def _reader(side: str, q: int) -> Callable[..., float]:
    def track(self: Any, times: Times, vocab: str, measure: str) -> float:
        ours, direct = times[vocab][measure]
        if side == "ratio":
            return quantile(ours, q) / quantile(direct, q)
        if side == "paired_ratio":
            return quantile(paired_ratios(ours, direct), q)
        return quantile(ours if side == "ours" else direct, q) * 1e6

    ratio = side.endswith("ratio")
    track.unit = "ratio" if ratio else "us"  # type: ignore[attr-defined]
    track.__name__ = f"track_{side}_p{q}" + ("" if ratio else "_us")
    return track


class SchemaCorpus:
    """p50 / p95 / p99 of the time to a schema's first mask and of the time per mask at
    B=1 and B=32, ours and llguidance direct, over a sample of the real-schema corpus.

    ``setup_cache`` measures both vocabularies once; the ``track_*`` methods read it."""

    params = (VOCABS, MEASURES)
    param_names = ["vocab", "measure"]
    timeout = 600

    def setup_cache(self) -> Times | None:
        try:
            _require()
        except NotImplementedError:
            return None  # setup skips every combination
        return measure()

    setup_cache.timeout = 1800  # type: ignore[attr-defined]

    def setup(self, times: Times | None, vocab: str, measure: str) -> None:
        if times is None:
            raise NotImplementedError("needs transformers and llguidance")
        if not times[vocab][measure][0]:
            raise NotImplementedError(f"{measure} was not measured here (mlx-lm is not installed)")


# track_{ours,direct}_p{50,95,99}_us, track_{ratio,paired_ratio}_p{50,95,99}.
for _side in ("ours", "direct", "ratio", "paired_ratio"):
    for _q in QUANTILES:
        _track = _reader(_side, _q)
        setattr(SchemaCorpus, _track.__name__, _track)


def table(times: Times) -> str:
    """The measurements as a Markdown table."""
    lines = [
        "| vocab | measure | samples | ours p50 / p95 / p99 | direct p50 / p95 / p99 "
        "| ours / direct p50 / p95 / p99 | paired ratio p50 / p95 / p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for vocab, found in times.items():
        for name, (ours, direct) in found.items():
            if not ours:  # an engine not installed here
                continue
            unit, scale, digits = ("ms", 1e3, 1) if name == "first_mask" else ("us", 1e6, 0)
            ours_q = [quantile(ours, q) for q in QUANTILES]
            direct_q = [quantile(direct, q) for q in QUANTILES]
            ratios = [o / d for o, d in zip(ours_q, direct_q, strict=True)]
            paired = paired_ratios(ours, direct)
            paired_q = [quantile(paired, q) for q in QUANTILES]
            lines.append(
                f"| {vocab} | {name} | {len(ours)} "
                f"| {' / '.join(f'{v * scale:.{digits}f}' for v in ours_q)} {unit} "
                f"| {' / '.join(f'{v * scale:.{digits}f}' for v in direct_q)} {unit} "
                f"| {' / '.join(f'{r:.2f}' for r in ratios)} "
                f"| {' / '.join(f'{r:.2f}' for r in paired_q)} |"
            )
    return "\n".join(lines)


def one_row_walks(
    vocab: str = "49k", repeats: int = ONE_ROW_REPEATS
) -> tuple[list[float], list[float]]:
    """``mask_b1`` alone, each schema's walk ``repeats`` times (both sides interleaved as
    in :func:`measure`): the B=1 ratio with more samples, in ~30 s instead of ~1.5 min."""
    _require()
    schemas = sample_schemas()
    found = _Vocab(vocab)
    _warm_up(found)
    walks = [(schema.schema, found.path(schema.schema)) for schema in schemas]
    walks = [(schema, path) for schema, path in walks if path is not None]
    ours: list[float] = []
    direct: list[float] = []
    for index in range(repeats * len(walks)):
        schema, path = walks[index % len(walks)]
        mine, theirs = _pair(
            sides.walk_ours, sides.walk_direct, bool(index % 2), found, schema, path, 1
        )
        ours.extend(mine)
        direct.extend(theirs)
    return ours, direct


def main(argv: list[str] | None = None) -> None:
    arguments = argv if argv is not None else sys.argv[1:]
    if arguments[:1] == ["--requests"]:
        name = arguments[1] if len(arguments) > 1 else "49k"
        vocab = _Vocab(name)
        _warm_up(vocab)
        found: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in MEASURES}
        walk_requests(vocab, sample_schemas(), found)
        print(table({name: found}))
        return
    if arguments[:1] == ["--one-row"]:
        vocab = arguments[1] if len(arguments) > 1 else "49k"
        print(table({vocab: {"mask_b1": one_row_walks(vocab)}}))
        return
    vocabs = arguments or VOCABS
    schemas = sample_schemas()
    sizes = sorted(schema.size for schema in schemas)
    print(
        f"{len(schemas)} schemas (lenient), {sizes[0]} B to {sizes[-1]} B of JSON "
        f"(median {sizes[len(sizes) // 2]} B); paths of up to {PATH_TOKENS} tokens"
    )
    print(table(measure(list(vocabs), schemas, progress=print)))


if __name__ == "__main__":
    main()
