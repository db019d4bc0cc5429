"""One launch for the sampling chain's tail: top-k, top-p, min-p and temperature.

:func:`truncate` applies, per row, the truncations a pipeline holds in a run (each with
its own per-row parameter, a disabled row included) and the temperature, in one Triton
kernel, sort-free: each row's thresholds are found by a radix select over the order of
its float32 values (four bits a pass, a 16-bin histogram of counts for top-k and of
probability mass for top-p: 19 passes over the row in all), so the result is the same set
of kept tokens as the catalogue's processors (the torch reference) give, ties included:

- top-k keeps every logit at least the k-th highest (``k = 0``: off);
- top-p keeps a logit when the mass of the logits above it (among those the truncations
  before it kept) is below ``p`` (``p >= 1``: off): the smallest set that reaches ``p``,
  and every logit as likely as its last;
- min-p keeps a logit whose probability is at least ``min_p`` times the top one's
  (``min_p = 0``: off);
- the temperature divides the logits before the truncations (``generate``'s order) or
  the survivors after them (the benchmarks' chain).

Top-k and min-p commute with each other and, after top-p, act as intersections; before
top-p they decide the set whose mass top-p measures. Masses are float32 sums in the
kernel's order, not the CPU's: a token within float rounding of the top-p or min-p
boundary may be kept here and not there (the tests count such rows).

The interpreter tests (``tests/test_kernels.py``, ``TRITON_INTERPRET=1``) hold the kernel
to :class:`~anylogits.TopK`, :class:`~anylogits.TopP`, :class:`~anylogits.MinP` and
:class:`~anylogits.Temperature` on the accelerator branch. Each parameter is a per-row
device tensor (or one for every row), so one launch serves rows with different
parameters.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from anylogits.kernels._rounding import rounded, to_bfloat16_values

# Columns per step of a pass (each step holds a (BLOCK, 16) table of digit bins); rows
# are split across the steps, not across programs (a program per row).
BLOCK = 1024


def truncate(
    logits: torch.Tensor,
    *,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    temperature: torch.Tensor,
    k_before_p: bool,
    min_p_before_p: bool,
    temperature_first: bool,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The truncated (and scaled) ``(B, V)`` ``logits`` (float32, float16 or bfloat16;
    computed in float32), into ``out`` (default: a new tensor; ``logits`` itself works).
    Each parameter is a device tensor of one value per row, or of one value for every
    row: ``top_k`` int64, ``top_p``, ``min_p`` and ``temperature`` float32."""
    rows, width = logits.shape
    if out is None:
        out = torch.empty_like(logits)
    if rows == 0:
        return out
    _truncate_rows[(rows,)](
        logits,
        out,
        top_k,
        top_p,
        min_p,
        temperature,
        width,
        logits.stride(0),
        out.stride(0),
        *(0 if parameter.numel() == 1 else 1 for parameter in (top_k, top_p, min_p, temperature)),
        K_BEFORE_P=k_before_p,
        MIN_P_BEFORE_P=min_p_before_p,
        TEMPERATURE_FIRST=temperature_first,
        BFLOAT16=logits.dtype == torch.bfloat16,
        BLOCK=min(BLOCK, triton.next_power_of_2(width)),
        enable_fp_fusion=False,  # no fused multiply-add: torch rounds a product first
    )
    return out


@triton.jit
def _ordered_key(x):
    # float32 bits as an int64 that orders like the floats (-inf lowest).
    bits = x.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(bits < 0, -1 - bits, bits + 2147483648)


@triton.jit
def _block(
    source,
    start,
    columns,
    width,
    temperature,
    TEMPERATURE_FIRST: tl.constexpr,
    BFLOAT16: tl.constexpr,
):
    """A block of the row as the truncations see it (float32; divided by the temperature
    first and rounded to the logits' dtype, as the torch processor divides in place) and
    which of its columns lie in the row."""
    inside = start + columns < width
    raw = tl.load(source + start + columns, mask=inside, other=-float("inf"))
    x = raw.to(tl.float32)
    if TEMPERATURE_FIRST:
        x = rounded(x / temperature, raw.dtype, BFLOAT16)
    return x, inside


@triton.jit
def _digit(histogram, needed, bins):
    """A radix select's step: the highest digit whose bin and those above hold at least
    ``needed`` (a count, or a mass), and how much of it is still needed inside that bin."""
    at_or_above = tl.sum(histogram, axis=0) - tl.cumsum(histogram, axis=0) + histogram
    chosen = tl.sum((at_or_above >= needed).to(tl.int64), axis=0) - 1
    return chosen, needed - tl.sum(tl.where(bins == chosen, at_or_above - histogram, 0), axis=0)


