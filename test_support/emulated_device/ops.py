"""Which ATen operations, run on the emulated device, read device values on the host,
check their indices on the device, or launch no kernel: each table from PyTorch's CUDA
sources. An operation in none of them is counted as unclassified (the accelerator level
fails until it is classified here)."""

from __future__ import annotations

from test_support.emulated_device.tensor import _is_device

# Operations on device tensors whose result the host must wait for (their output size
# or value depends on device data).
_HOST_READS = {
    "_local_scalar_dense": "item",
    "is_nonzero": "item",
    "equal": "item",
    "nonzero": "nonzero",
    "masked_select": "masked_select",
    "_unique2": "unique",
    "unique_dim": "unique",
    "unique_consecutive": "unique",
    "_unique": "unique",
    "bincount": "bincount",
    "histc": None,  # fixed size: not a read
}


# Operations whose CUDA kernels check every index on the device: an index out of range
# (a negative id included) is a device-side assert, which ends the CUDA context (the
# engine and every request), where the CPU would raise or wrap. The index argument's
# position and the dimension it indexes.
_CHECKED_INDICES = {
    "gather": (2, 1),
    "scatter": (2, 1),
    "scatter_": (2, 1),
    "scatter_add": (2, 1),
    "scatter_add_": (2, 1),
    "scatter_reduce": (2, 1),
    "scatter_reduce_": (2, 1),
    "index_select": (2, 1),
    "index_add": (2, 1),
    "index_add_": (2, 1),
    "index_copy": (2, 1),
    "index_copy_": (2, 1),
    "index_fill": (2, 1),
    "index_fill_": (2, 1),
    "embedding": (1, None),
}


# Operations whose CUDA kernels read device values on the host inside ATen (no Python
# read shows it), with the condition under which they do (PyTorch's CUDA sources:
# aten/src/ATen/native/cuda/).
_KERNEL_SYNCS = {
    # Indexing.cu: masked_fill_ with a Tensor value calls value.item().
    # (a host 0-dim value is read on the host, for free).
    "masked_fill": lambda args, kwargs: len(args) > 2 and _is_device(args[2]),
    "masked_fill_": lambda args, kwargs: len(args) > 2 and _is_device(args[2]),
    # MultinomialKernel.cu: checks the probabilities on the host (a read).
    "multinomial": lambda args, kwargs: True,
    # allclose reduces to a bool on the host.
    "allclose": lambda args, kwargs: True,
    # SummaryOps.cu: histc with min == max reads the input's min and max.
    "histc": lambda args, kwargs: (
        (args[3] if len(args) > 3 else kwargs.get("max", 0))
        == (args[2] if len(args) > 2 else kwargs.get("min", 0))
    ),
}

# Operations that index with tensors: a host index tensor is copied to the device
# (blocking) rather than refused.
_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl", "_index_put_impl_"})

# Operations that launch no kernel: views, metadata, allocations without a fill.
NO_LAUNCH = frozenset(
    {
        "_reshape_alias",
        "_unsafe_view",
        "alias",
        "as_strided",
        "detach",
        "empty",
        "empty_like",
        "empty_strided",
        "expand",
        "lift_fresh",
        "narrow",
        "permute",
        "select",
        "slice",
        "split",
        "squeeze",
        "t",
        "transpose",
        "unbind",
        "unsqueeze",
        "view",
    }
)

