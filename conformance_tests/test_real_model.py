"""The real-model level: SmolLM2-135M-Instruct, a trained model, with identical float32
weights in every engine (``anylogits.testing.real_model``).

Near-ties: two engines' float32 kernels differ in the last bits, and a trained model's
logits have real near-ties. Where two engines' tokens part, the comparison looks at the
reference's processed scores at that step: if its top two lie within
:data:`TIE_TOLERANCE`, the step is a tie and the comparison stops there, saying so (the
tokens agreed up to it); otherwise the difference is real and the test fails. Each
comparison must also cover :data:`MIN_AGREED` tokens, so that ties cannot hide
everything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

TIE_TOLERANCE = 1e-3  # logits; float32 kernels of two engines differ by ~1e-5 here
MIN_AGREED = 8
NEW_TOKENS = 32
PROMPTS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "List three fruits, then list them again.",
)


@pytest.fixture(scope="module")
def reference(real_model_dir: Path) -> tuple[Any, Any]:
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(real_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        real_model_dir, dtype=torch.float32
    ).eval()
    return model, tokenizer


def chat_ids(tokenizer: Any, prompt: str) -> list[int]:
    messages = [{"role": "user", "content": prompt}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return list(encoded["input_ids"])


def greedy_reference(
    reference: tuple[Any, Any], prompt_ids: list[int], **native: Any
) -> tuple[list[int], list[Any]]:
    """transformers' greedy tokens and its processed scores at each step."""
    import torch

    model, tokenizer = reference
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.pad_token_id,
            **native,
        )
    tokens = before_end(out.sequences[0, len(prompt_ids) :].tolist(), tokenizer.eos_token_id)
    return tokens, [score[0] for score in out.scores]


def before_end(tokens: list[int], eos: int) -> list[int]:
    """``tokens`` without the end-of-text token that ends them (engines differ in whether
    they return it)."""
    return tokens[:-1] if tokens and tokens[-1] == eos else tokens


def agreed_until_tie(expected: list[int], scores: list[Any], actual: list[int]) -> int:
    """How many tokens agree: all, or those before a near-tie at step MIN_AGREED or
    later; a parting at a real (not near-tie) step fails."""
    import torch

    for step, (want, got) in enumerate(zip(expected, actual, strict=False)):
        if want != got:
            top = torch.topk(scores[step].float(), 2).values
            gap = float(top[0] - top[1])
            assert gap < TIE_TOLERANCE, (
                f"step {step}: {got} instead of {want}, the reference's top-2 gap is {gap:.2e} "
                f"(a real difference: over the tie tolerance {TIE_TOLERANCE})"
            )
            print(f"near-tie at step {step} (gap {gap:.1e}): compared {step} tokens")
            assert step >= MIN_AGREED, f"a near-tie after only {step} tokens: too few compared"
            return step
    assert len(actual) == len(expected), f"{len(actual)} tokens, the reference {len(expected)}"
    return len(expected)


@pytest.mark.only_backend("transformers")
def test_the_gguf_and_the_hf_folder_hold_the_same_float32_weights(real_model_dir: Path) -> None:
    import gguf
    import torch
    from safetensors.torch import load_file

    from anylogits.testing.real_model import F32_FILENAME, _unpermute_qk

    weights = load_file(str(real_model_dir / "model.safetensors"))
    reader = gguf.GGUFReader(real_model_dir / F32_FILENAME)
    config = json.loads((real_model_dir / "config.json").read_text())
    assert all(tensor.tensor_type == gguf.GGMLQuantizationType.F32 for tensor in reader.tensors)
    by_name = {t.name: torch.from_numpy(t.data.copy()) for t in reader.tensors}
    assert torch.equal(by_name["token_embd.weight"], weights["model.embed_tokens.weight"])
    for layer in range(config["num_hidden_layers"]):
        q = by_name[f"blk.{layer}.attn_q.weight"]
        hf_q = weights[f"model.layers.{layer}.self_attn.q_proj.weight"]
        assert torch.equal(_unpermute_qk(q, config["num_attention_heads"]), hf_q)
        down = by_name[f"blk.{layer}.ffn_down.weight"]
        assert torch.equal(down, weights[f"model.layers.{layer}.mlp.down_proj.weight"])


@pytest.mark.only_backend("transformers")
def test_the_real_model_answers_in_plain_text(reference: tuple[Any, Any]) -> None:
    tokenizer = reference[1]
    tokens, _ = greedy_reference(reference, chat_ids(tokenizer, PROMPTS[0]))
    assert "Paris" in tokenizer.decode(tokens)


@pytest.mark.only_backend("transformers")
def test_a_json_schema_output_parses_with_a_name(reference: tuple[Any, Any]) -> None:
    import torch
    from transformers import LogitsProcessorList

    from anylogits import JSONSchema, for_transformers

    model, tokenizer = reference
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 1}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    prompt = "Extract the person as JSON: Maria is a 34 year old engineer from Lisbon."
    ids = torch.tensor([chat_ids(tokenizer, prompt)])
    hook = for_transformers(JSONSchema(schema), tokenizer=tokenizer)
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=40, do_sample=False, logits_processor=LogitsProcessorList([hook])
        )
    text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    parsed = json.loads(text)
    assert isinstance(parsed["name"], str) and parsed["name"].strip(), parsed
    assert isinstance(parsed["age"], int), parsed


