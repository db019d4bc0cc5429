"""Toy vocabularies (one with a longest-match tokenizer) and naive readings shared by
``test_bans``, ``test_bias``, ``test_length`` and ``test_pipeline`` (``right_aligned`` by
the penalty and DRY tests too)."""

from __future__ import annotations

import json
import math

import torch

from anylogits import Pipeline, Vocabulary, from_spec

INF = math.inf


TOKENS = (b"a", b"b", b"ab", b" ", b"</s>", b"\xc3", b"\xa9", b"c!")


def greedy_encode(text: str) -> list[int]:
    """Longest-match tokenizer over TOKENS, enough to resolve strings in tests."""
    data, ids = text.encode("utf-8"), []
    while data:
        token_id = max(
            (i for i, token in enumerate(TOKENS) if data.startswith(token)),
            key=lambda i: len(TOKENS[i]),
        )
        ids.append(token_id)
        data = data[len(TOKENS[token_id]) :]
    return ids


VOCAB = Vocabulary(tokens=TOKENS, eos_token_ids=frozenset({4}), encode=greedy_encode)


BYTES_ONLY_VOCAB = Vocabulary(tokens=TOKENS, eos_token_ids=frozenset({4}))

# "a" to "e", EOS "e": ids past 4 are outside it, logits wider than 5 are padded.
FIVE_LETTERS = Vocabulary(
    tokens=tuple(bytes([97 + i]) for i in range(5)), eos_token_ids=frozenset({4})
)


def naive_sequence_bias(
    logits: torch.Tensor, rows: list[list[int]], biases: list[tuple[list[int], float]]
) -> torch.Tensor:
    """Each row's real tokens, each entry checked by slicing, biases added one by one."""
    out = logits.clone()
    for b, tokens in enumerate(rows):
        for sequence, bias in biases:
            prefix = sequence[:-1]
            if not prefix or (len(tokens) >= len(prefix) and tokens[-len(prefix) :] == prefix):
                out[b, sequence[-1]] += bias
    return out


def right_aligned(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, lengths)``: ragged rows right-aligned, padded on the left with ``pad``."""
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows], dtype=torch.int64)
    return ids, torch.tensor([len(row) for row in rows])


def forced_rows(out: torch.Tensor, eos: int = 4) -> list[bool]:
    """Which rows allow EOS only (EOS logit 0, every other logit -inf)."""
    others = torch.cat([out[:, :eos], out[:, eos + 1 :]], 1)
    return [bool(o.isneginf().all()) and out[b, eos].item() == 0 for b, o in enumerate(others)]


def naive_stopped(generated: list[int], stops: list[str]) -> bool:
    text = b"".join(TOKENS[t] for t in generated)
    return any(stop.encode() in text for stop in stops)


def run_stop_strings(pipeline: Pipeline, prompts: list[list[int]], generated: list[list[int]]):
    """Call the pipeline as generation would; the forced flags after each call."""
    flags = []
    for step in range(len(generated[0]) + 1):
        ids = torch.tensor([p + g[:step] for p, g in zip(prompts, generated, strict=True)])
        flags.append(forced_rows(pipeline(torch.randn(len(prompts), 8), ids)))
    return flags


def assert_round_trips_and_behaves_the_same(processor) -> None:
    """``processor``'s spec, through JSON, builds one that processes as it does (and the
    example changes the logits)."""
    spec = processor.to_spec()
    rebuilt = from_spec(json.loads(json.dumps(spec)))
    assert type(rebuilt) is type(processor) and rebuilt.to_spec() == spec
    generator = torch.Generator().manual_seed(0)
    pipelines = [Pipeline([processor], VOCAB), Pipeline([rebuilt], VOCAB)]
    ids = torch.tensor([[0, 1], [2, 0]])
    changed = False
    for _ in range(5):
        logits = torch.randn(2, 8, generator=generator)
        outs = [pipeline(logits.clone(), ids) for pipeline in pipelines]
        assert torch.equal(outs[0], outs[1])
        changed |= not torch.equal(outs[0], logits)
        ids = torch.cat([ids, torch.tensor([[2], [1]])], 1)  # row 0 generates "ab", row 1 "b"
    assert changed, "the example never changed the logits"