# Operations whose CUDA kernels run without the host reading any device value (their
# output sizes follow from their input sizes and arguments). An operation in none of
# these tables fails the accelerator level until it is classified.
_FREE = frozenset(
    [
        "abs",
        "add",
        "add_",
        "addmm",
        "alias",
        "all",
        "amax",
        "amin",
        "aminmax",
        "any",
        "arange",
        "argmax",
        "argmin",
        "as_strided",
        "bitwise_and",
        "bitwise_and_",
        "bitwise_left_shift",
        "bitwise_not",
        "bitwise_or",
        "bitwise_or_",
        "bitwise_right_shift",
        "bitwise_xor",
        "bmm",
        "cat",
        "ceil",
        "clamp",
        "clamp_",
        "clamp_max",
        "clamp_min",
        "clone",
        "copy_",
        "count_nonzero",
        "cumprod",
        "cumsum",
        "cumsum_",
        "detach",
        "diff",
        "div",
        "div_",
        "empty",
        "empty_like",
        "empty_strided",
        "eq",
        "exp",
        "exp_",
        "expand",
        "fill",
        "fill_",
        "flip",
        "floor",
        "floor_divide",
        "full",
        "full_like",
        "gather",
        "ge",
        "gt",
        "index",
        "index_add",
        "index_add_",
        "index_copy",
        "index_copy_",
        "index_fill",
        "index_fill_",
        "index_put",
        "index_put_",
        "index_select",
        "isclose",
        "isfinite",
        "isinf",
        "isnan",
        "le",
        "lift_fresh",
        "log",
        "log_",
        "log_softmax",
        "logical_and",
        "logical_not",
        "logical_or",
        "logical_xor",
        "logsumexp",
        "lt",
        "masked_fill",
        "masked_fill_",
        "max",
        "maximum",
        "mean",
        "min",
        "minimum",
        "mm",
        "mul",
        "mul_",
        "ne",
        "neg",
        "new_empty",
        "new_full",
        "new_ones",
        "new_zeros",
        "ones",
        "ones_like",
        "permute",
        "pow",
        "remainder",
        "reshape",
        "resize_",
        "rsub",
        "scalar_tensor",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "scatter_reduce",
        "scatter_reduce_",
        "select",
        "select_scatter",
        "sigmoid",
        "sign",
        "slice",
        "slice_scatter",
        "softmax",
        "sort",
        "split",
        "sqrt",
        "squeeze",
        "stack",
        "sub",
        "sub_",
        "sum",
        "t",
        "topk",
        "transpose",
        "tril",
        "triu",
        "trunc",
        "unbind",
        "unsqueeze",
        "view",
        "where",
        "zero_",
        "zeros",
        "zeros_like",
        "_index_put_impl",
        "_log_softmax",
        "_softmax",
        "_to_copy",
        "_unsafe_view",
        "_reshape_alias",
        "lerp",
        "reciprocal",
        "rsqrt",
        "exponential_",
        "uniform_",
        "normal_",
        "bernoulli_",
        "argsort",
        "cummax",
        "cummin",
        "searchsorted",
        "bucketize",
        "sub_",
        "neg_",
        "mul_",
        "log1p",
        "expm1",
        "nan_to_num",
        "nan_to_num_",
        "repeat",
        "constant_pad_nd",
        "narrow",
        "roll",
        "unfold",
        "expand_as",
        "view_as",
        "contiguous",
        "_unsafe_index",
        "round",
        "round_",
        "exp2",
        "exp2_",
        "__rshift__",
        "__lshift__",
        "logical_or_",
        "logical_and_",
        "logical_not_",
        "nansum",
        "prod",
        "sum_",
        "abs_",
        "where_",
        "pow_",
        "div_",
        "clamp_min_",
        "clamp_max_",
        "floor_",
        "ceil_",
        "trunc_",
        "sqrt_",
        "rsqrt_",
        "reciprocal_",
        "sigmoid_",
        "lt_",
        "le_",
        "gt_",
        "ge_",
        "eq_",
        "ne_",
        "fmod",
        "randperm",
    ]
)


def _classified(name: str) -> bool:
    return (
        name in _FREE
        or name in _HOST_READS
        or name in _KERNEL_SYNCS
        or name in ("repeat_interleave", "isin")
    )


UNCLASSIFIED = "unclassified"


# Tensor methods that hand device values to Python.
_HOST_CONVERSIONS = frozenset({"tolist", "numpy", "__array__", "__dlpack__"})
