"""The two sides of :mod:`bench_schema_corpus`, timed: anylogits (``JSONSchema`` through
the transformers hook, or ``PersistentBatch``) and llguidance called directly, from a
schema to its first mask and along an instance's tokens (see that module's docstring).
``vocab`` is its ``_Vocab``: the tokenizers, the logits and the direct side's
matchers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch

# What a decoding step's forward pass does to the caches between two masks: a pass over
# this many bytes (SmolLM2-135M's float32 weights are 540 MB; 32 MB already evicts a
# 2-core machine's caches).
FORWARD_BYTES = 32 << 20
_FORWARD: list[torch.Tensor] = []
# Kubernetes schemas reach 240 KB: an operator serving them raises this limit.
REQUEST_GRAMMAR_CHARS = 4 << 20


def forward_pass() -> None:
    """Evict the caches as a model's forward would between two decoding steps."""
    if not _FORWARD:
        _FORWARD.append(torch.ones(FORWARD_BYTES // 4))
    _FORWARD[0].mul_(1.0)


def clear_compiled(vocab: Any) -> None:
    """Forget both sides' compiled grammars."""
    _clear_ours()
    vocab.templates.clear()


def _clear_ours() -> None:
    from anylogits.core.specs import BUILT_SPECS
    from anylogits.processors.structured import REQUEST_GRAMMARS, engine

    engine.COMPILED.clear()
    engine.VALIDATIONS.clear()
    REQUEST_GRAMMARS.clear()
    BUILT_SPECS.clear()


def first_mask_ours(vocab: Any, schema: dict) -> float:
    """Each side compiles afresh (its kept grammars forgotten); the compiled grammar is
    kept for the walks that follow, on both sides."""
    from anylogits import JSONSchema, for_transformers

    _clear_ours()
    ids = torch.zeros(1, 1, dtype=torch.long)
    logits = vocab.logits[1].clone()
    start = time.perf_counter()
    hook = for_transformers(JSONSchema(schema, lenient=True), tokenizer=vocab.hf)
    hook(ids, logits)
    return time.perf_counter() - start


def first_mask_direct(vocab: Any, schema: dict) -> float:
    import llguidance.torch

    vocab.templates.clear()
    logits = vocab.logits[1].clone()
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab.direct_tokenizer.vocab_size)
    start = time.perf_counter()
    matcher = vocab.matcher(schema)
    llguidance.torch.fill_next_token_bitmask(matcher, bitmask)
    llguidance.torch.apply_token_bitmask_inplace(logits, bitmask)
    elapsed = time.perf_counter() - start
    vocab.keep(schema, matcher)
    return elapsed


def prompt_mask_ours(vocab: Any, schema: dict) -> float:
    """The prompt's mask of a request whose grammar is compiled already: the hook's
    first call, the hook built (its spec parsed, its compiled grammar found) untimed."""
    from anylogits import JSONSchema, for_transformers

    hook = for_transformers(JSONSchema(schema, lenient=True), tokenizer=vocab.hf)
    ids = torch.zeros(1, 1, dtype=torch.long)
    logits = vocab.logits[1].clone()
    start = time.perf_counter()
    hook(ids, logits)
    return time.perf_counter() - start


def prompt_mask_direct(vocab: Any, schema: dict) -> float:
    """The same with llguidance: a copy of the kept matcher (found untimed), its fill
    and apply."""
    template = vocab.template(schema)
    return _copy_fill_apply(vocab, lambda: template)


def _copy_fill_apply(vocab: Any, find: Callable[[], Any]) -> float:
    """Seconds to find a kept matcher (``find``), copy it, fill its first mask and apply
    it to a row of logits."""
    import llguidance.torch

    logits = vocab.logits[1].clone()
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab.direct_tokenizer.vocab_size)
    start = time.perf_counter()
    matcher = find().deep_copy()
    llguidance.torch.fill_next_token_bitmask(matcher, bitmask)
    llguidance.torch.apply_token_bitmask_inplace(logits, bitmask)
    return time.perf_counter() - start


def request_mask_ours(vocab: Any, schema: dict) -> float:
    """A request whose schema the server has admitted before (a client sending its schema
    again), as ``anylogits serve`` runs it: its parsed body's specs admitted and built
    (``serving.admit``), then its prompt's mask. The specs travel as a client's
    ``vllm_xargs`` carries them (their JSON text, made untimed)."""
    from anylogits import JSONSchema, vllm_xargs
    from anylogits.core.limits import override
    from anylogits.serving import REQUEST_FIELD, admit

    with override(grammar_chars=REQUEST_GRAMMAR_CHARS, spec_bytes=REQUEST_GRAMMAR_CHARS):
        body = {REQUEST_FIELD: vllm_xargs(JSONSchema(schema, lenient=True))}
        admit(body, vocab.vocabulary, request="warm")  # admitted before
        ids = torch.zeros(1, 1, dtype=torch.long)
        logits = vocab.logits[1].clone()
        start = time.perf_counter()
        pipeline = admit(body, vocab.vocabulary, request="timed").pipeline
        assert pipeline is not None
        pipeline(logits, ids)
        return time.perf_counter() - start


