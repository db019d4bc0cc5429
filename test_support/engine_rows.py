"""The catalogue's cases and the rows they run on, importable anywhere.

The same definitions as ``tests/test_host_sync.py``'s (the decode-step suites share
them: ``tests/test_cuda.py`` runs them on a real GPU), without building any processor
at import: a machine without llguidance (a GPU box) imports them too, where building the
structured specs would fail. ``tests/test_gpu_session.py`` checks that they agree with
``test_host_sync``'s.
"""

from __future__ import annotations

from typing import Any

from anylogits import Vocabulary
from test_support.catalogue import PROCESSOR_SPECS, VOCABULARY_SPECS

# A byte-level vocabulary with a few merges (DRY finds breakers across tokens), filler
# tokens up to 4,096 (wide enough for the truncations' top-k chunks to matter), an EOS,
# and logits padded wider than the vocabulary.
_MERGES = (b"12", b" 1", b"ab", b" Sure", b"\n\n", b"x\n")
_BYTES_AND_MERGES = (*(bytes([b]) for b in range(256)), *_MERGES)
_FILLER = tuple(f"<{i}>".encode() for i in range(4095 - len(_BYTES_AND_MERGES)))
VOCAB = Vocabulary(
    tokens=(*_BYTES_AND_MERGES, *_FILLER, b"</s>"),
    eos_token_ids=frozenset({4095}),
    special_token_ids=frozenset({4095}),
    encode=lambda text: list(text.encode("utf-8")),  # byte by byte: merges never apply
)
WIDTH = VOCAB.size + 8

# Ragged prompts with repeats (DRY, NoRepeatNGram and the penalties find work).
PROMPTS = ([1, 2, 3, 1, 2], [48, 49, 50, 5, 48, 49, 50, 51, 10, 48, 49], [3, 4, 3])

# The spec types that need llguidance.
STRUCTURED = frozenset({"json_schema", "regex", "choice", "grammar"})


def _cases() -> dict[str, dict[str, Any]]:
    cases = dict(PROCESSOR_SPECS)
    for name, spec in VOCABULARY_SPECS.items():
        cases[f"{name} (text)" if name in cases else name] = spec
    # Other branches of catalogue processors than their catalogue configuration takes.
    cases["watermark (lefthash)"] = {"type": "watermark", "seeding_scheme": "lefthash"}
    cases["force_sequence (zoo)"] = {"type": "force_sequence", "phrase": [3, 5], "strict": False}
    cases["dry (multi-token breakers)"] = {
        "type": "dry",
        "multiplier": 0.8,
        "allowed_length": 1,
        "sequence_breakers": ["\n\n###", "x\n1"],
    }
    cases["trigger_phrase (replacing)"] = {
        "type": "trigger_phrase",
        "trigger": [7],
        "phrase": [4, 6],
    }
    return cases


CASES = _cases()

# A second configuration of each stateless case whose class stacks rows with different
# parameters (LogitsProcessor.stack -> RowwiseProcessor, vLLM's grouped rows).
STACK_VARIANTS: dict[str, dict[str, Any]] = {
    "temperature": {"type": "temperature", "temperature": 1.3},
    "top_k": {"type": "top_k", "top_k": 40},
    "min_p": {"type": "min_p", "min_p": 0.05},
    "repetition_penalty": {"type": "repetition_penalty", "penalty": 1.2, "context_size": 4},
    "logit_bias": {"type": "logit_bias", "bias": {"7": -1.0}},
    "suppress_tokens": {"type": "suppress_tokens", "token_ids": [9, 1, 2]},
    "typical_p": {"type": "typical_p", "mass": 0.9},
    "epsilon_cutoff": {"type": "epsilon_cutoff", "epsilon": 0.0003},
    "eta_cutoff": {"type": "eta_cutoff", "epsilon": 0.0009},
    "top_n_sigma": {"type": "top_n_sigma", "n": 2.5},
    "top_h": {"type": "top_h", "top_h": 0.8},
    "presence_penalty": {"type": "presence_penalty", "penalty": -0.25},
    "frequency_penalty": {"type": "frequency_penalty", "penalty": 1.5},
    "dry": {"type": "dry", "multiplier": 0.3, "allowed_length": 2, "sequence_breakers": []},
    "dry (text)": {"type": "dry", "multiplier": 1.2, "base": 2.0, "penalty_last_n": 6},
}

# Slots 0-2 run the same kinds with different parameters: one stacked call (pipelines that
# track sequences never stack). Slot 3 tracks its sequence (stateful, generated lengths).
SLOT_SPECS: list[list[dict[str, Any]]] = [
    [
        {"type": "repetition_penalty", "penalty": penalty},
        {"type": "logit_bias", "bias": {str(token): 1.5}},
        {"type": "suppress_tokens", "token_ids": [token + 1]},
        {"type": "dry", "multiplier": multiplier, "allowed_length": 1, "sequence_breakers": []},
    ]
    for penalty, token, multiplier in ((1.3, 3, 0.8), (1.1, 5, 0.5), (2.0, 3, 0.0))
]
SLOT_SPECS.append(
    [
        {"type": "presence_penalty", "penalty": 0.5},
        {"type": "min_new_tokens", "min_new_tokens": 3},
        {"type": "stop_strings", "stop_strings": ["5"]},
    ]
)
