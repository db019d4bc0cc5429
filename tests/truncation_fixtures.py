"""Checks every processor that only removes tokens must pass, shared by
``test_adaptive_truncation`` and ``test_xtc`` (as tests: :class:`RemovingProcessorChecks`)."""

from __future__ import annotations

import json
import math
from typing import ClassVar

import pytest
import torch

from anylogits import LogitsProcessor, Pipeline, from_spec

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
NEG_INF = -math.inf


def assert_spec_round_trip_rebuilds_an_equal_processor(processor: LogitsProcessor) -> None:
    spec = json.loads(json.dumps(processor.to_spec()))
    rebuilt = from_spec(spec)
    assert type(rebuilt) is type(processor)
    assert rebuilt.config() == processor.config()
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(0)) * 3
    ids = torch.arange(12).reshape(4, 3)
    first = Pipeline([processor])(logits.clone(), ids)
    assert torch.equal(Pipeline([rebuilt])(logits.clone(), ids), first)


def assert_keeps_the_dtype_and_only_removes_tokens(
    processor: LogitsProcessor, dtype: torch.dtype
) -> None:
    logits = (torch.randn(3, 300, generator=torch.Generator().manual_seed(1)) * 2).to(dtype)
    logits[:, :3] = torch.tensor([9.0, 8.5, 8.0])  # XTC has several tokens above 0.1
    out = Pipeline([processor])(logits.clone(), torch.zeros(3, 1, dtype=torch.int64))
    assert out.dtype == dtype and out.shape == logits.shape
    assert bool(((out == logits) | (out == NEG_INF)).all())
    assert bool((out != NEG_INF).any(-1).all())
    if processor.argmax_invariant:
        assert torch.equal(out.argmax(-1), logits.argmax(-1))


class RemovingProcessorChecks:
    """The checks above as tests: a module's ``TestRemovingProcessors(RemovingProcessorChecks)``
    names its ``processors``, and each test is parametrized over them."""

    processors: ClassVar[list[LogitsProcessor]]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        metafunc.parametrize("processor", self.processors, ids=lambda p: type(p).__name__)

    def test_spec_round_trip_rebuilds_an_equal_processor(self, processor: LogitsProcessor) -> None:
        assert_spec_round_trip_rebuilds_an_equal_processor(processor)

    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    def test_processors_keep_the_dtype_and_only_remove_tokens(
        self, processor: LogitsProcessor, dtype: torch.dtype
    ) -> None:
        assert_keeps_the_dtype_and_only_removes_tokens(processor, dtype)
