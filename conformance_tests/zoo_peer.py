"""NVIDIA logits-processor-zoo's transformers processors as oracles of the phrase
processors (``test_oracles_forcing``, ``_length``, ``_bias``), and the greedy decoding loop
both run in.

The zoo is a peer, not a dependency: the ``zoo`` fixture imports it when installed and
otherwise unpacks a wheel fetched with ``pip download logits-processor-zoo --no-deps -d
/tmp/zoo`` (or ``$ANYLOGITS_ZOO_DIR``); without either, these tests skip. CI needs it in
the ``peers`` group.

Both sides get the tiny model's real tokenizer (llama-bpe, 128,256 tokens): ours through
its :class:`~anylogits.Vocabulary`, the zoo as the tokenizer object. Each example runs a
greedy decoding loop the way transformers calls processors: at every step the same
``(B, L)`` history and a copy of the same logits go to ``Pipeline([ours])`` and to the zoo
processor, and the next token of each row is the argmax of the zoo's output. Logits are
random (a hypothesis-drawn seed; some draws round them to 0.5 steps for exact ties, some
set a random part of each row, never its maximum, to ``-inf`` as a truncation would),
with spikes on the tokens a processor reacts to (EOS, a trigger, the prompt's tokens) so
that it acts. Prompts have equal lengths: the zoo reads the left-padded first call as
the prompt, which differs from ours on padded batches (documented in the module).

Checks:

* ``strict=False`` and the processors that only add (``GenLength``, ``CiteFromPrompt``):
  bit-identical (``assert_close`` with zero tolerances and ``equal_nan``: where the zoo
  forces a token that is already ``-inf``, its arithmetic gives ``-inf + inf = nan``, and
  ours, being the same arithmetic, must give the same ``nan``).
* ``strict=True``: derived from the zoo's output on the same input: in each row the zoo
  changed, the tokens it left above the row minimum keep their input logits and every
  other token is ``-inf``; rows it left alone are unchanged.
* Every example asserts that the zoo changed some logits, so a no-op cannot pass.
"""

from __future__ import annotations

import importlib
import os
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from anylogits import Pipeline
from anylogits.core.processor import LogitsProcessor
from anylogits.core.vocab import Vocabulary, hf_vocabulary
from conformance_tests.comparisons import DTYPES, NEG_INF, oracle_settings

SETTINGS = oracle_settings(12)


PHRASES = (" Thanks for asking!", "\n\nReferences:", " Next", "Sure, here")


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """``logits_processor_zoo.transformers``, installed or unpacked from a downloaded wheel."""
    try:
        return importlib.import_module("logits_processor_zoo.transformers")
    except ImportError:
        pass
    folder = Path(os.environ.get("ANYLOGITS_ZOO_DIR", "/tmp/zoo"))
    wheels = sorted(folder.glob("logits_processor_zoo-*.whl"))
    if not wheels:
        reason = (
            "logits-processor-zoo is not installed and no wheel is in "
            f"{folder} (pip download logits-processor-zoo --no-deps -d {folder})"
        )
        # CI installs it (the peers group): an oracle silently skipped there proves nothing.
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    target = tmp_path_factory.mktemp("logits_processor_zoo")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extractall(target)
    sys.path.insert(0, str(target))
    return importlib.import_module("logits_processor_zoo.transformers")


class Peer:
    """The zoo and the tiny model's tokenizer, with our vocabulary of it."""

    def __init__(self, zoo: ModuleType, tokenizer: Any, vocab: Vocabulary) -> None:
        self.zoo, self.tokenizer, self.vocab = zoo, tokenizer, vocab

    def __repr__(self) -> str:  # hypothesis prints it with every failing example
        return "Peer(logits_processor_zoo.transformers, tiny llama-bpe tokenizer)"

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="session")
def peer(zoo: ModuleType, hf_tokenizer: Any) -> Peer:
    return Peer(zoo, hf_tokenizer, hf_vocabulary(hf_tokenizer))


