"""check_processor on each backend: every catalogue processor passes it, and each
processor that breaks the contract fails it with a message naming where it failed."""

from __future__ import annotations

from typing import Any

import pytest

from anylogits import from_spec
from anylogits.testing import check_processor
from test_support.broken import BROKEN
from test_support.catalogue import PROCESSOR_SPECS, VOCABULARY_SPECS, build


@pytest.mark.support("hook")
@pytest.mark.parametrize("name", sorted(PROCESSOR_SPECS))
def test_catalogue_processor_passes(backend: Any, name: str) -> None:
    done = check_processor(build(name), backends=[backend.name])
    assert any(line.startswith(f"{backend.name}: ") for line in done)


@pytest.mark.support("hook")
@pytest.mark.parametrize("name", sorted(VOCABULARY_SPECS))
def test_catalogue_processor_with_a_vocabulary_passes(
    backend: Any, hf_tokenizer: Any, name: str
) -> None:
    processor = from_spec(VOCABULARY_SPECS[name])
    done = check_processor(processor, backends=[backend.name], tokenizer=hf_tokenizer)
    assert any(line.startswith(f"{backend.name}: ") for line in done)


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_processor_fails(backend: Any, kind: str) -> None:
    with pytest.raises(AssertionError) as failure:
        check_processor(BROKEN[kind](), backends=[backend.name])
    message = str(failure.value)
    # Hooks that see one row per call cannot show a processor reading only row 0: the
    # core pipeline's batched rows do.
    where = "the core pipeline" if backend.max_batch == 1 and "rows" in kind else backend.name
    assert f"failed on {where!s}" in message or f"failed on backend {where!r}" in message
    assert "scenario '" in message and ", row " in message and ", column " in message
