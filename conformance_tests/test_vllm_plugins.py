"""Plugins reach vLLM's engine process: offline ``LLM`` with the engine core in its own
process started by ``spawn`` (a fresh interpreter: nothing the script imported is there),
serving a request that names the example plugin's ``ban_two_back`` and a probe from
``ANYLOGITS_PLUGINS`` by type alone. The script never imports either module itself. A
plugin module that fails to import stops the engine at start, naming the module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")
plugin = pytest.importorskip("anylogits_example_plugin")

from anylogits.engines.generation import (  # noqa: E402
    NEW_TOKENS,
    TransformersEngine,
    vllm_environment,
)
from test_support import child_environment  # noqa: E402
from test_support.generation_cases import COUNTING  # noqa: E402
from test_support.probes import GeneratedHashBias  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("vllm")]

SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
from anylogits.adapters.vllm import AnyLogits

model, prompt, requests = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
llm = LLM(
    model, dtype="float32", max_model_len=256, max_num_seqs=4, enforce_eager=True,
    logits_processors=[AnyLogits],
)
params = [
    SamplingParams(max_tokens=int(sys.argv[4]), temperature=0.0, extra_args={"anylogits": specs})
    for specs in requests
]
outputs = llm.generate([{"prompt_token_ids": prompt}] * len(params), params, use_tqdm=False)
print("TOKENS", json.dumps([list(output.outputs[0].token_ids) for output in outputs]), flush=True)
"""


def run_script(
    model_dir: Path, scratch: Path, prompt: list[int], requests: list[Any], **settings: str
) -> subprocess.CompletedProcess[str]:
    env = child_environment(**vllm_environment(scratch), **settings)
    arguments = [str(model_dir), json.dumps(prompt), json.dumps(requests), str(NEW_TOKENS)]
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


def test_plugins_reach_a_spawned_engine_process(
    tiny_model_dir: Path, tmp_path: Path, reference: TransformersEngine
) -> None:
    ban_two_back = plugin.BanTwoBack()
    probe = GeneratedHashBias(12.0)
    requests = [[], [ban_two_back.to_spec()], [probe.to_spec()]]
    prompt = reference.tokenizer(COUNTING)["input_ids"]
    result = run_script(
        tiny_model_dir,
        tmp_path,
        prompt,
        requests,
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
        VLLM_WORKER_MULTIPROC_METHOD="spawn",
        ANYLOGITS_PLUGINS="test_support.probes",
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("TOKENS "))
    plain, banned, probed = json.loads(line.removeprefix("TOKENS "))
    assert plain == reference.greedy(prompt)
    assert banned == reference.greedy(prompt, [plugin.BanTwoBack()])
    assert probed == reference.greedy(prompt, [GeneratedHashBias(12.0)])
    assert banned != plain and probed != plain


def test_a_plugin_module_that_fails_stops_the_engine_at_start(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    result = run_script(
        tiny_model_dir,
        tmp_path,
        [1, 2, 3],
        [],
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        ANYLOGITS_PLUGINS="no_such_anylogits_plugin",
    )
    log = result.stdout + result.stderr
    assert result.returncode != 0, log[-6000:]
    assert "TOKENS" not in result.stdout
    expected = (
        "anylogits plugin module 'no_such_anylogits_plugin' (from ANYLOGITS_PLUGINS) failed "
        "to import: ModuleNotFoundError"
    )
    assert expected in log, log[-6000:]
