"""Structured processors on a synthetic vocabulary: the bitmask apply, EOS exactly when
the grammar accepts, sequences forked and rolled back, errors before generation."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

llguidance = pytest.importorskip("llguidance")

from anylogits import (  # noqa: E402
    Choice,
    Grammar,
    JSONSchema,
    Pipeline,
    Regex,
    Vocabulary,
    from_spec,
)
from anylogits.core.pending import PendingLogits  # noqa: E402
from anylogits.core.registry import processor_type  # noqa: E402
from anylogits.processors.structured import mask as _bitmask  # noqa: E402
from anylogits.processors.structured.engine import ENGINE, _VocabularyTokenizer  # noqa: E402
from test_support.grammar_fills import counted_checks, counted_fills  # noqa: E402

PIECES = [*'abc0123456789{}[]":, ', "ab", '{"', '":', "12"]
EOS = len(PIECES)
VOCAB = Vocabulary(
    tokens=(*(p.encode() for p in PIECES), b"<eos>"),
    eos_token_ids=frozenset({EOS}),
    special_token_ids=frozenset({EOS}),
)
IDS = {piece: index for index, piece in enumerate(PIECES)}


def allowed(processor: object, generated: list[list[int]], width: int = EOS + 1) -> list[set]:
    """The ids each row may take next, after a prompt ``[0]`` and ``generated`` ids."""
    pipeline = Pipeline([processor], VOCAB)  # type: ignore[list-item]
    pipeline(torch.zeros(len(generated), width), torch.zeros(len(generated), 1, dtype=torch.long))
    longest = max(map(len, generated))
    ids = torch.zeros(len(generated), 1 + longest, dtype=torch.long)
    lengths = torch.tensor([1 + len(g) for g in generated])
    for row, tokens in enumerate(generated):
        if tokens:
            ids[row, -len(tokens) :] = torch.tensor(tokens)
    out = pipeline(torch.zeros(len(generated), width), ids, lengths=lengths)
    return [set(torch.nonzero(row > float("-inf")).flatten().tolist()) for row in out]


@pytest.fixture(params=["compiled", "eager"])
def apply_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both bitmask applies: the fused ``torch.compile`` kernel and the eager fallback."""
    monkeypatch.setattr(_bitmask, "COMPILE", request.param == "compiled")
    return request.param


