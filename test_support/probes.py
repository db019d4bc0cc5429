"""Probe processors that make sequence-tracking mistakes visible.

:class:`GeneratedHashBias` keeps a running hash of the tokens generated after the prompt
as explicit state and boosts one token chosen by that hash. :class:`GeneratedHashBiasRecompute`
computes the same boost from the tokens alone, told the prompt length. Under any
decoding mode the two must give the same tokens. A tracker that keys state by row (beam
reordering), forgets rejected draft tokens, or restarts a sequence it lost track of
(its state would restart from the prompt) makes them diverge within a few steps.

:class:`ReverseRanks` makes a truncation visible to greedy decoding.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.processor import LogitsProcessor, StatefulLogitsProcessor
from anylogits.core.transfer import host_tensor_to, to_device

_MULTIPLIER = 31
_MODULUS = 1_000_003


def generated_hash(tokens: Iterable[int]) -> int:
    """The state :class:`GeneratedHashBias` holds after generating ``tokens``."""
    state = 0
    for token_id in tokens:
        state = (state * _MULTIPLIER + token_id + 1) % _MODULUS
    return state


def _boost(logits: torch.Tensor, hashes: torch.Tensor, bias: float) -> torch.Tensor:
    targets = (to_device(hashes, logits.device) % logits.shape[-1])[:, None]
    boost = torch.full_like(targets, bias, dtype=logits.dtype)
    return logits.scatter_add_(1, targets, boost)


class GeneratedHashBias(StatefulLogitsProcessor[int]):
    """Add ``bias`` to the token ``hash(generated tokens) % V``; the hash is state.

    Args:
        bias: added to the chosen token's logit.
    """

    spec_name = "testing.generated_hash_bias"

    def __init__(self, bias: float = 8.0) -> None:
        self.bias = float(bias)
        self.init_calls = 0
        self.advance_calls = 0

    def config(self) -> dict[str, Any]:
        return {"bias": self.bias}

    def init_state(self, prompt_ids: torch.Tensor) -> int:
        self.init_calls += 1
        return generated_hash([])

    def advance(self, state: int, token_id: int) -> int:
        self.advance_calls += 1
        return (state * _MULTIPLIER + token_id + 1) % _MODULUS

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        hashes = host_tensor_to(list(batch.states(self)), logits.device, torch.int64)
        return _boost(logits, hashes, self.bias)


class GeneratedHashBiasRecompute(LogitsProcessor):
    """The stateless twin of :class:`GeneratedHashBias`, for rows of equal width.

    Args:
        prompt_length: columns of the ``(B, L)`` history that are prompt (transformers
            passes every row with the same, left-padded, prompt width).
        bias: added to the chosen token's logit.
    """

    spec_name = "testing.generated_hash_bias_recompute"

    def __init__(self, prompt_length: int, bias: float = 8.0) -> None:
        self.prompt_length = int(prompt_length)
        self.bias = float(bias)

    def config(self) -> dict[str, Any]:
        return {"prompt_length": self.prompt_length, "bias": self.bias}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        ids = to_device(batch.token_ids, logits.device).to(torch.int64)
        hashes = torch.zeros(ids.shape[0], dtype=torch.int64, device=ids.device)
        for column in range(self.prompt_length, ids.shape[1]):
            hashes = (hashes * _MULTIPLIER + ids[:, column] + 1) % _MODULUS
        return _boost(logits, hashes, self.bias)


class ReverseRanks(LogitsProcessor):
    """Negate every finite logit, so greedy decoding takes the *least* likely token that
    earlier processors kept (``-inf`` stays ``-inf``).

    Greedy decoding never shows a truncation (the top token always survives it); after
    this probe it shows exactly where the truncation cut, on every engine alike.
    """

    spec_name = "testing.reverse_ranks"

    def config(self) -> dict[str, Any]:
        return {}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return torch.where(torch.isfinite(logits), -logits, logits)


class RaiseAfter(LogitsProcessor):
    """Raise ``RuntimeError`` once a row has generated ``tokens`` tokens: a processor that
    fails inside an engine, to show that the failure ends its own request only.

    Args:
        tokens: generated tokens after which every call raises.
    """

    spec_name = "testing.raise_after"
    needs_sequences = True

    def __init__(self, tokens: int = 2) -> None:
        self.tokens = int(tokens)

    def config(self) -> dict[str, Any]:
        return {"tokens": self.tokens}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if bool((batch.generated_lengths >= self.tokens).any()):
            raise RuntimeError(f"testing.raise_after: {self.tokens} tokens were generated")
        return logits


class CrashProcess(LogitsProcessor):
    """Kill the engine's process with SIGSEGV at its first call, as native code faulting
    inside a step does (llama.cpp's AMX matrix product on some CPUs): shows what a server
    says when its engine dies.

    Args:
        signal_number: the signal the process sends itself (SIGSEGV by default).
    """

    spec_name = "testing.crash_process"

    def __init__(self, signal_number: int = int(signal.SIGSEGV)) -> None:
        self.signal_number = int(signal_number)

    def config(self) -> dict[str, Any]:
        return {"signal_number": self.signal_number}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        os.kill(os.getpid(), self.signal_number)
        return logits
