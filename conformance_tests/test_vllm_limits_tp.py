"""The operator's limits reach every engine process: vLLM with tensor_parallel_size=2
(two worker processes), started with ``ANYLOGITS_LIMITS`` lowered.

The limit tested, ``sequence_tokens``, can only be checked where the vocabulary is, in
the engine: a forced phrase of five tokens passes the frontend's check (its text is
short) and is refused when the engine binds it, so the request ends with EOS and the
engine logs the limit. An engine that did not see the variable would force the phrase.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")

from anylogits.engines.generation import vllm_environment  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("vllm")]

PHRASE = " Sure, here it is"

SCRIPT = """
import json, sys
from vllm import LLM
from anylogits import ForceSequence, for_vllm
from anylogits.adapters.vllm import AnyLogits

model, prompt, phrase = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
llm = LLM(
    model, tensor_parallel_size=2, dtype="float32", max_model_len=256, max_num_seqs=4,
    enforce_eager=True, logits_processors=[AnyLogits],
)
params = for_vllm(ForceSequence(phrase), max_tokens=8, temperature=0.0)
output = llm.generate([{"prompt_token_ids": prompt}], [params], use_tqdm=False)
print("TOKENS", json.dumps(list(output[0].outputs[0].token_ids)), flush=True)
"""


def test_lowered_limits_reach_the_tensor_parallel_engine(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    phrase = tokenizer.encode(PHRASE, add_special_tokens=False)
    assert len(phrase) == 5, phrase
    env = {
        **os.environ,
        "ANYLOGITS_LIMITS": json.dumps({"sequence_tokens": 4}),
        "VLLM_CPU_OMP_THREADS_BIND": "0|1",
        **vllm_environment(tmp_path),
    }
    prompt = tokenizer.encode("Once upon a time")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_model_dir), json.dumps(prompt), PHRASE],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("TOKENS "))
    tokens = json.loads(line.removeprefix("TOKENS "))
    assert tokens == [tokenizer.eos_token_id], tokens
    assert "anylogits limit 'sequence_tokens'" in log, log[-6000:]