def request_mask_direct(vocab: Any, schema: dict) -> float:
    """The same with llguidance: the schema's JSON text as the key of its kept matcher
    (a server of parsed bodies finds it so), a copy, its fill and apply."""
    vocab.template(schema)  # kept (compiled on its first use)
    return _copy_fill_apply(vocab, lambda: vocab.templates[json.dumps(schema)])


def walk_ours(
    vocab: Any,
    schema: dict,
    path: list[int],
    batch: int,
    in_place: bool = False,
    forward: bool = False,
) -> list[float]:
    """Seconds per hook call along ``path``, the prompt's call left out."""
    from anylogits import JSONSchema, for_transformers

    hook = for_transformers(JSONSchema(schema, lenient=True), tokenizer=vocab.hf, in_place=in_place)
    ids = torch.arange(batch, dtype=torch.long)[:, None]  # a distinct prompt per row
    times = []
    for index in range(len(path) + 1):
        if index:
            ids = torch.cat([ids, torch.full((batch, 1), path[index - 1])], 1)
        if forward:
            forward_pass()
        logits = vocab.logits[batch].clone()  # a forward's last write: the step's logits
        start = time.perf_counter()
        masked = hook(ids, logits)
        elapsed = time.perf_counter() - start
        if index:
            times.append(elapsed)
        if index < len(path) and not torch.isfinite(masked[:, path[index]]).all():
            raise RuntimeError(f"token {index} of the path was refused: not comparable")
    return times


def walk_direct(
    vocab: Any, schema: dict, path: list[int], batch: int, forward: bool = False, pool: bool = True
) -> list[float]:
    """Seconds per consume + fill + apply along ``path``, the first mask left out: each
    step consumes the token the last one allowed, as ours does (the same work in the
    same step on both sides). Several rows are filled by llguidance's pool, or, without
    ``pool``, one after another in this thread."""
    import llguidance
    import llguidance.torch

    template = vocab.template(schema)
    matchers = [template.deep_copy() for _ in range(batch)]
    rows = [(matcher, row) for row, matcher in enumerate(matchers)]
    executor = llguidance.LLExecutor()
    bitmask = llguidance.torch.allocate_token_bitmask(batch, vocab.direct_tokenizer.vocab_size)
    times = []
    for index in range(len(path) + 1):
        if forward:
            forward_pass()
        logits = vocab.logits[batch].clone()  # a forward's last write: the step's logits
        start = time.perf_counter()
        if index:
            for matcher in matchers:
                matcher.consume_token(path[index - 1])
        if batch == 1:
            llguidance.torch.fill_next_token_bitmask(matchers[0], bitmask)
        elif pool:
            llguidance.torch.fill_next_token_bitmask_par(executor, rows, bitmask)
        else:
            for matcher, row in rows:
                llguidance.torch.fill_next_token_bitmask(matcher, bitmask, row)
        llguidance.torch.apply_token_bitmask_inplace(logits, bitmask)
        elapsed = time.perf_counter() - start
        if index:
            times.append(elapsed)
    if any(matcher.is_error() for matcher in matchers):
        raise RuntimeError(f"llguidance refused the path: {matchers[0].get_error()}")
    return times


def requests_ours(vocab: Any, walks: list[tuple[dict, list[int]]]) -> list[float]:
    """Seconds per step of ``PersistentBatch`` (what vLLM's and transformers' continuous
    batching adapters call) holding one request per walk, each with its own schema: the
    per-request path, the prompt's call left out."""
    from anylogits import JSONSchema, to_specs
    from anylogits.core.limits import override
    from anylogits.core.persistent_batch import PersistentBatch
    from anylogits.core.slot_requests import PushedTokens

    batch = PersistentBatch(vocab.vocabulary)
    feeds = [PushedTokens() for _ in walks]
    # Kubernetes schemas reach 240 KB: an operator serving them raises this limit.
    with override(grammar_chars=REQUEST_GRAMMAR_CHARS):
        for slot, ((schema, _), feed) in enumerate(zip(walks, feeds, strict=True)):
            specs = to_specs([JSONSchema(schema, lenient=True)])
            if not batch.put(slot, specs, prompt_ids=[slot], output=feed):
                raise RuntimeError("a request has no processors")
    steps = min(len(path) for _, path in walks)
    logits = vocab.logits[len(walks)]
    times = []
    for index in range(steps + 1):
        if index:
            for feed, (_, path) in zip(feeds, walks, strict=True):
                feed.pending = [path[index - 1]]
        rows = logits.clone()
        start = time.perf_counter()
        batch.process(rows)
        elapsed = time.perf_counter() - start
        if index:
            times.append(elapsed)
        if index < steps:
            allowed = rows[torch.arange(len(walks)), [path[index] for _, path in walks]]
            if not torch.isfinite(allowed).all():
                raise RuntimeError(f"token {index} of a path was refused: not comparable")
    return times


