"""transformers' own server with ``--continuous-batching`` (``anylogits serve
transformers --model DIR --continuous-batching``): the server suite (``server_suite``) and
the per-request OpenAI fields, which transformers' continuous batching would apply from its
first request to every other."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("transformers")

from conformance_tests.server_suite import *  # noqa: F403  (the suite's tests)
from conformance_tests.transformers_server_cases import *  # noqa: F403  (both paths')

pytestmark = [pytest.mark.slow, pytest.mark.only_backend("transformers_cb")]


@pytest.fixture(scope="module")
def server_backend() -> str:
    return "transformers_cb"