def _masked_bit_by_bit(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` with every token whose bit is 0, or beyond the bitmask, at ``-inf``."""
    expected = logits.clone()
    words = bitmask.shape[1]
    for row in range(logits.shape[0]):
        for token in range(logits.shape[1]):
            word, bit = divmod(token, 32)
            if word >= words or not (int(bitmask[row, word]) >> bit) & 1:
                expected[row, token] = float("-inf")
    return expected


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example(batch=1, words=2, width_extra=31, dtype=torch.float32, seed=0)  # exactly 32 * words
@example(batch=3, words=2, width_extra=31, dtype=torch.bfloat16, seed=1)
@given(
    batch=st.integers(1, 5),
    words=st.integers(1, 6),
    width_extra=st.integers(0, 40),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_bitmask_apply_equals_bit_by_bit(
    apply_path: str, batch: int, words: int, width_extra: int, dtype: torch.dtype, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (batch, words), generator=generator).int()
    width = max(1, 32 * words - 31 + width_extra)
    logits = torch.randn(batch, width, generator=generator).to(dtype)
    expected = _masked_bit_by_bit(logits, bitmask)
    assert torch.equal(_bitmask.apply_bitmask(logits.clone(), bitmask), expected)
    # Written to a separate tensor instead: the same result, the input untouched.
    original = logits.clone()
    out = torch.full_like(logits, 7.0)
    assert _bitmask.apply_bitmask(logits, bitmask, out=out) is out
    assert torch.equal(out, expected)
    assert torch.equal(logits, original)
    # A kept bitmask, refilled between calls: its kept index follows the new contents.
    reused = _bitmask.ReusedBitmask(batch, words)
    reused.tensor.copy_(~bitmask)
    _bitmask.apply_bitmask(logits, reused, out=out)
    reused.tensor.copy_(bitmask)
    assert _bitmask.apply_bitmask(logits, reused, out=out) is out
    assert torch.equal(out, expected)
    assert torch.equal(_bitmask.apply_bitmask(logits.clone(), reused), expected)


@pytest.mark.parametrize("padding", [0, 40])
def test_a_structured_pipeline_writing_to_out_leaves_the_logits_untouched(
    apply_path: str, padding: int
) -> None:
    # Two rows take the fused path (when compiled); padding: logits wider than the vocabulary.
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, EOS + 1 + padding, generator=generator)
    ids = torch.tensor([[0], [0]])
    in_place = Pipeline([Regex("[0-9]{2}c")], VOCAB)(logits.clone(), ids)
    original = logits.clone()
    out = torch.full_like(logits, 9.0)
    result = Pipeline([Regex("[0-9]{2}c")], VOCAB)(logits, ids, out=out)
    assert result is out
    assert torch.equal(out, in_place)
    assert torch.equal(logits, original)


def test_masks_kept_from_a_call_in_inference_mode_serve_calls_outside_it(
    apply_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A thread's one-row bitmask and bias buffer made under torch.inference_mode (vLLM's
    # steps, a transformers pipeline) were inference tensors: the thread's next call
    # outside it (generate under no_grad) raised "Inplace update to inference tensor".
    from anylogits.processors import structured

    monkeypatch.setattr(structured, "_one_row_bitmasks", threading.local())
    monkeypatch.setattr(_bitmask, "_bias_buffers", threading.local())
    expected = allowed(Regex("[0-9]{2}c"), [[]])
    for rows in (1, 2):
        with torch.inference_mode():
            first = Pipeline([Regex("[0-9]{2}c")], VOCAB)
            out = first(torch.zeros(rows, EOS + 1), torch.zeros(rows, 1, dtype=torch.long))
        assert out.is_inference()
        for in_place in (True, False):
            logits = torch.zeros(rows, EOS + 1)
            target = None if in_place else torch.empty_like(logits)
            ids = torch.zeros(rows, 1, dtype=torch.long)
            result = first(logits, ids, out=target)
            assert not result.is_inference()
            assert [
                set(torch.nonzero(row > float("-inf")).flatten().tolist()) for row in result
            ] == expected * rows


@pytest.fixture
def fresh_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """No kernel compiled or captured yet in this test."""
    monkeypatch.setattr(_bitmask, "COMPILE", True)
    monkeypatch.setattr(_bitmask, "_compiled_kernels", {})
    monkeypatch.setattr(_bitmask, "_compile_failed", False)
    monkeypatch.setattr(_bitmask, "_captures", {})
    monkeypatch.setattr(_bitmask, "_capture_of_layout", {})
    monkeypatch.setattr(_bitmask, "_uncapturable", set())


@pytest.fixture
def no_dynamo(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compile`` fails the test if called."""

    def refused(function: object, **options: object) -> object:
        raise AssertionError("torch.compile was called")

    monkeypatch.setattr(torch, "compile", refused)


@pytest.mark.usefixtures("fresh_kernels", "no_dynamo")
def test_the_fused_apply_on_the_host_runs_without_dynamo() -> None:
    # Dynamo's frame hook, guards and wrappers cost ~50 us a step at B=32 (8% at 49k
    # tokens): host tensors take the kernel traced and compiled once, guards checked here.
    generator = torch.Generator().manual_seed(0)
    for rows, words, width in [(2, 2, 64), (3, 5, 150), (5, 5, 160), (4, 4, 100)]:
        bitmask = torch.randint(-(2**31), 2**31 - 1, (rows, words), generator=generator).int()
        logits = torch.randn(rows, width, generator=generator)
        expected = _masked_bit_by_bit(logits, bitmask)
        out = torch.empty_like(logits)
        assert _bitmask.apply_bitmask(logits, bitmask, out=out) is out
        assert torch.equal(out, expected)
        assert torch.equal(_bitmask.apply_bitmask(logits, bitmask), expected)
    assert not _bitmask._compile_failed
    # Two shape classes per kernel: rows as wide as their words' bits, and narrower.
    assert sorted(map(len, _bitmask._captures.values())) == [2, 2]


@pytest.mark.usefixtures("fresh_kernels", "no_dynamo")
def test_one_host_row_takes_the_fused_kernel_once_it_is_prepared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A one-row call never compiles (a generation of one sequence would wait for it): the
    # eager apply serves it until a server's start prepares the kernels, which then serve
    # it (V=128k, a random mask: 20 against 38 us a call) without Dynamo.
    eager: list[object] = []
    real_eager = _bitmask._apply_eager

    def counted_eager(*arguments: object) -> None:
        eager.append(arguments)
        real_eager(*arguments)  # type: ignore[arg-type]

    monkeypatch.setattr(_bitmask, "_apply_eager", counted_eager)
    generator = torch.Generator().manual_seed(2)
    cases = []
    for words, width in [(5, 160), (7, 200), (4, 128)]:  # as wide as the words' bits, or not
        bitmask = torch.randint(-(2**31), 2**31 - 1, (1, words), generator=generator).int()
        logits = torch.randn(1, width, generator=generator)
        cases.append((bitmask, logits, _masked_bit_by_bit(logits, bitmask)))

    def apply_all() -> None:
        for bitmask, logits, expected in cases:
            assert torch.equal(_bitmask.apply_bitmask(logits.clone(), bitmask), expected)
            out = torch.empty_like(logits)
            assert _bitmask.apply_bitmask(logits, bitmask, out=out) is out
            assert torch.equal(out, expected)
            with torch.inference_mode():
                assert torch.equal(_bitmask.apply_bitmask(logits.clone(), bitmask), expected)

    apply_all()
    assert len(eager) == 3 * len(cases) and not _bitmask._captures  # nothing compiled
    _bitmask.prepare_bitmask_kernels()
    eager.clear()
    apply_all()
    assert not eager and not _bitmask._compile_failed
    # Called without AOT autograd's wrappers (~3 us of a 7-10 us call at 49k tokens).
    calls = [capture.call for made in _bitmask._captures.values() for capture in made]
    assert {call.__qualname__ for call in calls} == {"_without_wrappers.<locals>.call"}
    # Several rows take a prepared kernel too: their first call compiles nothing.
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, 3), generator=generator).int()
    logits = torch.randn(4, 90, generator=generator)
    assert torch.equal(_bitmask.apply_bitmask(logits, bitmask), _masked_bit_by_bit(logits, bitmask))
    assert not eager and not _bitmask._compiled_kernels


def test_a_process_that_prepares_nothing_applies_one_row_eagerly_and_compiles_nothing() -> None:
    # A script's generate of one sequence: no Inductor import, no compile, in the first
    # call or any.
    script = (
        "import sys, torch\n"
        "from anylogits.processors.structured import mask\n"
        "bitmask = torch.tensor([[0b101, 1]], dtype=torch.int32)\n"
        "for _ in range(3):\n"
        "    mask.apply_bitmask(torch.zeros(1, 64), bitmask)\n"
        "    mask.apply_bitmask(torch.zeros(1, 64), bitmask, out=torch.empty(1, 64))\n"
        "assert not mask._captures and not mask._compiled_kernels\n"
        "assert 'torch._inductor.compile_fx' not in sys.modules, 'Inductor imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_a_compiled_module_whose_own_call_writes_otherwise_keeps_its_wrappers() -> None:
    # Another torch's compiled module: its own call is taken only where it writes what
    # the wrapped call writes.
    def wrapped(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        _bitmask._mask_by_bits(logits, bitmask)

    examples = [torch.empty(1, 64), torch.empty(1, 2, dtype=torch.int32)]
    for own_call in (lambda tensors: None, lambda tensors: tensors[0].zero_(), 3):
        wrapped.current_callable = own_call  # type: ignore[attr-defined]
        assert _bitmask._without_wrappers(wrapped, examples) is wrapped
    wrapped.current_callable = lambda tensors: _bitmask._mask_by_bits(*tensors)  # type: ignore[attr-defined]
    assert _bitmask._without_wrappers(wrapped, examples) is not wrapped


@pytest.mark.usefixtures("fresh_kernels")
def test_layouts_the_captured_kernel_does_not_fit_take_dynamo_and_stay_exact() -> None:
    generator = torch.Generator().manual_seed(1)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 4), generator=generator).int()
    wide = torch.randn(5, 120, generator=generator)
    cases = {
        "rows at an offset": wide[2:],
        "rows with a stride": wide[:3, :90],
        "one word a row": wide[:3, :20],
    }
    for name, logits in cases.items():
        mask = bitmask[:, : -(-logits.shape[1] // 32)].contiguous()
        expected = _masked_bit_by_bit(logits, mask)
        assert torch.equal(_bitmask.apply_bitmask(logits.clone(), mask), expected), name
        result = _bitmask.apply_bitmask(logits, mask, out=torch.empty(logits.shape))
        assert torch.equal(result, expected), name
        in_place = logits.clone() if name == "one word a row" else logits
        assert torch.equal(_bitmask.apply_bitmask(in_place, mask), expected), name
    assert "_mask_by_bits" in _bitmask._compiled_kernels
    assert not _bitmask._compile_failed


@pytest.mark.usefixtures("fresh_kernels")
def test_torch_compile_disabled_disables_the_capture_too() -> None:
    # TORCH_COMPILE_DISABLE=1 (torch._dynamo.config.disable): nothing is compiled. Set with
    # the config's own patch: monkeypatch restores it with delattr, which hides the entry
    # from Dynamo for the rest of the process.
    import torch._dynamo

    bitmask = torch.tensor([[0b101, 1], [0b010, 0]], dtype=torch.int32)
    logits = torch.randn(2, 64)
    expected = _masked_bit_by_bit(logits, bitmask)
    with torch._dynamo.config.patch(disable=True):
        assert torch.equal(_bitmask.apply_bitmask(logits.clone(), bitmask), expected)
    assert not _bitmask._captures
    assert torch._dynamo.config.disable is False


@pytest.mark.usefixtures("fresh_kernels")
def test_a_kernel_that_cannot_be_captured_runs_through_dynamo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another torch's internals (make_fx, the guards' expression): the fused kernel as before.
    def internals_changed(self: object, kernel: object, arguments: object) -> None:
        raise AttributeError("produce_guards_expression")

    monkeypatch.setattr(_bitmask._Capture, "__init__", internals_changed)
    bitmask = torch.tensor([[0b101, 1], [0b010, 0]], dtype=torch.int32)
    logits = torch.randn(2, 64)
    expected = _masked_bit_by_bit(logits, bitmask)
    assert torch.equal(_bitmask.apply_bitmask(logits.clone(), bitmask), expected)
    assert torch.equal(_bitmask.apply_bitmask(logits.clone(), bitmask), expected)
    assert _bitmask._uncapturable == {("_mask_by_bits", torch.float32)}
    assert "_mask_by_bits" in _bitmask._compiled_kernels
    assert not _bitmask._compile_failed


def test_bitmask_apply_falls_back_to_eager_with_a_warning_when_compiling_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_toolchain(function: object, **options: object) -> object:
        def fails(*args: object) -> None:
            raise RuntimeError("no C++ compiler found")

        return fails

    monkeypatch.setattr(_bitmask, "COMPILE", True)
    monkeypatch.setattr(_bitmask, "_compiled_kernels", {})
    monkeypatch.setattr(_bitmask, "_compile_failed", False)
    monkeypatch.setattr(torch, "compile", no_toolchain)
    bitmask = torch.tensor([[0b101], [0b010]], dtype=torch.int32)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler found"):
        first = _bitmask.apply_bitmask(torch.zeros(2, 3), bitmask)
    assert first.tolist() == [[0.0, float("-inf"), 0.0], [float("-inf"), 0.0, float("-inf")]]
    assert _bitmask._compile_failed  # later calls go straight to the eager path


def test_eos_is_allowed_exactly_when_the_regex_accepts() -> None:
    a, b, c, ab = IDS["a"], IDS["b"], IDS["c"], IDS["ab"]
    start, after_a, done = allowed(Regex("a[bc]"), [[], [a], [ab]])
    assert start == {a, ab}
    assert after_a == {b, c}
    assert done == {EOS}
    (optional_tail,) = allowed(Regex("a(b)?"), [[a]])
    assert optional_tail == {b, EOS}
    # A fully forced literal is spelled with its canonical token only (llguidance).
    (forced,) = allowed(Regex("ab"), [[]])
    assert forced == {ab}


def test_rows_forked_reordered_and_rolled_back_keep_their_own_matchers() -> None:
    processor = Regex("[0-9]{2}c")
    pipeline = Pipeline([processor], VOCAB)
    one, two, c = IDS["1"], IDS["2"], IDS["c"]
    calls = [
        [[0]],  # prompt
        [[0, one]],
        [[0, one, two], [0, one, one]],  # forked (beam search)
        [[0, one, one], [0, one, two]],  # reordered
        [[0, one]],  # rolled back (rejected draft tokens)
        [[0, one, two, c]],
    ]
    expected = [
        {IDS[d] for d in "0123456789"} | {IDS["12"]},
        {IDS[d] for d in "0123456789"},
        {c},
        {c},
        {IDS[d] for d in "0123456789"},
        {EOS},
    ]
    for rows, want in zip(calls, expected, strict=True):
        out = pipeline(torch.zeros(len(rows), EOS + 1), torch.tensor(rows))
        for row in out:
            assert set(torch.nonzero(row > float("-inf")).flatten().tolist()) == want


@pytest.mark.parametrize("rows", [1, 2])
def test_pending_logits_are_waited_for_once_the_masks_are_filled(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline given logits still being computed fills its grammars' masks first (in
    each processor's own bitmask: two grammars in one pipeline), then waits, and masks
    the logits as if it had been given them."""
    three, four = IDS["3"], IDS["4"]
    fills = counted_fills(monkeypatch)
    pending = Pipeline([Regex("[0-5]{2}c"), Regex("[3-9]{2}c")], VOCAB)
    plain = Pipeline([Regex("[0-5]{2}c"), Regex("[3-9]{2}c")], VOCAB)
    generator = torch.Generator().manual_seed(0)
    # Each grammar allows what the other does not: both masks must apply.
    for history in ([0], [0, three], [0, three, four]):
        ids = torch.tensor([history] * rows)
        logits = torch.randn(rows, EOS + 1, generator=generator)
        fills.clear()
        filled_at_wait: list[int] = []

        def wait(
            logits: torch.Tensor = logits, filled_at_wait: list[int] = filled_at_wait
        ) -> torch.Tensor:
            filled_at_wait.extend(fills)
            return logits.clone()

        out = pending(PendingLogits(rows, logits.device, wait), ids)
        assert filled_at_wait == fills == [rows, rows], history
        expected = plain(logits.clone(), ids)
        assert torch.equal(out, expected), history
        assert not torch.equal(expected, logits), "the grammars mask nothing here"


def test_masks_prepared_for_one_batch_are_not_taken_by_another() -> None:
    """A prepare whose batch never came (its engine failed between) leaves nothing
    behind: the next batch gets its own masks."""
    one = IDS["1"]
    processor = Regex("[0-9]{2}c")
    pipeline = Pipeline([processor], VOCAB)
    pipeline(torch.zeros(2, EOS + 1), torch.tensor([[0], [0]]))
    # Prepared at the start, where "12" is allowed too.
    stale = pipeline._batch(2, torch.device("cpu"), torch.tensor([[0], [0]]), None)
    pipeline.prepare(stale)
    out = pipeline(torch.zeros(2, EOS + 1), torch.tensor([[0, one], [0, one]]))
    digits = {IDS[d] for d in "0123456789"}
    for row in out:
        assert set(torch.nonzero(row > float("-inf")).flatten().tolist()) == digits
    assert processor._prepared is None


def test_json_schema_masks_follow_a_valid_instance_and_end_with_eos() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    text = json.dumps({"a": 12})  # the default layout: ", " and ": "
    tokens = _VocabularyTokenizer(VOCAB)(text)  # longest pieces first, as forced text is
    assert len(tokens) < len(text)
    rows = allowed(JSONSchema(schema), [tokens[:k] for k in range(len(tokens) + 1)])
    for k, row in enumerate(rows[:-1]):
        assert tokens[k] in row, (k, tokens[k])
        assert EOS not in row
    assert rows[-1] == {EOS}


def test_json_schema_separators_lay_the_output_out_as_json_dumps_does() -> None:
    # (",", ":"): the compact layout of vLLM's structured outputs without whitespace.
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    compact = JSONSchema(schema, separators=[",", ":"])
    assert compact.separators == (",", ":")
    assert from_spec({"type": "json_schema", **compact.config()}).separators == (",", ":")
    opening = [IDS['{"'], IDS["a"], IDS['"']]
    (after_key,) = allowed(compact, [opening])
    assert after_key == {IDS[":"]}
    (after_colon,) = allowed(compact, [[*opening, IDS[":"]]])
    assert after_colon == {IDS[d] for d in "0123456789"} | {IDS["12"]}
    (spaced,) = allowed(JSONSchema(schema), [[*opening, IDS[":"]]])
    assert spaced == {IDS[" "]}


@pytest.mark.parametrize("separators", [(",",), (";", ":"), (",\n", ":"), ",:", (", ", 1)])
def test_json_schema_refuses_other_separators(separators: object) -> None:
    with pytest.raises(ValueError, match="separators must be \\(item, key\\)"):
        JSONSchema({"type": "object"}, separators=separators)  # type: ignore[arg-type]


def test_ids_beyond_the_vocabulary_are_masked() -> None:
    (row,) = allowed(Choice(["c"]), [[]], width=EOS + 1 + 70)
    assert row == {IDS["c"]}


def test_a_token_outside_the_grammar_ends_the_sequence() -> None:
    (row,) = allowed(Regex("a[bc]"), [[IDS["c"]]])
    assert row == {EOS}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: JSONSchema("{"), "schema is not valid JSON"),
        (lambda: JSONSchema(3), "schema must be a dict"),
        (lambda: Grammar("root ::= missing", syntax="gbnf"), "gbnf grammar"),
        (lambda: Grammar("start: 'a'", syntax="ebnf"), "syntax must be 'lark' or 'gbnf'"),
        (lambda: Choice([]), "non-empty list"),
        (lambda: Choice(["a", "a"]), "duplicates"),
    ],
)
def test_bad_input_is_rejected_at_construction(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


NOT_COMPILING = [
    ({"type": "regex", "pattern": "(ab"}, "Regex: regex '\\(ab' does not compile"),
    ({"type": "json_schema", "schema": {"type": "object", "not": {}}}, "keys.*not"),
    ({"type": "grammar", "grammar": "start: foo"}, "Grammar: the lark grammar does not compile"),
]


@pytest.mark.parametrize(("spec", "message"), NOT_COMPILING)
def test_a_grammar_that_does_not_compile_is_refused_when_bound(spec: dict, message: str) -> None:
    """Built in Python, a grammar is compiled once, when bound to the vocabulary (what
    every hook does when it is made): the error comes then, before any generation."""
    processor = _built_here(spec)
    with pytest.raises(ValueError, match=message):
        processor.bind(VOCAB)


@pytest.mark.parametrize(("spec", "message"), NOT_COMPILING)
def test_a_spec_that_does_not_compile_is_refused_when_parsed(spec: dict, message: str) -> None:
    """From a request, the guarded checker compiles it first: a server's 400."""
    with pytest.raises(ValueError, match=message):
        from_spec(spec)


def _built_here(spec: dict) -> Any:
    """The spec's processor built by its constructor, as a user does (not by from_spec)."""
    fields = dict(spec)
    return processor_type(fields.pop("type"))(**fields)


def test_an_engine_failure_raises_instead_of_ending_the_sequence() -> None:
    # llguidance calls the tokenizer back for forced text; here that call fails (as when
    # the tokenizer a cached vocabulary points to was freed).
    def broken(text: str) -> list[int]:
        raise RuntimeError("tokenizer gone")

    vocab = Vocabulary(VOCAB.tokens, eos_token_ids=VOCAB.eos_token_ids, encode=broken)
    with pytest.raises(RuntimeError, match="tokenizer gone"):
        Pipeline([Choice(["ab"])], vocab)(torch.zeros(1, EOS + 1), torch.tensor([[0]]))


@pytest.mark.parametrize(
    "grammar",
    [
        ("root ::= r0\nr0 ::= r0\n", "gbnf"),  # found by the fuzzer: compiles, allows nothing
        ("start: a\na: a", "lark"),
    ],
)
def test_a_grammar_that_allows_no_output_is_refused_before_generation(
    grammar: tuple[str, str],
) -> None:
    processor = Grammar(grammar[0], syntax=grammar[1])  # validation passes: it compiles
    with pytest.raises(ValueError, match="the grammar allows no output"):
        Pipeline([processor], VOCAB)


def test_a_grammar_over_its_per_token_budget_ends_its_own_sequence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by the fuzzer: a grammar can compile, start, and later need more Earley
    items for one token than `grammar_step_items` allows. Over the budget at the first
    token it is refused before generation; later, its sequence ends (EOS only), as on a
    server, with a warning naming the limit."""
    from anylogits.core.limits import override

    grammar = 'start: r0\nr0: (/[a-c]/)~3 r0{2} r0~4 ["a"]\n    | [/[0-9]/]\n'
    with override(grammar_step_items=3), pytest.raises(ValueError, match="first token needs"):
        Pipeline([Grammar(grammar)], VOCAB)
    for budget in (20, 30, 50):  # the first that lets the grammar start (by llguidance)
        with override(grammar_step_items=budget):
            try:
                pipeline = Pipeline([Grammar(grammar)], VOCAB)
            except ValueError:
                continue
            ids = [0]
            with caplog.at_level("WARNING"):
                for _ in range(12):
                    out = pipeline(torch.zeros(1, EOS + 1), torch.tensor([ids]))
                    allowed = torch.nonzero(out[0] > float("-inf")).flatten().tolist()
                    if allowed == [EOS]:
                        break
                    ids.append(allowed[0])
            assert allowed == [EOS], (budget, ids)
            assert "anylogits limits 'grammar_step_items'" in caplog.text
            return
    pytest.fail("no budget let the grammar start")


def test_a_prefix_no_token_extends_ends_its_sequence(caplog: pytest.LogCaptureFixture) -> None:
    """Found by the fuzzer: the grammar allows "ab", which nothing completes (``r1`` is
    empty); the step after it raised. Now that sequence ends there."""
    grammar = Grammar('start: "a" "b" r1\nr1: r1 "c"')
    with caplog.at_level("WARNING"):
        assert allowed(grammar, [[IDS["a"], IDS["b"]]]) == [{EOS}]
    assert "allows no token after this prefix" in caplog.text


def test_a_processor_without_vocabulary_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match="needs the model's vocabulary"):
        Pipeline([Regex("a")])(torch.zeros(1, 4), torch.tensor([[0]]))


def test_specs_round_trip_and_pydantic_models_become_schemas() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int
        y: int

    processors = [
        Regex("a+"),
        JSONSchema(Point),
        JSONSchema('{"type": "boolean"}', flexible_whitespace=True),
        Choice(["yes", "no"]),
        Grammar('root ::= "a" | "b"', syntax="gbnf"),
    ]
    for processor in processors:
        spec = processor.to_spec()
        assert json.loads(json.dumps(spec)) == spec
        assert from_spec(spec).to_spec() == spec
    assert processors[1].schema["required"] == ["x", "y"]


def test_grammars_of_one_pipeline_each_mask_a_single_row() -> None:
    # One row's bitmask is shared by the processors of a thread: each fills and applies
    # it before the next one fills it.
    a, b, c = IDS["a"], IDS["b"], IDS["c"]
    assert allowed(Regex("[ab]c"), [[]]) == [{a, b}]
    assert allowed(Regex("[bc]c"), [[]]) == [{b, c}]
    pipeline = Pipeline([Regex("[ab]c"), Regex("[bc]c")], VOCAB)
    out = pipeline(torch.zeros(1, EOS + 1), torch.zeros(1, 1, dtype=torch.long))
    assert set(torch.nonzero(out[0] > float("-inf")).flatten().tolist()) == {b}


def test_a_hook_run_in_another_thread_fills_a_row_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Built (bound) here, run in a worker thread whose fill is paused while this thread
    # fills and applies another grammar's row: the worker must apply its own mask.
    import threading

    b, c, zero = IDS["b"], IDS["c"], IDS["0"]
    worker_pipeline = Pipeline([Regex("a[bc]")], VOCAB)
    main_pipeline = Pipeline([Regex("a[b0]")], VOCAB)
    filled, main_done = threading.Event(), threading.Event()
    fill_row = type(ENGINE).fill_row

    def paused_fill_row(engine: Any, matcher: Any, bitmask: torch.Tensor, row: int) -> bool:
        ended = fill_row(engine, matcher, bitmask, row)
        if threading.current_thread() is not threading.main_thread():
            filled.set()
            assert main_done.wait(30)
        return ended

    monkeypatch.setattr(type(ENGINE), "fill_row", paused_fill_row)
    results: dict[str, set[int]] = {}

    def run(name: str, pipeline: Pipeline) -> None:
        # After "a": not the first mask, which comes from the compile.
        out = pipeline(torch.zeros(1, EOS + 1), torch.tensor([[0, IDS["a"]]]))
        results[name] = set(torch.nonzero(out[0] > float("-inf")).flatten().tolist())

    for pipeline in (worker_pipeline, main_pipeline):  # the prompt's call: the first mask
        pipeline(torch.zeros(1, EOS + 1), torch.tensor([[0]]))
    worker = threading.Thread(target=run, args=("worker", worker_pipeline))
    worker.start()
    assert filled.wait(30)
    run("main", main_pipeline)
    main_done.set()
    worker.join(30)
    assert results == {"worker": {b, c}, "main": {b, zero}}


def test_sequences_start_without_hashing_their_grammar_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server with more distinct grammars than the text-identity cache holds hashed
    # each request's grammar again at its start (~1 ms per MB).
    from anylogits.processors.structured import cache, engine

    processors = [Regex(f"a{{{n}}}") for n in range(1, 40)]
    pipelines = [Pipeline([processor], VOCAB) for processor in processors]
    hashed: list[str] = []

    def counted(grammar: str) -> bytes:
        hashed.append(grammar)
        return cache.grammar_key(grammar)

    monkeypatch.setattr(engine, "grammar_key", counted)
    for pipeline in pipelines:
        pipeline(torch.zeros(2, EOS + 1), torch.tensor([[0], [1]]))
    assert not hashed


def test_compiled_grammars_are_cached_per_vocabulary() -> None:
    first = ENGINE.start(Regex("a").grammar, VOCAB)
    second = ENGINE.start(Regex("a").grammar, VOCAB)
    assert first is not second  # each sequence gets its own matcher
    assert ENGINE.tokenizer(VOCAB) is ENGINE.tokenizer(VOCAB)


def test_vllm_request_rows_with_draft_tokens_mask_like_their_own_histories() -> None:
    # vLLM's request table (no prefix tracker): per step, one row per draft position of
    # each request; drafts are partly rejected, the replacement token is committed.
    from anylogits import to_specs
    from anylogits.adapters.vllm_requests import VllmRequests

    pattern = r"\{\"[abc]{1,6}\": [0-9]{1,4}\}"
    requests = VllmRequests(VOCAB)
    prompts, outputs = [[0], [1, 2]], [[], []]
    for slot in range(2):
        requests.add(
            slot,
            {"anylogits": to_specs([Regex(pattern)])},
            prompt_ids=prompts[slot],
            output_ids=outputs[slot],
        )
    generator = torch.Generator().manual_seed(0)
    ended = 0
    for _ in range(12):
        rows, drafts = [], []
        for slot in range(2):
            length = int(torch.randint(0, 4, (), generator=generator))
            draft = torch.randint(0, EOS + 1, (length,), generator=generator)
            for position in range(len(draft) + 1):
                rows.append(slot)
                drafts.append(draft[:position].tolist())
        logits = torch.randn(len(rows), EOS + 1, generator=generator)
        out = requests.process(logits.clone(), rows, drafts=drafts)
        for row, (slot, draft) in enumerate(zip(rows, drafts, strict=True)):
            (expected,) = allowed(Regex(pattern), [outputs[slot] + draft])
            assert set(torch.nonzero(out[row] > float("-inf")).flatten().tolist()) == expected
        for slot in range(2):  # accept the longest allowed draft prefix, then one token
            own = [d for s, d in zip(rows, drafts, strict=True) if s == slot]
            masks = [out[r] for r, s in enumerate(rows) if s == slot]
            accepted = 0
            while accepted + 1 < len(own) and masks[accepted][own[-1][accepted]] > float("-inf"):
                accepted += 1
            choice = int(torch.multinomial(masks[accepted].softmax(0), 1, generator=generator))
            outputs[slot].extend([*own[-1][:accepted], choice])
            ended += choice == EOS
    assert all(len(o) >= 12 for o in outputs) and ended


def test_a_grammar_is_validated_and_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server validates a request's grammar in its frontend and builds the processor
    again in the engine: the second time costs neither a validation nor a compile."""
    import llguidance

    from anylogits.processors.structured import engine as _grammar_engine

    real = llguidance.LLMatcher
    compiled: list[str] = []

    class CountingMatcher:
        def __call__(self, tokenizer: object, grammar: str, **kwargs: object) -> object:
            compiled.append(grammar)
            return real(tokenizer, grammar, **kwargs)

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

    monkeypatch.setattr(llguidance, "LLMatcher", CountingMatcher())
    pattern = f"(ab){{1,{len(compiled) + 977}}}"  # a grammar no other test compiles
    validations = _grammar_engine.VALIDATIONS.stats()
    compiles = _grammar_engine.COMPILED.stats()
    for _ in range(3):
        processor = from_spec({"type": "regex", "pattern": pattern})
        processor.bind(VOCAB)
        processor.init_state(torch.tensor([0]))
    assert _grammar_engine.VALIDATIONS.stats().misses == validations.misses + 1
    assert _grammar_engine.VALIDATIONS.stats().hits == validations.hits + 2
    assert len(compiled) == 1
    # Each bind and each sequence's start found the compiled grammar (1 miss, 5 hits).
    assert _grammar_engine.COMPILED.stats().misses == compiles.misses + 1
    assert _grammar_engine.COMPILED.stats().hits == compiles.hits + 5


def test_a_requests_spec_is_turned_into_its_grammar_once_per_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server checks a request's specs, then builds them to run (vLLM checks them twice
    first): built as checked, a structured spec takes the grammar its check made, without
    its checks or llguidance's translation again, until the limits change. A spec built
    otherwise (not checked as part of a request), or by its user, makes its own."""
    from anylogits.core.limits import override
    from anylogits.core.specs import BUILT_SPECS, build_specs, parse_specs

    checked = counted_checks(monkeypatch)
    translated: list[object] = []
    real = llguidance.LLMatcher

    class CountingMatcher:
        def __call__(self, *args: object, **kwargs: object) -> object:
            return real(*args, **kwargs)

        def grammar_from_json_schema(self, *args: object, **kwargs: object) -> str:
            translated.append(args)
            return real.grammar_from_json_schema(*args, **kwargs)

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

    monkeypatch.setattr(llguidance, "LLMatcher", CountingMatcher())
    BUILT_SPECS.clear()
    schema = {"type": "array", "items": {"enum": ["ab", "ba"]}, "maxItems": 977}
    spec = {"type": "json_schema", "schema": schema}
    request = parse_specs([spec], "request")
    assert len(checked) == len(translated) == 1
    processors = [*build_specs(request), *build_specs(parse_specs([spec], "request"))]
    assert len(checked) == len(translated) == 1
    assert processors[1].grammar is processors[0].grammar
    unchecked = from_spec(spec)
    mine = JSONSchema(schema)
    assert len(checked) == len(translated) == 3
    assert unchecked.grammar == mine.grammar == processors[0].grammar
    paths = [[], [IDS["["]], [IDS["["], IDS['"']]]
    assert allowed(processors[1], paths) == allowed(mine, paths)
    text_size = len(json.dumps(schema))
    with override(grammar_chars=text_size - 1), pytest.raises(ValueError, match="grammar_chars"):
        build_specs(request)  # checked under other limits: checked again, and refused
    with override(schema_items=976), pytest.raises(ValueError, match="schema_items"):
        build_specs(request)
    with override(items=1000):  # other limits: checked and translated again, once
        build_specs(request)
        build_specs(request)
    assert len(translated) == 4
    lark = counted_checks(monkeypatch, "check_lark")
    request = parse_specs([{"type": "grammar", "grammar": 'start: "ab"{1,977}'}], "request")
    grammars = build_specs(request) + build_specs(request)
    assert len(lark) == 1 and grammars[1].grammar is grammars[0].grammar


_LOGGED_COMPILE = """
import logging, sys
from anylogits import Regex, Vocabulary
from anylogits.core.logs import configure_logging
configure_logging()
configure_logging()  # once per process: no second handler
assert len(logging.getLogger("anylogits").handlers) == 1
vocab = Vocabulary((b"a", b"b", b"<eos>"), eos_token_ids=frozenset({2}))
for _ in range(3):
    Regex("a{2,5}").bind(vocab)
"""


def test_a_server_logs_each_compile_with_the_cache_counters() -> None:
    """``anylogits serve`` sets ANYLOGITS_LOG_LEVEL: a compiled grammar is logged once,
    with the compiled-grammar cache's counters; the same grammar again is a hit."""
    import subprocess
    import sys

    from test_support import child_environment

    run = subprocess.run(
        [sys.executable, "-c", _LOGGED_COMPILE],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_environment(ANYLOGITS_LOG_LEVEL="INFO"),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if "compiled a grammar" in line]
    assert len(lines) == 1, run.stderr
    assert "anylogits INFO [anylogits.processors.structured.engine]" in lines[0]
    assert "compiled grammars: 1 entries" in lines[0] and "1 misses" in lines[0], lines[0]


@pytest.fixture
def unfrozen_heap() -> Any:
    """This process's heap as the collector sees it, restored after a server's freeze."""
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("fresh_kernels")
def test_a_server_prepares_the_first_structured_request_s_tokenizer_and_checker(
    unfrozen_heap: None,
) -> None:
    from anylogits.processors.structured.guard import GUARD
    from anylogits.processors.structured.warm import prepare_structured_in_background

    vocab = Vocabulary(tokens=VOCAB.tokens, eos_token_ids=VOCAB.eos_token_ids)
    prepare_structured_in_background(vocab).join(timeout=120)
    assert not _bitmask._captures  # beside a first request, or another compile: not there
    thread = prepare_structured_in_background(vocab, apply_kernels=True)
    # The apply kernels, for one row and for several (``anylogits serve llama-cpp|mlx``),
    # before the call returns: a server takes no request beside their compile.
    bitmask = torch.tensor([[0b101, 1]], dtype=torch.int32)
    for rows in (1, 2):
        logits = torch.zeros(rows, 64)
        arguments = (logits, bitmask.expand(rows, -1).contiguous())
        made = _bitmask._captures[("_mask_by_bits", torch.float32)]
        assert any(capture.fits(arguments) for capture in made), rows
    thread.join(timeout=120)
    built = ENGINE._tokenizers.get(vocab)
    assert built is not None
    assert ENGINE.tokenizer(vocab) is built  # what the first request gets: no second build
    checker = GUARD._process
    assert checker is not None
    # Still there once the thread that started it has ended (Linux would kill it with
    # that thread).
    with pytest.raises(subprocess.TimeoutExpired):
        checker.wait(timeout=1)


def test_a_server_s_collector_skips_what_it_built_at_start(unfrozen_heap: None) -> None:
    """Once prepared, the server's objects so far are frozen: a full collection in a
    request walks only what requests allocated (~80 ms less on the tiny model's server)."""
    from anylogits.processors.structured.warm import prepare_structured_in_background

    assert gc.get_freeze_count() == 0
    built_at_start = [[index] for index in range(1000)]
    vocab = Vocabulary(tokens=VOCAB.tokens, eos_token_ids=VOCAB.eos_token_ids)
    prepare_structured_in_background(vocab).join(timeout=120)
    allocated_later = [1]
    assert gc.get_freeze_count() >= len(built_at_start)
    collected = {id(item) for item in gc.get_objects()}  # the frozen ones are not listed
    assert id(allocated_later) in collected
    assert not any(id(row) in collected for row in built_at_start)