class Logits:
    """Successive ``(B, V)`` logits of one drawn seed, kind, scale and dtype."""

    def __init__(self, data: st.DataObject, batch: int, width: int) -> None:
        self.generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32 - 1)))
        self.kind = data.draw(st.sampled_from(("normal", "ties", "neg_inf")))
        self.scale = data.draw(st.sampled_from((0.5, 2.0, 8.0)))
        self.dtype = data.draw(st.sampled_from(DTYPES))
        self.batch, self.width = batch, width

    def next(self, spikes: dict[int, list[int]], zeros: list[int] | None = None) -> torch.Tensor:
        """Random logits; ``spikes[row]`` tokens are pushed just above the row's maximum;
        ``zeros`` tokens are 0 unless spiked (so that any boost shows, in any dtype)."""
        g, shape = self.generator, (self.batch, self.width)
        wide = torch.float64 if self.dtype == torch.float64 else torch.float32
        x = torch.randn(shape, generator=g, dtype=wide) * self.scale
        if self.kind == "ties":
            x = (x * 2).round() / 2
        if self.kind == "neg_inf":  # most of each row, never its maximum
            dropped = torch.rand(shape, generator=g) < torch.rand((self.batch, 1), generator=g)
            dropped.scatter_(1, x.argmax(1, keepdim=True), False)
            x.masked_fill_(dropped, NEG_INF)
        if zeros:
            x[:, zeros] = 0.0
        for row, tokens in spikes.items():
            x[row, tokens] = x[row].max() + 1.0 + torch.arange(len(tokens), dtype=x.dtype)
        return x.to(self.dtype)

    def spikes(self, tokens: list[int], rate: float) -> dict[int, list[int]]:
        """For each row, with probability ``rate``, one of ``tokens`` to spike."""
        draws = torch.rand(self.batch, generator=self.generator).tolist()
        picks = torch.randint(0, len(tokens), (self.batch,), generator=self.generator).tolist()
        return {
            row: [tokens[pick]]
            for row, (d, pick) in enumerate(zip(draws, picks, strict=True))
            if d < rate
        }


Check = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


def identical(logits: torch.Tensor, ours: torch.Tensor, oracle: torch.Tensor) -> None:
    if not torch.equal(ours, oracle):
        # Zero tolerances: only nan == nan is added to torch.equal (see the module notes).
        torch.testing.assert_close(ours, oracle, rtol=0, atol=0, equal_nan=True)


def strict_from_oracle(logits: torch.Tensor, ours: torch.Tensor, oracle: torch.Tensor) -> None:
    """The strict result the zoo's (soft) output implies, derived from that output alone.

    The zoo sets every token it does not force to the row's input minimum and raises the
    forced ones above it (to ``inf`` or ``nan`` when one of them was ``-inf``), so the
    forced tokens are those that no longer hold the input minimum.
    """
    unchanged = ((oracle == logits) | (oracle.isnan() & logits.isnan())).all(1, keepdim=True)
    raised = oracle != logits.amin(1, keepdim=True)
    expected = torch.where(unchanged | raised, logits, torch.tensor(NEG_INF, dtype=logits.dtype))
    identical(logits, ours, expected)


def greedy_loop(
    ours: LogitsProcessor,
    oracle: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    peer: Peer,
    prompts: torch.Tensor,
    steps: int,
    next_logits: Callable[[int, torch.Tensor], torch.Tensor],
    check: Check,
) -> int:
    """Run both for ``steps`` greedy steps; returns how many steps the oracle changed."""
    pipeline = Pipeline([ours], peer.vocab)
    ids, changed = prompts, 0
    for step in range(steps):
        logits = next_logits(step, ids)
        theirs = oracle(ids, logits.clone())
        assert theirs.dtype == logits.dtype
        check(logits, pipeline(logits.clone(), ids), theirs)
        changed += not torch.equal(theirs, logits)
        ids = torch.cat([ids, theirs.argmax(1, keepdim=True)], 1)
    return changed


def draw_prompts(
    data: st.DataObject, logits: Logits, pool: list[int] | None = None
) -> torch.Tensor:
    length = data.draw(st.integers(1, 12))
    if pool is None:
        return torch.randint(0, logits.width, (logits.batch, length), generator=logits.generator)
    index = torch.randint(0, len(pool), (logits.batch, length), generator=logits.generator)
    return torch.tensor(pool)[index]


def draw_logits_and_prompts(data: st.DataObject, peer: Peer) -> tuple[Logits, torch.Tensor]:
    """Logits of 1 to 3 rows at the tokenizer's width, and random prompts for those rows."""
    logits = Logits(data, data.draw(st.integers(1, 3)), len(peer.tokenizer))
    return logits, draw_prompts(data, logits)


def zoo_oracle(processor: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Makes a test ``(peer, data)`` a hypothesis-drawn comparison of ``processor`` with
    the zoo: transformers only, with :data:`SETTINGS`, recorded in the support matrix."""

    def mark(test: Callable[..., None]) -> Callable[..., None]:
        drawn = SETTINGS(given(data=st.data())(test))
        supported = pytest.mark.support("oracle", processor=processor, backend="transformers")
        return pytest.mark.only_backend("transformers")(supported(drawn))

    return mark