@pytest.fixture(scope="module")
def llama_engine(real_model_dir: Path) -> Any:
    """The suite's llama.cpp engine on the folder's float32 GGUF (float32 KV cache)."""
    from anylogits.testing.engines import LlamaCppEngine

    return LlamaCppEngine.load(real_model_dir)


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.parametrize("prompt", PROMPTS)
def test_llama_cpp_on_the_same_weights_greedy_equals_transformers(
    llama_engine: Any, reference: tuple[Any, Any], prompt: str
) -> None:
    tokenizer = reference[1]
    prompt_ids = chat_ids(tokenizer, prompt)
    expected, scores = greedy_reference(reference, prompt_ids)
    got = before_end(llama_engine.greedy(prompt_ids, n=NEW_TOKENS), tokenizer.eos_token_id)
    agreed_until_tie(expected, scores, got)


@pytest.mark.only_backend("llama_cpp")
def test_llama_cpp_repetition_penalty_through_anylogits_equals_transformers_own(
    llama_engine: Any, reference: tuple[Any, Any]
) -> None:
    from anylogits import RepetitionPenalty

    tokenizer = reference[1]
    prompt_ids = chat_ids(tokenizer, PROMPTS[2])
    plain, _ = greedy_reference(reference, prompt_ids)
    expected, scores = greedy_reference(reference, prompt_ids, repetition_penalty=1.3)
    assert expected != plain, "the penalty must change the output, or agreeing proves nothing"
    got = llama_engine.greedy(prompt_ids, [RepetitionPenalty(1.3)], NEW_TOKENS)
    agreed_until_tie(expected, scores, before_end(got, tokenizer.eos_token_id))


def test_a_near_tie_stops_the_comparison_and_a_real_difference_fails() -> None:
    import torch

    expected = list(range(12))
    tied, clear = torch.zeros(12, 4), torch.zeros(12, 4)
    tied[:, 0], tied[:, 1] = 5.0, 5.0 - 1e-5  # step 10: two tokens 1e-5 apart
    clear[:, 0], clear[:, 1] = 5.0, 3.0
    parted = [*expected[:10], 99, 98]
    assert agreed_until_tie(expected, list(tied), parted) == 10
    with pytest.raises(AssertionError, match="a real difference"):
        agreed_until_tie(expected, list(clear), parted)
    with pytest.raises(AssertionError, match="too few compared"):
        agreed_until_tie(expected, list(tied), [0, 1, 99])
    assert agreed_until_tie(expected, list(clear), expected) == 12


_VLLM_SCRIPT = """
import json, os, sys
from pathlib import Path
model_dir, scratch, prompts, new_tokens = sys.argv[1:5]  # vLLM's start rewrites sys.argv
prompts, new_tokens = json.loads(prompts), int(new_tokens)
from anylogits.testing.engines import vllm_environment
os.environ.update(vllm_environment(Path(scratch)))
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from anylogits import RepetitionPenalty, for_vllm
from anylogits.adapters.vllm import AnyLogits
llm = LLM(model_dir, dtype="float32", max_model_len=512, seed=0, enforce_eager=True,
          logits_processors=[AnyLogits])
greedy = SamplingParams(temperature=0.0, max_tokens=new_tokens)
penalized = for_vllm(RepetitionPenalty(1.3), temperature=0.0, max_tokens=new_tokens)
outputs = {}
for name, params in (("plain", greedy), ("repetition_penalty", penalized)):
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    outputs[name] = [list(r.outputs[0].token_ids) for r in results]
print("RESULT" + json.dumps(outputs))
"""


@pytest.mark.only_backend("vllm")
def test_vllm_on_the_same_weights_greedy_and_a_penalty_equal_transformers(
    real_model_dir: Path, reference: tuple[Any, Any], tmp_path: Path
) -> None:
    import subprocess
    import sys

    tokenizer = reference[1]
    prompts = [chat_ids(tokenizer, prompt) for prompt in PROMPTS]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _VLLM_SCRIPT,
            str(real_model_dir),
            str(tmp_path),
            json.dumps(prompts),
            str(NEW_TOKENS),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    outputs = json.loads(lines[0][len("RESULT") :])
    for prompt_ids, tokens in zip(prompts, outputs["plain"], strict=True):
        expected, scores = greedy_reference(reference, prompt_ids)
        agreed_until_tie(expected, scores, before_end(tokens, tokenizer.eos_token_id))
    plain, _ = greedy_reference(reference, prompts[2])
    expected, scores = greedy_reference(reference, prompts[2], repetition_penalty=1.3)
    assert expected != plain, "the penalty must change the output, or agreeing proves nothing"
    got = before_end(outputs["repetition_penalty"][2], tokenizer.eos_token_id)
    agreed_until_tie(expected, scores, got)
