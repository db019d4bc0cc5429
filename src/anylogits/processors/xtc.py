"""XTC, "exclude top choices": sometimes remove the likeliest tokens, keeping one viable.

The coin flip of each step is a pure function of the seed and the sequence's whole token
history (prompt included), carried as explicit state. So a sequence gets the same
decisions whatever row it occupies, whatever else is in the batch, and when it is
replayed; different sequences get independent-looking decisions.
"""

from __future__ import annotations

from typing import Any

import torch

from anylogits.core.batch import Batch
from anylogits.core.processor import StatefulLogitsProcessor
from anylogits.core.transfer import host_tensor_to
from anylogits.core.vocab import Vocabulary
from anylogits.processors._checks import ids_within, int_at_least, token_id_list
from anylogits.processors._checks import probability as checked_probability
from anylogits.processors._ops import keep_only

_MASK64 = (1 << 64) - 1
# Two polynomial hashes modulo the prime 2**31 - 1: a prompt hashes in a few vectorized
# int64 ops (products stay below 2**62), one more token costs a few Python int ops.
_PRIME = (1 << 31) - 1
_BASES = (0x2545F491 % _PRIME, 0x3C6EF372 % _PRIME)
_DRAW_KEY = 0xD1B54A32D192ED03


def _mix(value: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit ints in which every input bit
    affects every output bit."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _extend(history_hash: int, token_id: int) -> int:
    first, second = history_hash >> 31, history_hash & _PRIME
    first = (first * _BASES[0] + token_id + 1) % _PRIME
    second = (second * _BASES[1] + token_id + 1) % _PRIME
    return first << 31 | second


def _draw(history_hash: int) -> float:
    """A uniform float in [0, 1) with 53 bits, from the hash's 62."""
    return (_mix(history_hash ^ _DRAW_KEY) >> 11) * 2.0**-53


class XTC(StatefulLogitsProcessor[int]):
    """Exclude top choices: with probability ``probability`` per step, remove every token
    whose probability reaches ``threshold`` except the least likely of them.

    Nothing is removed when fewer than two tokens reach ``threshold``, so at least one
    viable token always remains. Tokens tied with the least likely one that reaches the
    threshold are all kept (as mlx-lm does; llama.cpp keeps one of them). Probabilities
    are a float32 softmax of the row (float64 for float64 logits).

    The decision of each step is drawn from a hash of ``seed`` and the sequence's whole
    token history, so it depends only on them: not on the row, the batch or the
    backend. Identical histories get identical decisions (e.g. several samples of one
    prompt share their first decision); give requests different seeds to decorrelate
    them.

    Oracles: llama.cpp's ``llama_sampler_init_xtc`` and mlx-lm's ``apply_xtc`` with
    ``probability=1.0`` (identical kept sets away from ties and the ``>=`` / ``>``
    boundary: llama.cpp and this class remove tokens with ``p >= threshold``, mlx-lm
    those with ``p > threshold``). ``protected_token_ids`` behaves like mlx-lm's
    ``xtc_special_tokens`` (never removed, the others still are); llama.cpp protects
    nothing; text-generation-webui skips the whole step when a newline or EOS would be
    removed. Their coins are a generator (llama.cpp: one per sampler, mlx-lm and
    text-generation-webui: one per call for the whole batch), not a function of the
    history.

    Args:
        threshold: probability a token must reach to be removable, in (0, 0.5]; above
            0.5 fewer than two tokens can reach it.
        probability: chance of acting at each step, in [0, 1].
        seed: seed of the decisions, an int in [0, 2**64).
        protected_token_ids: ids never removed (mlx-lm passes the newline and EOS ids).

    Example:
        >>> import torch
        >>> from anylogits import Pipeline
        >>> from anylogits.processors.xtc import XTC
        >>> logits = torch.tensor([[0.4, 0.35, 0.2, 0.05]]).log()
        >>> Pipeline([XTC(0.1, 1.0)])(logits, torch.tensor([[7]])).isinf().tolist()
        [[True, True, False, False]]
    """

    spec_name = "xtc"

    def __init__(
        self,
        threshold: float,
        probability: float,
        seed: int = 0,
        protected_token_ids: list[int] | None = None,
    ) -> None:
        self.threshold = _threshold(threshold)
        self.probability = checked_probability("probability", probability, allow_zero=True)
        self.seed = int_at_least("seed", seed, 0, maximum=2**64)
        if self.seed > _MASK64:
            raise ValueError(f"seed must be < 2**64, got {seed!r}")
        self.protected_token_ids = token_id_list("protected_token_ids", protected_token_ids or [])
        seed_hash = _mix(self.seed)
        first, second = (seed_hash >> 33) % _PRIME, (seed_hash & _PRIME) % _PRIME
        self._start = first << 31 | second  # the hash of the empty history
        self._power_table = torch.ones(2, 1, dtype=torch.int64)
        self._protected: dict[tuple[torch.device, int], torch.Tensor] = {}

    def config(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "probability": self.probability,
            "seed": self.seed,
            "protected_token_ids": list(self.protected_token_ids),
        }

    def bind(self, vocab: Vocabulary | None) -> None:
        super().bind(vocab)
        if vocab is not None:
            ids_within("protected_token_ids", self.protected_token_ids, vocab.size, "vocabulary")

    def init_state(self, prompt_ids: torch.Tensor) -> int:
        # The same value as extending the seed's hash token by token, so a history
        # hashes the same however much of it the tracker first saw as the prompt.
        ids = prompt_ids.to(device="cpu", dtype=torch.int64)
        length = ids.shape[0]
        if length == 0:
            return self._start
        weights = self._powers(length)[:, :length].flip(-1)  # base**(length - 1 - i)
        sums = ((ids + 1) % _PRIME * weights % _PRIME).sum(dim=-1).tolist()
        first, second = (
            (start * pow(base, length, _PRIME) + total) % _PRIME
            for start, base, total in zip(
                (self._start >> 31, self._start & _PRIME), _BASES, sums, strict=True
            )
        )
        return first << 31 | second

    def _powers(self, length: int) -> torch.Tensor:
        """``(2, >= length)`` int64: ``base**k % prime`` of each base, grown by doubling."""
        table = self._power_table
        while table.shape[1] < length:
            width = table.shape[1]
            factors = torch.tensor([[pow(base, width, _PRIME)] for base in _BASES])
            table = torch.cat([table, table * factors % _PRIME], dim=1)
        self._power_table = table
        return table

    def advance(self, state: int, token_id: int) -> int:
        return _extend(state, token_id)

    def applies(self, state: int) -> bool:
        """Whether XTC acts on the sequence whose state is ``state``."""
        return _draw(state) < self.probability

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        if self.probability == 0.0:
            return logits
        if self.probability == 1.0:  # every draw is below 1: skip drawing
            return keep_only(logits, ~self._removed(logits))
        acting = [row for row, state in enumerate(batch.states(self)) if self.applies(state)]
        if not acting:
            return logits
        if len(acting) == logits.shape[0]:
            return keep_only(logits, ~self._removed(logits))
        rows = host_tensor_to(acting, logits.device)
        selected = logits.index_select(0, rows)
        selected = keep_only(selected, ~self._removed(selected))
        return logits.index_copy_(0, rows, selected)

    def _removed(self, logits: torch.Tensor) -> torch.Tensor:
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        probs = torch.softmax(logits, dim=-1, dtype=dtype)
        reaching = probs >= self.threshold
        least = torch.where(reaching, probs, torch.inf).amin(dim=-1, keepdim=True)
        removed = reaching.logical_and_(probs > least)
        if self.protected_token_ids:
            removed.index_fill_(1, self._protected_columns(logits), False)
        return removed

    def _protected_columns(self, logits: torch.Tensor) -> torch.Tensor:
        key = (logits.device, logits.shape[-1])
        columns = self._protected.get(key)
        if columns is None:
            ids_within("protected_token_ids", self.protected_token_ids, key[1], "logits row")
            columns = host_tensor_to(self.protected_token_ids, logits.device)
            self._protected[key] = columns
        return columns


def _threshold(value: Any) -> float:
    threshold = checked_probability("threshold", value)
    if threshold > 0.5:
        raise ValueError(
            f"threshold must lie in (0, 0.5], got {value!r}: above 0.5 fewer than two "
            "tokens can reach it, so XTC would never act"
        )
    return threshold
