"""What a decode step may read from the device, per catalogue case and layout, and why.

The accelerator level (``tests/test_device_copies.py``, and
``conformance_tests/test_accelerator_level.py`` through each engine's hook) holds every
steady-state step to no blocking host->device copy and to exactly these device->host
reads: a new one fails there, and a removed one asks for this table to change.

Layouts: ``host history`` (token histories built on the host: vLLM's V1 runner, llama.cpp,
mlx-lm), ``device history`` (``input_ids`` on the device: transformers).
"""

from __future__ import annotations

from anylogits.core.processor import LogitsProcessor

HOST_HISTORY, DEVICE_HISTORY = "host history", "device history"
LAYOUTS = (HOST_HISTORY, DEVICE_HISTORY)

TRACKER_READ = (
    "the prefix tracker maps each row to its sequence by its token ids (transformers "
    "reorders beams and rolls back draft tokens without saying which row is which): each "
    "row is hashed on the device and one (B, 5) int64 read a step brings back the hashes, "
    "the new token and the id range, whatever the history's length (the whole history "
    "only on a step where a row's parent is unknown: a new prompt, accepted drafts, a "
    "resume). Unlike vLLM's structured outputs, which copy each step's sampled tokens on "
    "a side stream and wait on an event outside the step, this read blocks: transformers "
    "hands the hook its tokens inside the step (its generate reads the same tensor for "
    "its stopping criteria each step)"
)

# vLLM's V2 model runner, per step (conformance_tests/test_vllm_hook.py counts them with
# vLLM's own LogitsContext on the emulated device).
V2_READS: dict[str, tuple[int, int, str]] = {
    # layout: (device reads in apply, event waits in apply, why / vLLM's counterpart)
    "stateless requests": (
        0,
        0,
        "histories gathered where the runner keeps them (all_token_ids, input_ids, "
        "pos): vLLM's own penalties read the same buffers in their Triton kernel",
    ),
    "host states": (
        0,
        1,
        "a grammar or stateful processor's new committed tokens: copied into pinned "
        "memory in apply_staged_writes(), before the forward, in per-request windows "
        "(the host bound of each request's length); apply() waits on the copy's event, "
        "not on the forward. vLLM's structured outputs read sampled tokens the same way "
        "(output copy stream + event)",
    ),
    "draft rows": (
        1,
        0,
        "speculative decoding: which row is whose request (expanded_idx_mapping, "
        "expanded_local_pos, input_ids) is on the device only; LogitsContext carries no "
        "host copy (vLLM's InputBatch has cu_num_logits_np, its rejection sampler reads "
        "it there): one read of a (3, rows) tensor per step",
    ),
}

_TOP_CHOICE = (
    "whether {what} was each row's top choice goes into its state, on the host, as the "
    "zoo's processor keeps it: one read of a (B,) bool per step"
)

# Reads a processor itself makes, by case and layout (the tracker's come on top).
INHERENT_READS: dict[str, dict[str, tuple[int, str]]] = {
    "watermark": dict.fromkeys(
        LAYOUTS,
        (
            1,
            "selfhash: each row's 40 likeliest tokens seed the CPU generators that draw "
            "their greenlists, as transformers' WatermarkLogitsProcessor does: one read of "
            "(B, 40) candidates and the context per step",
        ),
    ),
    "watermark (lefthash)": {
        DEVICE_HISTORY: (
            1,
            "the previous token seeds the CPU generator of each row's greenlist: one read "
            "of the history's last column per step (read on the host when it is there)",
        )
    },
    "force_last_phrase": dict.fromkeys(LAYOUTS, (1, _TOP_CHOICE.format(what="EOS"))),
    "trigger_phrase (replacing)": dict.fromkeys(
        LAYOUTS, (1, _TOP_CHOICE.format(what="the trigger"))
    ),
}


def expected_device_reads(name: str, processor: LogitsProcessor, layout: str) -> tuple[int, str]:
    """``(reads per step, why)`` for catalogue case ``name`` run alone in ``layout``."""
    reads, reasons = 0, []
    own = INHERENT_READS.get(name, {}).get(layout)
    if own is not None:
        reads += own[0]
        reasons.append(own[1])
    if layout == DEVICE_HISTORY and processor.needs_sequences:
        reads += 1
        reasons.append(TRACKER_READ)
    return reads, "; ".join(reasons) or "no device read"