def requests_direct(vocab: Any, walks: list[tuple[dict, list[int]]]) -> list[float]:
    """llguidance's batch path for the same requests: ``consume_token`` per row (the
    token of the last step), every matcher filled at once
    (``fill_next_token_bitmask_par``), one apply."""
    import llguidance
    import llguidance.torch

    matchers = [vocab.template(schema).deep_copy() for schema, _ in walks]
    rows = [(matcher, row) for row, matcher in enumerate(matchers)]
    executor = llguidance.LLExecutor()
    bitmask = llguidance.torch.allocate_token_bitmask(len(walks), vocab.direct_tokenizer.vocab_size)
    steps = min(len(path) for _, path in walks)
    times = []
    for index in range(steps + 1):
        logits = vocab.logits[len(walks)].clone()
        start = time.perf_counter()
        if index:
            for matcher, (_, path) in zip(matchers, walks, strict=True):
                matcher.consume_token(path[index - 1])
        llguidance.torch.fill_next_token_bitmask_par(executor, rows, bitmask)
        llguidance.torch.apply_token_bitmask_inplace(logits, bitmask)
        elapsed = time.perf_counter() - start
        if index:
            times.append(elapsed)
    return times


def requests_mlx_ours(
    vocab: Any, walks: list[tuple[dict, list[int]]], batched: bool = True
) -> list[float]:
    """Seconds per step of the same requests on mlx-lm's ``GenerationBatch``, from the
    model's ``(B, V)`` logits to the processed ones evaluated: the step's processor part,
    as ``anylogits serve mlx`` runs it (``batched``: :class:`BatchedHooks`, one call for
    the batch) or as mlx-lm's own loop runs each row's hook (row by row, then
    concatenated). Each row keeps mlx-lm's token buffer as the step does."""
    import types

    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import TokenBuffer

    from anylogits import JSONSchema, for_mlx
    from anylogits.adapters.mlx.batch import BatchedHooks
    from anylogits.core.limits import override

    with override(grammar_chars=REQUEST_GRAMMAR_CHARS):
        processors = [
            tuple(for_mlx(JSONSchema(schema, lenient=True), tokenizer=vocab.hf))
            for schema, _ in walks
        ]
    generation = types.SimpleNamespace(
        logits_processors=processors, _token_context=[TokenBuffer() for _ in walks]
    )
    hooks = BatchedHooks(vocab.vocabulary)
    logits = mx.array(vocab.logits[len(walks)].numpy())
    steps = min(len(path) for _, path in walks)
    times = []
    for index in range(steps + 1):
        # Each row's newest token: its prompt (a distinct one per row), then its path's.
        newest = [path[index - 1] if index else row for row, (_, path) in enumerate(walks)]
        inputs = mx.array(newest)
        mx.eval(inputs)
        start = time.perf_counter()
        if batched:
            processed, _ = hooks.process(generation, logits, inputs)
        else:
            rows = []
            for row, (hook,) in enumerate(processors):
                context = generation._token_context[row].update_and_fetch(inputs[row : row + 1])
                rows.append(hook(context, logits[row : row + 1]))
            processed = mx.concatenate(rows, axis=0)
        mx.eval(processed)
        elapsed = time.perf_counter() - start
        if index:
            times.append(elapsed)
        if index < steps:
            allowed = np.array(processed)[np.arange(len(walks)), [p[index] for _, p in walks]]
            if not np.isfinite(allowed).all():
                raise RuntimeError(f"token {index} of a path was refused: not comparable")
    return times


def requests_mlx_direct(vocab: Any, walks: list[tuple[dict, list[int]]]) -> list[float]:
    """llguidance for the same requests on MLX logits: a copy of the model's logits that
    torch can edit (MLX arrays are immutable; llguidance's own MLX apply is a Metal
    kernel), ``consume_token`` per row, the rows filled one after another in this thread
    (its faster path where its pool has one thread, as anylogits fills them there), one
    apply through DLPack."""
    import llguidance
    import llguidance.torch
    import mlx.core as mx

    from anylogits.adapters.mlx import _copy

    matchers = [vocab.template(schema).deep_copy() for schema, _ in walks]
    bitmask = llguidance.torch.allocate_token_bitmask(len(walks), vocab.direct_tokenizer.vocab_size)
    logits = mx.array(vocab.logits[len(walks)].numpy())
    steps = min(len(path) for _, path in walks)
    times = []
    for index in range(steps + 1):
        start = time.perf_counter()
        owned = _copy(logits)
        mx.eval(owned)
        scores = torch.from_dlpack(owned)
        if index:
            for matcher, (_, path) in zip(matchers, walks, strict=True):
                matcher.consume_token(path[index - 1])
        for row, matcher in enumerate(matchers):
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, row)
        llguidance.torch.apply_token_bitmask_inplace(scores, bitmask)
        mx.eval(owned)
        elapsed = time.perf_counter() - start
        if index:
            times.append(elapsed)
    return times