@triton.jit
def _seen_by_top_p(
    x, key, inside, k_key, min_p_floor, K_BEFORE_P: tl.constexpr, MIN_P_BEFORE_P: tl.constexpr
):
    """Which logits top-p measures: those the truncations before it kept."""
    if K_BEFORE_P:
        inside = inside & (key >= k_key)
    if MIN_P_BEFORE_P:
        inside = inside & (x >= min_p_floor)
    return inside


@triton.jit
def _truncate_rows(
    logits_ptr,
    out_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    temperature_ptr,
    width,
    logits_stride,
    out_stride,
    k_stride,
    p_stride,
    min_p_stride,
    temperature_stride,
    K_BEFORE_P: tl.constexpr,
    MIN_P_BEFORE_P: tl.constexpr,
    TEMPERATURE_FIRST: tl.constexpr,
    BFLOAT16: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    source = logits_ptr + row * logits_stride
    k = tl.load(top_k_ptr + row * k_stride)
    p = tl.load(top_p_ptr + row * p_stride)
    min_p = tl.load(min_p_ptr + row * min_p_stride)
    temperature = tl.load(temperature_ptr + row * temperature_stride)
    columns = tl.arange(0, BLOCK)

    top = -float("inf")
    for start in range(0, width, BLOCK):
        x, inside = _block(source, start, columns, width, temperature, TEMPERATURE_FIRST, BFLOAT16)
        top = tl.maximum(top, tl.max(x, axis=0))

    # Top-k: the k-th highest logit's key, four bits a pass (a radix select: the digit
    # whose bin holds the k-th of the logits still in question fixes four more bits).
    bins = tl.arange(0, 16)
    k_key = tl.zeros((), dtype=tl.int64)
    if k > 0 and k < width:
        needed = k.to(tl.int64)
        for step in tl.static_range(8):
            shift = 28 - 4 * step
            counts = tl.zeros((16,), dtype=tl.int64)
            for start in range(0, width, BLOCK):
                x, inside = _block(
                    source, start, columns, width, temperature, TEMPERATURE_FIRST, BFLOAT16
                )
                key = _ordered_key(x)
                match = inside & ((key >> (shift + 4)) == (k_key >> (shift + 4)))
                in_bin = (((key >> shift) & 15)[:, None] == bins[None, :]) & match[:, None]
                counts += tl.sum(in_bin.to(tl.int64), axis=0)
            chosen, needed = _digit(counts, needed, bins)
            k_key += chosen << shift
    # Min-p: p(x) >= min_p * p(top)  <=>  x - top >= log(min_p).
    min_p_floor = tl.log(min_p) + top if min_p > 0 else -float("inf")

    # Top-p over the logits the truncations before it kept: the highest key whose logits
    # and those above hold at least p of their mass (the same radix select, weighted by
    # each logit's exp); that logit and every one above it are kept.
    p_key = tl.zeros((), dtype=tl.int64)
    if p < 1.0:
        total = tl.zeros((), dtype=tl.float32)
        for start in range(0, width, BLOCK):
            x, inside = _block(
                source, start, columns, width, temperature, TEMPERATURE_FIRST, BFLOAT16
            )
            inside = _seen_by_top_p(
                x, _ordered_key(x), inside, k_key, min_p_floor, K_BEFORE_P, MIN_P_BEFORE_P
            )
            total += tl.sum(tl.where(inside, tl.exp(x - top), 0.0), axis=0)
        remaining = p * total
        for step in tl.static_range(8):
            shift = 28 - 4 * step
            masses = tl.zeros((16,), dtype=tl.float32)
            for start in range(0, width, BLOCK):
                x, inside = _block(
                    source, start, columns, width, temperature, TEMPERATURE_FIRST, BFLOAT16
                )
                key = _ordered_key(x)
                inside = _seen_by_top_p(
                    x, key, inside, k_key, min_p_floor, K_BEFORE_P, MIN_P_BEFORE_P
                )
                match = inside & ((key >> (shift + 4)) == (p_key >> (shift + 4)))
                weight = tl.where(match, tl.exp(x - top), 0.0)
                in_bin = ((key >> shift) & 15)[:, None] == bins[None, :]
                masses += tl.sum(tl.where(in_bin, weight[:, None], 0.0), axis=0)
            chosen, remaining = _digit(masses, remaining, bins)
            p_key += chosen << shift

    target = out_ptr + row * out_stride
    for start in range(0, width, BLOCK):
        x, inside = _block(source, start, columns, width, temperature, TEMPERATURE_FIRST, BFLOAT16)
        key = _ordered_key(x)
        keep = (key >= k_key) & (key >= p_key) & (x >= min_p_floor)
        value = x if TEMPERATURE_FIRST else x / temperature
        if BFLOAT16:
            value = to_bfloat16_values(value)
        tl.store(target + start + columns, tl.where(keep, value, -float("inf")), mask=inside)
