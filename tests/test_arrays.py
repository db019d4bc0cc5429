"""The array bridge: zero-copy probes, shapes, dtypes, strided views, write-back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anylogits.core.arrays import from_torch, to_torch

NUMPY_DTYPES = [np.float16, np.float32, np.float64]
TORCH_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(7,), (1, 7), (3, 7)], ids=str)
def test_numpy_is_viewed_without_a_copy(dtype: type, shape: tuple[int, ...]) -> None:
    native = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
    converted = to_torch(native)
    assert converted.shares
    assert converted.tensor.ndim == 2
    assert converted.tensor.dtype == torch.from_numpy(native).dtype
    converted.tensor[0, 0] = -5  # an edit through the view reaches the caller
    assert native.reshape(-1)[0] == -5
    back = from_torch(converted.tensor, converted)
    assert back.shape == shape and back.dtype == native.dtype
    assert np.shares_memory(back, native)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(5,), (2, 5)], ids=str)
def test_torch_round_trip_keeps_dtype_shape_and_memory(
    dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    native = torch.randn(shape).to(dtype)
    converted = to_torch(native)
    assert converted.tensor.shape == ((1, 5) if len(shape) == 1 else shape)
    assert converted.tensor.data_ptr() == native.data_ptr()
    back = from_torch(converted.tensor.mul_(2), converted)
    assert back.shape == native.shape and back.dtype == dtype
    assert back.data_ptr() == native.data_ptr()


def test_strided_record_array_view_is_edited_in_place() -> None:
    # llama-cpp-python hands the hook a strided float32 view into a wider record.
    records = np.zeros(6, dtype=[("logit", np.float32), ("other", np.float32)])
    records["logit"] = np.arange(6)
    view = records["logit"]
    assert not view.flags.c_contiguous
    converted = to_torch(view)
    assert converted.shares
    converted.tensor.add_(10)
    assert records["logit"].tolist() == [10, 11, 12, 13, 14, 15]
    assert records["other"].tolist() == [0] * 6


def test_a_new_result_is_written_back_when_the_backend_expects_in_place() -> None:
    native = np.arange(4, dtype=np.float32)
    converted = to_torch(native)
    result = converted.tensor * 2  # a processor that returned a new tensor
    back = from_torch(result, converted, in_place=True)
    assert back is native
    assert native.tolist() == [0, 2, 4, 6]


def test_read_only_arrays_are_copied_and_never_written() -> None:
    native = np.arange(3, dtype=np.float32)
    native.flags.writeable = False
    converted = to_torch(native)
    assert not converted.shares
    converted.tensor.add_(1)
    assert native.tolist() == [0, 1, 2]
    assert from_torch(converted.tensor, converted).tolist() == [1, 2, 3]


def test_torch_in_place_copies_a_new_result_into_the_callers_tensor() -> None:
    native = torch.zeros(3)
    converted = to_torch(native)
    back = from_torch(torch.ones(1, 3), converted, in_place=True)
    assert back is native and native.tolist() == [1, 1, 1]


def test_dlpack_producers_are_accepted() -> None:
    class Producer:
        def __init__(self, tensor: torch.Tensor) -> None:
            self.tensor = tensor

        def __dlpack__(self, **kwargs):
            return self.tensor.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.tensor.__dlpack_device__()

    source = torch.arange(4.0)
    converted = to_torch(Producer(source))
    assert converted.tensor.data_ptr() == source.data_ptr()


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.arange(3), "dtype int64 are not supported"),
        (np.zeros((1, 2, 3), dtype=np.float32), r"must be \(V,\) or \(B, V\)"),
        ([1.0, 2.0], "type list are not supported"),
        (torch.arange(3), "must be floating point"),
    ],
)
def test_bad_arrays_are_rejected_with_the_reason(array: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_torch(array)
