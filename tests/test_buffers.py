"""ReusedOutputs: a hook's output tensors are reused only when nothing holds them."""

from __future__ import annotations

import pytest
import torch

from anylogits.core.buffers import ReusedOutputs


def test_an_output_is_reused_once_it_and_its_views_are_dropped() -> None:
    outputs = ReusedOutputs(keep=2)
    logits = torch.zeros(2, 3)
    first = outputs.like(logits)
    first_memory = first.data_ptr()
    second = outputs.like(logits)
    assert second.data_ptr() != first_memory  # `first` is still held
    assert outputs.like(logits).data_ptr() not in (first_memory, second.data_ptr())
    row = first[0]
    del first
    assert outputs.like(logits).data_ptr() != first_memory  # a view of it is still held
    del row
    third = outputs.like(logits)
    assert third.data_ptr() == first_memory  # nothing holds it any more: no allocation


def test_the_first_call_makes_the_buffer_the_next_call_gets() -> None:
    """The second output (the first still held, as transformers' loop holds it) was
    allocated by the first call: the first decoding step allocates nothing."""
    outputs = ReusedOutputs(keep=2)
    logits = torch.zeros(2, 3)
    first = outputs.like(logits)
    made_by_the_first_call = {buffer.tensor.data_ptr() for buffer in outputs._buffers}
    second = outputs.like(logits)
    assert second.data_ptr() != first.data_ptr()
    assert made_by_the_first_call == {first.data_ptr(), second.data_ptr()}


def test_keep_below_one_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="keep must be at least 1, got 0"):
        ReusedOutputs(keep=0)


def test_outputs_kept_by_the_caller_are_all_distinct() -> None:
    outputs = ReusedOutputs(keep=2)
    kept = [outputs.like(torch.zeros(1, 4)) for _ in range(5)]
    assert len({tensor.data_ptr() for tensor in kept}) == 5


def test_an_output_has_the_inputs_shape_dtype_and_never_its_memory() -> None:
    outputs = ReusedOutputs()
    for logits in (torch.zeros(2, 3), torch.zeros(4, 5, dtype=torch.float16)):
        out = outputs.like(logits)
        assert (out.shape, out.dtype, out.device) == (logits.shape, logits.dtype, logits.device)
        assert out.data_ptr() != logits.data_ptr()


def test_a_buffer_made_in_inference_mode_is_not_handed_out_outside_it() -> None:
    outputs = ReusedOutputs()
    logits = torch.zeros(2, 3)
    with torch.inference_mode():
        inference_memory = outputs.like(logits).data_ptr()
    out = outputs.like(logits)
    assert out.data_ptr() != inference_memory
    out.copy_(logits)  # writable here: raises for an inference tensor


def test_a_new_hooks_outputs_are_the_buffers_a_dropped_one_left() -> None:
    """The next request's hook takes the buffers of one dropped (or cleared) before it,
    except those a caller still holds; large ones are not kept for it."""
    from anylogits.core import buffers

    buffers._spares.clear()
    logits = torch.zeros(1, 1000)
    outputs = ReusedOutputs(keep=2)
    held = outputs.like(logits)
    left = {buffer.tensor.data_ptr() for buffer in outputs._buffers}
    del outputs  # `held` is still the caller's
    after = ReusedOutputs(keep=2)
    first = after.like(logits)
    second = after.like(logits)
    mine = {first.data_ptr(), second.data_ptr()}
    assert held.data_ptr() not in mine and len(mine & left) == 1
    del first, second
    after.clear()
    again = ReusedOutputs(keep=2)
    assert again.like(logits).data_ptr() in mine
    large = ReusedOutputs(keep=1)
    large.like(torch.zeros(1, buffers.SPARE_BYTES // 4 + 1))
    before = len(buffers._spares)
    del large
    assert len(buffers._spares) == before
