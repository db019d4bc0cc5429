"""Fused Triton kernels for the accelerator path (CUDA), each beside its torch reference.

A pipeline on a CUDA device runs a run of processors that a kernel covers as one launch
(:mod:`anylogits.core.launch_plan`); everywhere else, and for every processor without a
kernel, the torch processors run as they are: they stay the reference. Kernels are off
unless ``ANYLOGITS_KERNELS=1`` (they are proven on the CPU through Triton's interpreter,
``TRITON_INTERPRET=1``, and turned on by default once a GPU run has measured them);
``ANYLOGITS_KERNELS=0`` turns them off. Triton ships with PyTorch's CUDA wheels; on the
CPU, ``pip install triton`` runs the interpreter.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

import torch

ENVIRONMENT_SWITCH = "ANYLOGITS_KERNELS"


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton runs kernels on CPU tensors (its interpreter, for tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


_forced: list[bool] = []


@contextlib.contextmanager
def kernels_forced(enabled: bool) -> Iterator[None]:
    """Within this block the kernels are on (or off) whatever ``ANYLOGITS_KERNELS`` says
    (a benchmark compares both paths in one run); Triton and the device still decide."""
    _forced.append(enabled)
    try:
        yield
    finally:
        _forced.pop()


def kernels_enabled(device: torch.device) -> bool:
    """Whether logits on ``device`` go through the kernels: ``ANYLOGITS_KERNELS=1`` (or
    :func:`kernels_forced`), Triton installed, and a CUDA device (or the CPU under
    Triton's interpreter)."""
    wanted = _forced[-1] if _forced else os.environ.get(ENVIRONMENT_SWITCH, "0") == "1"
    if not wanted or not triton_installed():
        return False
    return device.type == "cuda" or (device.type == "cpu" and interpreting())
