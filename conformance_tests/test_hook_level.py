"""Level 1: each adapter, called exactly as its backend calls it, equals the core result.

Every processor, float32/float16/bfloat16, batch 1..N, with rows reordered, forked and
rolled back between calls the way beam search and speculative decoding do.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from anylogits import Pipeline, from_spec
from anylogits.core.vocab import hf_vocabulary
from anylogits.testing.check import VOCAB_SIZE, call_sequence
from test_support.catalogue import PROCESSOR_SPECS, VOCABULARY_SPECS, build

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.support("hook")
@pytest.mark.parametrize("name", sorted(PROCESSOR_SPECS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_hook_equals_core(backend, name: str, dtype: torch.dtype, batch: int) -> None:
    if backend.max_batch is not None and batch > backend.max_batch:
        pytest.skip(f"{backend.name} hooks see at most {backend.max_batch} row(s) per call")
    if dtype not in backend.dtypes:
        pytest.skip(f"{backend.name} passes only {backend.dtypes} logits")
    hook = backend.hook([build(name)])
    core = Pipeline([build(name)])
    generator = torch.Generator().manual_seed(batch)
    changed = False
    for ids in call_sequence(batch, seed=batch):
        logits = torch.randn(batch, VOCAB_SIZE, generator=generator).to(dtype)
        expected = core(logits.clone(), ids)
        native = logits.clone()
        actual = backend.call(hook, ids, native)
        if backend.preserves_logits:
            assert torch.equal(native, logits), "the hook edited logits the backend keeps"
        assert actual.dtype == dtype and actual.shape == logits.shape
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        changed |= not torch.equal(expected, logits)
    assert changed, f"{name} never changed the logits: the comparison would prove nothing"


def test_one_hook_runs_several_processors_in_order(backend) -> None:
    names = ["repetition_penalty", "logit_bias", "temperature", "top_k", "stateful_probe"]
    hook = backend.hook([build(name) for name in names])
    core = Pipeline([build(name) for name in names])
    generator = torch.Generator().manual_seed(0)
    batch = min(4, backend.max_batch or 4)
    for ids in call_sequence(batch, seed=1):
        logits = torch.randn(batch, VOCAB_SIZE, generator=generator)
        actual = backend.call(hook, ids, logits.clone())
        torch.testing.assert_close(actual, core(logits.clone(), ids))


# -- processors that need the model's vocabulary -------------------------------------------

# "0".."9" and " " in llama-bpe: the prompts.
DIGITS = [15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 220]


# What rows say where the processor allows it: every text rule above fires on it.
SCRIPT = " 1 2 3 5 7 8 1 2 3 5 7 8 1 2 3"


def _next_tokens(
    processed: torch.Tensor, script: list[int], eos: list[int], generator: torch.Generator
) -> torch.Tensor:
    """One token per row: the script's next token where the processed logits allow it,
    else one sampled from them (EOS only when it is all that is left)."""
    logits = processed.to(torch.float32).clone()
    allowed = torch.isfinite(logits)
    allowed[:, eos] = False
    logits[:, eos] = torch.where(allowed.any(1, keepdim=True), float("-inf"), logits[:, eos])
    sampled = torch.multinomial(logits.softmax(-1), 1, generator=generator)
    wanted = torch.tensor(script[: logits.shape[0]])[:, None]
    return torch.where(allowed.gather(1, wanted), wanted, sampled)


@pytest.mark.support("hook")
@pytest.mark.parametrize("name", sorted(VOCABULARY_SPECS))
@pytest.mark.parametrize("batch", [1, 3])
def test_hook_with_a_vocabulary_equals_core(
    backend, hf_tokenizer: Any, name: str, batch: int
) -> None:
    if backend.max_batch is not None and batch > backend.max_batch:
        pytest.skip(f"{backend.name} hooks see at most {backend.max_batch} row(s) per call")
    spec = VOCABULARY_SPECS[name]
    hook = backend.hook([from_spec(spec)], tokenizer=hf_tokenizer)
    core = Pipeline([from_spec(spec)], hf_vocabulary(hf_tokenizer))
    generator = torch.Generator().manual_seed(batch)
    width = len(hf_tokenizer)
    eos = [hf_tokenizer.eos_token_id]
    script = hf_tokenizer.encode(SCRIPT, add_special_tokens=False)
    prompt = torch.tensor(DIGITS)[torch.randint(0, len(DIGITS), (batch, 6), generator=generator)]
    ids = prompt
    changed = False
    for step in range(7):
        logits = torch.randn(batch, width, generator=generator) * 3
        expected = core(logits.clone(), ids)
        actual = backend.call(hook, ids, logits.clone())
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        changed |= not torch.equal(expected, logits)
        if step == 3:
            ids = ids[:, :-2]  # rejected draft tokens
            continue
        parents = torch.randint(0, batch, (batch,), generator=generator)
        wanted = [script[(step + row) % len(script)] for row in range(batch)]
        chosen = _next_tokens(expected[parents], wanted, eos, generator)
        ids = torch.cat([ids[parents], chosen], 1)
    assert changed, f"{name} never changed the logits: the comparison would prove nothing"
