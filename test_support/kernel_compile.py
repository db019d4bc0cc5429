"""Compile every Triton kernel for a CUDA target, without a GPU.

Triton's interpreter (what the kernels session runs the kernels with) executes the
Python of a kernel; it does not check what only the compiler does (annotations, types,
operations the backend lacks). This builds each kernel, in each of its dtype and flag
variants, to PTX and a cubin for sm_90 (Triton ships its ``ptxas``): a kernel that
would fail to compile on a GPU fails here. Run as ``python -m test_support.kernel_compile``
in a process without ``TRITON_INTERPRET`` (``tests/test_kernels.py`` does).
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

TARGET = ("cuda", 90, 32)  # an H100: compute capability 9.0, warps of 32

_TRUNCATION = {
    "top_k_ptr": "*i64",
    "top_p_ptr": "*fp32",
    "min_p_ptr": "*fp32",
    "temperature_ptr": "*fp32",
    **dict.fromkeys(
        ("width", "logits_stride", "out_stride", "k_stride", "p_stride", "min_p_stride"), "i32"
    ),
    "temperature_stride": "i32",
}
# What every penalty kernel takes first (penalties._launch), then each its own.
_HISTORY = {
    "ids_ptr": "*i64",
    **dict.fromkeys(
        (
            "width",
            "history",
            "logits_stride",
            "out_stride",
            "ids_stride",
            "ids_column_stride",
        ),
        "i32",
    ),
}
_REPETITION = {**_HISTORY, "penalty_ptr": "*fp32", "parameter_stride": "i32"}
_OUTPUT = {
    **_HISTORY,
    "counts_ptr": "*i32",
    "generated_ptr": "*i64",
    "presence_ptr": "*fp32",
    "frequency_ptr": "*fp32",
    "presence_stride": "i32",
    "frequency_stride": "i32",
}
_SPARSE = {
    **dict.fromkeys(("width", "logits_stride", "out_stride"), "i32"),
    "bias_ids_ptr": "*i64",
    "bias_offsets_ptr": "*i64",
    "bias_row_stride": "i32",
    "ban_ids_ptr": "*i64",
    "ban_offsets_ptr": "*i64",
    "ban_row_stride": "i32",
}
DTYPES = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16"}


def variants() -> list[tuple[str, Any, dict[str, str], dict[str, Any]]]:
    """``(label, kernel, argument types, constexprs)`` for each variant compiled."""
    from anylogits.kernels import penalties, sparse, truncation

    made = []
    # Every dtype once; float32 with both orders of the temperature.
    truncations = [("float32", False), *((name, True) for name in DTYPES)]
    for name, first in truncations:
        pointer = DTYPES[name]
        logits = {"logits_ptr": pointer, "out_ptr": pointer}
        flags = {"BFLOAT16": name == "bfloat16", "BLOCK": truncation.BLOCK}
        made.append(
            (
                f"truncation {name} temperature_first={first}",
                truncation._truncate_rows,
                {**logits, **_TRUNCATION},
                {"K_BEFORE_P": True, "MIN_P_BEFORE_P": first, "TEMPERATURE_FIRST": first, **flags},
            )
        )
    for name in ("float32", "bfloat16"):  # float16 differs from float32 in its loads only
        pointer = DTYPES[name]
        logits = {"logits_ptr": pointer, "out_ptr": pointer}
        blocks = {"BFLOAT16": name == "bfloat16", "BLOCK": penalties.BLOCK, "IDS_BLOCK": 512}
        made.append(
            (
                f"repetition penalty {name}",
                penalties._repetition_penalty_rows,
                {**logits, **_REPETITION},
                blocks,
            )
        )
        made.append(
            (
                f"output penalties {name}",
                penalties._output_penalty_rows,
                {**logits, **_OUTPUT},
                {
                    "PRESENCE": True,
                    "FREQUENCY": True,
                    "PRESENCE_FIRST": True,
                    **blocks,
                },
            )
        )
        made.append(
            (
                f"bias and bans {name}",
                sparse._bias_and_bans_rows,
                {**logits, **_SPARSE, "bias_values_ptr": pointer},
                {"BFLOAT16": name == "bfloat16", "BLOCK": sparse.BLOCK, "ENTRIES": 256},
            )
        )
    return made


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("run without TRITON_INTERPRET: the interpreter compiles nothing", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget(*TARGET)
    for label, kernel, types, constexprs in variants():
        names = inspect.signature(kernel.fn).parameters
        signature = {n: "constexpr" if n in constexprs else types[n] for n in names}
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(source, target=target, options={"enable_fp_fusion": False})
        ptx, cubin = len(compiled.asm["ptx"]), len(compiled.asm["cubin"])
        print(f"{label}: {ptx:,} characters of PTX, a cubin of {cubin:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
